/* What a channel has received: duplicate and replay detection, and the ACK frames it
 * owes (RFC 9000 §13.2).
 *
 * A packet number is new if it is above the largest seen, or within the last
 * WG_REPLAY_WINDOW below it and not yet seen; anything older is dropped as a possible
 * replay.  Check with wg_received_is_new() before opening the packet (cheap: forged
 * and replayed packets cost a header check), record with wg_received_add() only after
 * the AEAD verified it (a forged packet number moves nothing).
 */
#ifndef WG_RECEIVED_H
#define WG_RECEIVED_H

#include <stddef.h>
#include <stdint.h>

#include "wg_frames.h"

#define WG_REPLAY_WINDOW 4096 /* packet numbers; a multiple of 64 */
#define WG_ACK_ELICITING_THRESHOLD 2 /* RFC 9000 §13.2.2: ack every second packet */

typedef struct wg_received {
    int64_t largest;   /* -1: none yet */
    double largest_at; /* when the largest arrived: the ack delay counts from it */
    uint64_t seen[WG_REPLAY_WINDOW / 64]; /* bit (pn % WINDOW): seen, for pn in window */
    wg_ack_range ranges[WG_MAX_ACK_RANGES]; /* what the next ACK says, highest first */
    size_t range_count;
    size_t unacked_eliciting; /* ack-eliciting packets since the last ACK sent */
    double ack_at;            /* when an ACK is due; < 0: none */
    uint64_t duplicates, too_old; /* counters */
} wg_received;

void wg_received_init(wg_received *r);
/* 1 if `pn` may be opened (new and within the window), 0 if not */
int wg_received_is_new(const wg_received *r, uint64_t pn);
/* A verified packet.  An ACK is due at once after WG_ACK_ELICITING_THRESHOLD
 * ack-eliciting packets, else `max_ack_delay_s` after the first.  Returns 1 if it was
 * recorded, 0 if it was not new (counted in `duplicates` or `too_old`; header change:
 * the return value was void). */
int wg_received_add(wg_received *r, uint64_t pn, int ack_eliciting, double now,
                    double max_ack_delay_s);
/* 1 and the frame's content in *ack (ack_delay encoded with `ack_delay_exponent`,
 * at most 20 (RFC 9000 §18.2), larger values taken as 20) if there is anything to
 * acknowledge; 0 if nothing was received, or all of it was forgotten */
int wg_received_ack(const wg_received *r, wg_ack *ack, double now, unsigned ack_delay_exponent);
/* 1 if an ACK is due at `now` (threshold reached or ack_at passed) */
int wg_received_ack_due(const wg_received *r, double now);
/* An ACK went out: nothing is owed until the next ack-eliciting packet. */
void wg_received_ack_sent(wg_received *r);
/* An ACK frame acknowledging packets up to `pn` was itself acknowledged: stop sending
 * ranges at or below `pn` (RFC 9000 §13.2.4; aioquic's _on_ack_delivery).  The replay
 * window is unchanged.  (Added to the header.) */
void wg_received_forget(wg_received *r, uint64_t pn);

#endif
