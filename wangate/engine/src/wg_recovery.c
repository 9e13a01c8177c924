/* Loss detection and RTT for the application packet number space (wg_recovery.h):
 * aioquic's QuicPacketRecovery once the handshake is confirmed and the peer has
 * validated our address (handshake_confirmed and peer_completed_address_validation
 * both true), statement for statement, so that the differential tests
 * (tests/test_engine_recovery.py) can demand equal results.  The controller (wg_cc)
 * and the pacer are called where aioquic calls theirs, in the same order.
 *
 * aioquic keeps sent packets in a dict in sending order; here they are a ring indexed
 * by packet number (consecutive), from first_pn (the oldest not yet acked or lost) to
 * next_pn.  Memory is allocated only when the ring doubles. */
#include "wg_recovery.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* RFC 9002 §6.1.1 (kPacketThreshold), §6.1.2 (kTimeThreshold), §6.1.2 (kGranularity),
 * §7.6.1 (kPersistentCongestionThreshold); aioquic's values */
#define K_PACKET_THRESHOLD 3
#define K_TIME_THRESHOLD (9.0 / 8.0)
#define K_GRANULARITY 0.001
#define K_PERSISTENT_CONGESTION_THRESHOLD 3
/* aioquic floors the latest RTT at 1 ms */
#define RTT_FLOOR_S 0.001

/* Python's min() and max() of two: the first unless the second is strictly beyond */
static double py_min(double a, double b) { return b < a ? b : a; }
static double py_max(double a, double b) { return b > a ? b : a; }

static size_t round_up_pow2(size_t n) {
    size_t p = 1;
    while (p < n && p <= (SIZE_MAX >> 1)) p <<= 1;
    return p;
}

static wg_sent *slot(const wg_recovery *r, uint64_t pn) {
    return &r->ring[pn & (uint64_t)(r->ring_cap - 1)];
}

/* the packets still held: [first_pn, next_pn) */
static uint64_t held(const wg_recovery *r) { return r->next_pn - r->first_pn; }

int wg_recovery_init(wg_recovery *r, size_t ring_cap, size_t max_datagram_size,
                     double initial_rtt_s, double max_ack_delay_s) {
    memset(r, 0, sizeof *r);
    r->ring_max = WG_RECOVERY_RING_MAX;
    if (ring_cap == 0) ring_cap = WG_RECOVERY_RING_INITIAL;
    ring_cap = round_up_pow2(ring_cap);
    if (ring_cap > r->ring_max) ring_cap = r->ring_max;
    r->ring = calloc(ring_cap, sizeof *r->ring);
    if (r->ring == NULL) return -1;
    r->ring_cap = ring_cap;
    r->largest_acked = -1;
    r->loss_time = -1.0;
    r->last_ack_eliciting_sent_at = 0.0;
    r->max_ack_delay_s = max_ack_delay_s;
    r->rtt_initial = initial_rtt_s;
    r->rtt_latest = 0.0;
    r->rtt_min = INFINITY;
    r->rtt_smoothed = 0.0;
    r->rtt_variance = 0.0;
    r->rtt_first_sample_at = 0.0;
    wg_cc_init(&r->cc, max_datagram_size);
    wg_pacer_init(&r->pacer, max_datagram_size);
    return 0;
}

void wg_recovery_free(wg_recovery *r) {
    free(r->ring);
    r->ring = NULL;
    r->ring_cap = 0;
}

/* room for one more packet in the ring, doubling it if needed: 0, or -1 at the bound
 * or when the allocation fails (nothing changed then) */
static int make_room(wg_recovery *r) {
    if (held(r) < r->ring_cap) return 0;
    if (r->ring_cap > r->ring_max / 2) return -1;
    size_t cap = r->ring_cap * 2;
    wg_sent *ring = calloc(cap, sizeof *ring);
    if (ring == NULL) return -1;
    for (uint64_t pn = r->first_pn; pn < r->next_pn; pn++)
        ring[pn & (uint64_t)(cap - 1)] = *slot(r, pn);
    free(r->ring);
    r->ring = ring;
    r->ring_cap = cap;
    return 0;
}

int wg_recovery_can_send(const wg_recovery *r, size_t bytes) {
    if (held(r) >= r->ring_cap && r->ring_cap > r->ring_max / 2) return 0;
    return r->cc.bytes_in_flight + bytes <= r->cc.congestion_window;
}

int64_t wg_recovery_on_sent(wg_recovery *r, size_t bytes, int ack_eliciting, uint64_t token,
                            double now) {
    if (bytes > UINT32_MAX || make_room(r) < 0) return -1;
    uint64_t pn = r->next_pn;
    wg_sent *p = slot(r, pn);
    memset(p, 0, sizeof *p);
    p->sent_at = now;
    p->sent_bytes = (uint32_t)bytes;
    p->state = WG_SENT_IN_FLIGHT;
    p->ack_eliciting = ack_eliciting != 0;
    p->in_flight = ack_eliciting != 0;
    p->token = token;
    r->next_pn = pn + 1;
    if (p->ack_eliciting) r->ack_eliciting_in_flight++;
    if (p->in_flight) {
        /* §6.2.1: the PTO runs from the last ack-eliciting packet sent */
        if (p->ack_eliciting) r->last_ack_eliciting_sent_at = now;
        wg_cc_on_sent(&r->cc, &p->cc, bytes, now);
    }
    return (int64_t)pn;
}

/* the ring's start moves past the packets done with */
static void trim(wg_recovery *r) {
    while (r->first_pn < r->next_pn) {
        wg_sent *p = slot(r, r->first_pn);
        if (p->state == WG_SENT_IN_FLIGHT) break;
        p->state = WG_SENT_NONE;
        r->first_pn++;
    }
}

double wg_recovery_pto_s(const wg_recovery *r) {
    /* §6.2.1: before an RTT sample, twice the initial RTT (aioquic, as §6.2.2 for a
     * client's first flight); after it, srtt + max(4 rttvar, kGranularity), plus
     * max_ack_delay in the application space */
    if (!r->rtt_initialized) return 2 * r->rtt_initial;
    double pto = r->rtt_smoothed + py_max(4 * r->rtt_variance, K_GRANULARITY);
    pto += r->max_ack_delay_s;
    return pto;
}

/* One packet leaves the ring as lost: aioquic's _on_packets_lost, per packet. */
static void declare_lost(wg_recovery *r, uint64_t pn, wg_sent *p, int congestion_event,
                         wg_recovery_report *report) {
    p->state = WG_SENT_LOST;
    if (p->ack_eliciting) r->ack_eliciting_in_flight--;
    if (report != NULL) {
        report->lost_packets++;
        report->lost_bytes += p->sent_bytes;
        if (!congestion_event) report->expired_packets++;
    }
    if (r->on_lost != NULL) r->on_lost(r->on_lost_ctx, pn, p);
    if (p->in_flight) {
        if (congestion_event)
            wg_cc_on_lost_packet(&r->cc, &p->cc, p->sent_bytes);
        else
            wg_cc_on_expired_packet(&r->cc, &p->cc, p->sent_bytes);
    }
}

/* §6.1: aioquic's _detect_loss, with _in_persistent_congestion (§7.6.2) worked out on
 * the way, over the lost packets in packet-number order. */
static void detect_loss(wg_recovery *r, double now, wg_recovery_report *report) {
    /* §6.1.2: 9/8 of max(latest, smoothed), the initial RTT before a sample */
    double loss_delay = K_TIME_THRESHOLD * (r->rtt_initialized
                                                ? py_max(r->rtt_latest, r->rtt_smoothed)
                                                : r->rtt_initial);
    int64_t packet_threshold = r->largest_acked - K_PACKET_THRESHOLD; /* §6.1.1 */
    double time_threshold = now - loss_delay;

    /* §7.6.2: lost ack-eliciting packets sent after the first RTT sample spanning more
     * than 3 PTOs with no packet in between acknowledged; a gap in the lost packet
     * numbers (one acked, or expired by a PTO) starts the period again */
    double duration = wg_recovery_pto_s(r) * K_PERSISTENT_CONGESTION_THRESHOLD;
    int persistent = 0, have_previous = 0, have_start = 0;
    uint64_t previous_pn = 0;
    double start_time = 0.0;
    int lost_in_flight = 0;

    r->loss_time = -1.0;
    if (r->largest_acked < 0) return;
    uint64_t last = (uint64_t)r->largest_acked;
    if (last >= r->next_pn) last = r->next_pn - 1; /* on_ack refuses more; kept safe */
    for (uint64_t pn = r->first_pn; pn <= last && pn < r->next_pn; pn++) {
        wg_sent *p = slot(r, pn);
        if (p->state != WG_SENT_IN_FLIGHT) continue;
        if ((int64_t)pn <= packet_threshold || p->sent_at <= time_threshold) {
            if (r->rtt_initialized && !persistent) {
                if (have_previous && pn != previous_pn + 1) have_start = 0;
                if (p->ack_eliciting && p->sent_at > r->rtt_first_sample_at) {
                    if (!have_start) {
                        start_time = p->sent_at;
                        have_start = 1;
                    } else if (p->sent_at - start_time > duration) {
                        persistent = 1;
                    }
                }
            }
            have_previous = 1;
            previous_pn = pn;
            if (p->in_flight) lost_in_flight = 1;
            declare_lost(r, pn, p, 1, report);
        } else {
            /* §6.1.2: not yet lost, the loss timer fires when it would be */
            double packet_loss_time = p->sent_at + loss_delay;
            if (r->loss_time < 0 || r->loss_time > packet_loss_time)
                r->loss_time = packet_loss_time;
        }
    }
    trim(r);
    /* aioquic calls on_packets_lost only with packets in flight */
    if (lost_in_flight) {
        wg_cc_on_lost_end(&r->cc, now);
        if (persistent) wg_cc_on_persistent_congestion(&r->cc); /* §7.6.2 */
        wg_pacer_update_rate(&r->pacer, &r->cc, r->cc.congestion_window, r->rtt_smoothed);
    }
}

static int valid_ack(const wg_recovery *r, const wg_ack *ack) {
    if (ack->count == 0 || ack->count > WG_MAX_ACK_RANGES) return 0;
    for (size_t i = 0; i < ack->count; i++) {
        if (ack->ranges[i].smallest > ack->ranges[i].largest) return 0;
        if (i > 0 && ack->ranges[i].largest >= ack->ranges[i - 1].smallest) return 0;
    }
    /* RFC 9000 §13.1: acknowledging a packet never sent is a protocol violation */
    return ack->ranges[0].largest < r->next_pn;
}

int wg_recovery_on_ack(wg_recovery *r, const wg_ack *ack, double ack_delay_s, double now,
                       wg_recovery_report *report) {
    if (report != NULL) memset(report, 0, sizeof *report);
    if (!valid_ack(r, ack)) return -1;

    uint64_t largest_acked = ack->ranges[0].largest;
    if ((int64_t)largest_acked > r->largest_acked) r->largest_acked = (int64_t)largest_acked;

    int is_ack_eliciting = 0, newly_acked = 0;
    uint64_t largest_newly_acked = 0;
    double largest_sent_time = 0.0;
    /* aioquic visits the ranges lowest first, each upwards; only packets still held
     * can be newly acked, so each range is clipped to the ring */
    for (size_t k = ack->count; k-- > 0;) {
        const wg_ack_range *range = &ack->ranges[k];
        if (range->largest < r->first_pn) continue;
        uint64_t lo = range->smallest > r->first_pn ? range->smallest : r->first_pn;
        for (uint64_t pn = lo; pn <= range->largest; pn++) {
            wg_sent *p = slot(r, pn);
            if (p->state != WG_SENT_IN_FLIGHT) continue;
            p->state = WG_SENT_ACKED;
            if (p->ack_eliciting) {
                is_ack_eliciting = 1;
                r->ack_eliciting_in_flight--;
            }
            if (p->in_flight) wg_cc_on_acked(&r->cc, &p->cc, p->sent_bytes, now);
            newly_acked = 1;
            largest_newly_acked = pn;
            largest_sent_time = p->sent_at;
            if (report != NULL) {
                report->acked_packets++;
                report->acked_bytes += p->sent_bytes;
            }
            if (r->on_acked != NULL) r->on_acked(r->on_acked_ctx, pn, p);
        }
    }
    trim(r);
    if (!newly_acked) return 0; /* nothing to do if no packet was newly acked */

    /* §5.1: a sample when the largest acknowledged is newly acked; aioquic asks that
     * any of the newly acked packets be ack-eliciting (§5.1 says the largest) */
    if (largest_acked == largest_newly_acked && is_ack_eliciting) {
        double latest_rtt = now - largest_sent_time;
        /* §5.3: the ack delay counts up to the peer's max_ack_delay */
        ack_delay_s = py_min(ack_delay_s, r->max_ack_delay_s);
        r->rtt_latest = py_max(latest_rtt, RTT_FLOOR_S);
        if (r->rtt_latest < r->rtt_min) r->rtt_min = r->rtt_latest; /* §5.2 */
        /* §5.3: the ack delay is taken off unless that goes below min_rtt */
        if (r->rtt_latest > r->rtt_min + ack_delay_s) r->rtt_latest -= ack_delay_s;
        if (!r->rtt_initialized) {
            /* §5.3 first sample (aioquic: the unadjusted sample) */
            r->rtt_first_sample_at = now;
            r->rtt_initialized = 1;
            r->rtt_variance = latest_rtt / 2;
            r->rtt_smoothed = latest_rtt;
        } else {
            r->rtt_variance =
                3.0 / 4.0 * r->rtt_variance + 1.0 / 4.0 * fabs(r->rtt_min - r->rtt_latest);
            r->rtt_smoothed = 7.0 / 8.0 * r->rtt_smoothed + 1.0 / 8.0 * r->rtt_latest;
        }
        if (report != NULL) report->rtt_sampled = 1;
        wg_cc_on_rtt(&r->cc, latest_rtt, now);
        wg_pacer_update_rate(&r->pacer, &r->cc, r->cc.congestion_window, r->rtt_smoothed);
    }

    detect_loss(r, now, report);
    /* §6.2.1: an acknowledgment resets the backoff (the peer validated our address) */
    r->pto_count = 0;
    return 0;
}

double wg_recovery_timer(const wg_recovery *r) {
    /* §6.2.1 / appendix A.8: the loss timer first, else the PTO when ack-eliciting
     * packets are in flight, backed off by 2^pto_count */
    if (r->loss_time >= 0) return r->loss_time;
    if (r->ack_eliciting_in_flight) {
        double timeout = ldexp(wg_recovery_pto_s(r), r->pto_count);
        return r->last_ack_eliciting_sent_at + timeout;
    }
    return -1.0;
}

int wg_recovery_on_timer(wg_recovery *r, double now, wg_recovery_report *report) {
    if (report != NULL) memset(report, 0, sizeof *report);
    if (r->loss_time >= 0) {
        detect_loss(r, now, report); /* §6.1.2: the loss timer */
        return 0;
    }
    /* §6.2: a PTO.  aioquic's reschedule_data gives up on the oldest ack-eliciting
     * packet (its DATAGRAM frames are not resent; it is reported lost, the controller
     * only takes it out of flight: not a congestion event) and asks for a probe. */
    r->pto_count++;
    for (uint64_t pn = r->first_pn; pn < r->next_pn; pn++) {
        wg_sent *p = slot(r, pn);
        if (p->state == WG_SENT_IN_FLIGHT && p->ack_eliciting) {
            declare_lost(r, pn, p, 0, report);
            break;
        }
    }
    trim(r);
    return WG_PTO_PROBES;
}
