/* Loss detection and RTT of a data-plane channel: RFC 9002 as aioquic's
 * QuicPacketRecovery does it for the application space (a C port of the parts a
 * channel uses), driving wg_cc and wg_pacer in the same order.  Packets carry
 * DATAGRAM frames, which are never retransmitted: a lost packet is reported, not
 * resent; a probe timeout (§6.2) asks the channel for PING probes.
 *
 * Sent packets live in a ring indexed by packet number: packet numbers are
 * consecutive, so finding one is an index, and nothing is allocated per packet.
 */
#ifndef WG_RECOVERY_H
#define WG_RECOVERY_H

#include <stddef.h>
#include <stdint.h>

#include "wg_cc.h"
#include "wg_frames.h"

typedef struct wg_sent {
    double sent_at;
    uint32_t sent_bytes;
    uint8_t state; /* WG_SENT_* */
    uint8_t ack_eliciting;
    uint8_t in_flight;
    uint64_t token; /* the channel's own: what the packet carried */
    wg_cc_packet cc;
} wg_sent;

/* IN_FLIGHT: awaiting an ack or a loss (aioquic's sent_packets), whatever `in_flight`
 * says; ACKED and LOST: done with, until the ring's start moves past it */
enum { WG_SENT_NONE = 0, WG_SENT_IN_FLIGHT = 1, WG_SENT_ACKED = 2, WG_SENT_LOST = 3 };

/* Header additions: */
/* the ring's capacity when wg_recovery_init is given 0, and its bound (r->ring_max,
 * which a caller may lower after init to a power of two not below ring_cap) */
#define WG_RECOVERY_RING_INITIAL 256
#define WG_RECOVERY_RING_MAX ((size_t)1 << 17)
/* PING probes per PTO: aioquic's send_probe() asks for one ack-eliciting packet
 * (a single PING; RFC 9002 §6.2.4 allows up to two) */
#define WG_PTO_PROBES 1

/* what an ack or a timeout decided, for the channel's counters and events */
typedef struct wg_recovery_report {
    size_t acked_packets, lost_packets;
    uint64_t acked_bytes, lost_bytes;
    int rtt_sampled;
    /* header addition: of lost_packets, those a PTO gave up on (aioquic's
     * reschedule_data: reported lost, but no congestion event) */
    size_t expired_packets;
} wg_recovery_report;

/* Called for each packet declared lost (or acked), in packet-number order, before the
 * controller hears of the batch, as aioquic calls delivery handlers; a callback must
 * not call wg_recovery functions (it may queue events). */
typedef void (*wg_lost_fn)(void *ctx, uint64_t pn, const wg_sent *packet);
typedef void (*wg_acked_fn)(void *ctx, uint64_t pn, const wg_sent *packet); /* added */

typedef struct wg_recovery {
    wg_sent *ring;
    size_t ring_cap;      /* a power of two */
    size_t ring_max;      /* added: the ring grows by doubling up to this */
    uint64_t first_pn;    /* oldest packet number still in the ring */
    uint64_t next_pn;     /* the next to be sent */
    int64_t largest_acked; /* -1: none */
    double loss_time;     /* < 0: none */
    double last_ack_eliciting_sent_at;
    uint64_t ack_eliciting_in_flight;
    int pto_count;
    double max_ack_delay_s;
    /* RTT (RFC 9002 §5), seconds; floored at 1 ms as aioquic does */
    int rtt_initialized;
    double rtt_latest, rtt_min, rtt_smoothed, rtt_variance, rtt_initial;
    double rtt_first_sample_at; /* added: persistent congestion (§7.6.2) counts from it */
    wg_cc cc;
    wg_pacer pacer;
    wg_lost_fn on_lost; /* may be NULL */
    void *on_lost_ctx;
    wg_acked_fn on_acked; /* added; may be NULL */
    void *on_acked_ctx;
} wg_recovery;

/* 0, or -1 when the ring cannot be allocated.  ring_cap is rounded up to a power of
 * two (0: WG_RECOVERY_RING_INITIAL). */
int wg_recovery_init(wg_recovery *r, size_t ring_cap, size_t max_datagram_size,
                     double initial_rtt_s, double max_ack_delay_s);
void wg_recovery_free(wg_recovery *r);

/* room for another packet of `bytes`: window (bytes_in_flight + bytes <= cwnd) and ring */
int wg_recovery_can_send(const wg_recovery *r, size_t bytes);
/* record packet number r->next_pn (returned) as sent now; -1 if the ring is full and
 * cannot grow.  An ack-eliciting packet is in flight, an ACK-only one is not (aioquic's
 * in_flight for packets without PADDING). */
int64_t wg_recovery_on_sent(wg_recovery *r, size_t bytes, int ack_eliciting, uint64_t token,
                            double now);
/* An ACK frame arrived.  ack_delay_s is already decoded.  Returns 0, or -1 when it
 * acknowledges a packet number never sent (a protocol violation: RFC 9000 §13.1), or
 * its ranges are not highest first and apart (as wg_frames_parse makes them), or it has
 * none; nothing changed then. */
int wg_recovery_on_ack(wg_recovery *r, const wg_ack *ack, double ack_delay_s, double now,
                       wg_recovery_report *report);
/* the loss-detection timer (§6.2.1's GetLossTimeAndSpace / PTO), or < 0 for none */
double wg_recovery_timer(const wg_recovery *r);
/* the timer fired: returns the number of PING probes to send now (0 if it was a loss
 * timer that declared packets lost instead) */
int wg_recovery_on_timer(wg_recovery *r, double now, wg_recovery_report *report);
double wg_recovery_pto_s(const wg_recovery *r);

#endif
