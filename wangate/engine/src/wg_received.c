/* What a channel has received (wg_received.h): the replay window and the ACK frame
 * owed, RFC 9000 §13.2.  Nothing here allocates; every array index is bounded by the
 * window or WG_MAX_ACK_RANGES. */
#include "wg_received.h"

#include <string.h>

#define WORDS (WG_REPLAY_WINDOW / 64)

_Static_assert(WG_REPLAY_WINDOW % 64 == 0, "the window is whole 64-bit words");
_Static_assert(WG_MAX_ACK_RANGES >= 1, "an ACK frame holds at least one range");

/* RFC 9000 §18.2: values of ack_delay_exponent above 20 are invalid */
#define MAX_ACK_DELAY_EXPONENT 20

void wg_received_init(wg_received *r) {
    memset(r, 0, sizeof *r);
    r->largest = -1;
    r->largest_at = 0.0;
    r->ack_at = -1.0;
}

static int seen_bit(const wg_received *r, uint64_t pn) {
    uint64_t slot = pn % WG_REPLAY_WINDOW;
    return (int)((r->seen[slot / 64] >> (slot % 64)) & 1u);
}

static void set_bit(wg_received *r, uint64_t pn) {
    uint64_t slot = pn % WG_REPLAY_WINDOW;
    r->seen[slot / 64] |= (uint64_t)1 << (slot % 64);
}

static void clear_bit(wg_received *r, uint64_t pn) {
    uint64_t slot = pn % WG_REPLAY_WINDOW;
    r->seen[slot / 64] &= ~((uint64_t)1 << (slot % 64));
}

/* 0: new, 1: a duplicate, 2: below the window */
static int classify(const wg_received *r, uint64_t pn) {
    if (r->largest < 0 || pn > (uint64_t)r->largest) return 0;
    /* the window is [largest - WINDOW + 1, largest]: older packets may be replays
     * whose bit was reused, so they are refused whatever their bit says */
    if ((uint64_t)r->largest - pn >= WG_REPLAY_WINDOW) return 2;
    return seen_bit(r, pn) ? 1 : 0;
}

int wg_received_is_new(const wg_received *r, uint64_t pn) { return classify(r, pn) == 0; }

/* The window slides up to `pn`: the slots of (largest, pn] held packet numbers
 * WINDOW below, which leave the window now, so they are cleared. */
static void slide(wg_received *r, uint64_t pn) {
    if (r->largest < 0 || pn - (uint64_t)r->largest >= WG_REPLAY_WINDOW) {
        memset(r->seen, 0, sizeof r->seen);
        return;
    }
    for (uint64_t q = (uint64_t)r->largest + 1; q <= pn; q++) clear_bit(r, q);
}

/* Insert range {pn, pn} at index i (0..count), shifting the lower ones down; when
 * all WG_MAX_ACK_RANGES are in use the lowest falls off (RFC 9000 §13.2.3: a receiver
 * limits the ranges it sends, oldest first). */
static void insert_range(wg_received *r, size_t i, uint64_t pn) {
    size_t count = r->range_count;
    if (i >= WG_MAX_ACK_RANGES) return; /* it would be the lowest of too many: dropped */
    if (count == WG_MAX_ACK_RANGES) count--; /* the lowest falls off */
    memmove(&r->ranges[i + 1], &r->ranges[i], (count - i) * sizeof r->ranges[0]);
    r->ranges[i].smallest = pn;
    r->ranges[i].largest = pn;
    r->range_count = count + 1;
}

/* Ranges are kept highest first and never adjacent: ranges[i].smallest >
 * ranges[i + 1].largest + 1. */
static void add_range(wg_received *r, uint64_t pn) {
    for (size_t i = 0; i < r->range_count; i++) {
        wg_ack_range *range = &r->ranges[i];
        if (pn > range->largest + 1) {
            insert_range(r, i, pn);
            return;
        }
        if (pn == range->largest + 1) {
            /* the range above starts above pn + 1, as the previous turn showed */
            range->largest = pn;
            return;
        }
        if (pn >= range->smallest) return; /* already in it */
        if (pn + 1 == range->smallest) {
            range->smallest = pn;
            if (i + 1 < r->range_count && r->ranges[i + 1].largest + 1 == pn) {
                range->smallest = r->ranges[i + 1].smallest;
                memmove(&r->ranges[i + 1], &r->ranges[i + 2],
                        (r->range_count - i - 2) * sizeof r->ranges[0]);
                r->range_count--;
            }
            return;
        }
    }
    insert_range(r, r->range_count, pn);
}

int wg_received_add(wg_received *r, uint64_t pn, int ack_eliciting, double now,
                    double max_ack_delay_s) {
    switch (classify(r, pn)) {
    case 1:
        r->duplicates++;
        return 0;
    case 2:
        r->too_old++;
        return 0;
    default:
        break;
    }
    if (r->largest < 0 || pn > (uint64_t)r->largest) {
        slide(r, pn);
        r->largest = (int64_t)pn;
        /* RFC 9000 §19.3: the ack delay runs from the largest's arrival */
        r->largest_at = now;
    }
    set_bit(r, pn);
    add_range(r, pn);
    if (ack_eliciting) {
        r->unacked_eliciting++;
        if (r->unacked_eliciting >= WG_ACK_ELICITING_THRESHOLD) {
            r->ack_at = now; /* RFC 9000 §13.2.2: at least every second one at once */
        } else if (r->ack_at < 0) {
            r->ack_at = now + max_ack_delay_s; /* §13.2.1: within max_ack_delay */
        }
    }
    return 1;
}

int wg_received_ack(const wg_received *r, wg_ack *ack, double now, unsigned ack_delay_exponent) {
    if (r->range_count == 0) return 0;
    if (ack_delay_exponent > MAX_ACK_DELAY_EXPONENT) ack_delay_exponent = MAX_ACK_DELAY_EXPONENT;
    double delay = now - r->largest_at;
    if (!(delay > 0.0)) delay = 0.0; /* a clock read before the arrival, or NaN */
    double us = delay * 1000000.0;
    /* truncated toward zero as the peer's decoder expects; a delay beyond the varint
     * range (hours) saturates */
    uint64_t encoded = us >= 4.0e18 ? (uint64_t)4e18 : (uint64_t)us;
    ack->ack_delay = encoded >> ack_delay_exponent;
    ack->count = r->range_count;
    memcpy(ack->ranges, r->ranges, r->range_count * sizeof r->ranges[0]);
    return 1;
}

int wg_received_ack_due(const wg_received *r, double now) {
    if (r->unacked_eliciting >= WG_ACK_ELICITING_THRESHOLD) return 1;
    return r->ack_at >= 0 && now >= r->ack_at;
}

void wg_received_ack_sent(wg_received *r) {
    r->unacked_eliciting = 0;
    r->ack_at = -1.0;
}

void wg_received_forget(wg_received *r, uint64_t pn) {
    /* RFC 9000 §13.2.4: once an ACK frame is acknowledged, the ranges it covered need
     * not be sent again.  Ranges are highest first, so the ones to go are at the end. */
    size_t keep = r->range_count;
    while (keep > 0 && r->ranges[keep - 1].largest <= pn) keep--;
    r->range_count = keep;
    if (keep > 0 && r->ranges[keep - 1].smallest <= pn) r->ranges[keep - 1].smallest = pn + 1;
}
