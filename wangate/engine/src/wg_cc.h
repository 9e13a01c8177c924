/* Congestion control and pacing of a data-plane channel: a C port of
 * wangate/net/congestion.py (WangateCongestionControl, BBR v1 with BBR v2's loss
 * response) and wangate/net/pacing.py (BurstablePacer over aioquic's QuicPacketPacer).
 *
 * The functions take the arguments the Python methods take, and are called in the
 * order aioquic's QuicPacketRecovery calls those methods; the Python classes are the
 * reference model of the differential tests (same calls, same windows and rates).
 * Time is seconds as a double, passed in.  Nothing here allocates.
 */
#ifndef WG_CC_H
#define WG_CC_H

#include <stddef.h>
#include <stdint.h>

/* what the controller remembers of one sent packet (Python's _Sent), kept by the
 * caller beside the packet until it is acked, lost or expired */
typedef struct wg_cc_packet {
    uint64_t delivered;
    double delivered_at;
    double first_sent_at;
    double sent_at;
    uint8_t app_limited;
    uint8_t cruising;
    uint8_t probing;
    uint8_t tracked; /* 0: the controller knew nothing of it (Python: not in _sent) */
} wg_cc_packet;

enum { WG_CC_STARTUP = 0, WG_CC_DRAIN = 1, WG_CC_PROBE_BW = 2, WG_CC_PROBE_RTT = 3 };

/* Bound on the max-filter's (round, rate) samples.  Of the samples of one round only
 * the first ever reaches the front of the Python's monotonic deque (the later ones
 * are smaller, and leave with it), so keeping one per round gives the same maximum;
 * the window spans BW_WINDOW_ROUNDS rounds, plus the one just appended. */
#define WG_CC_BW_SAMPLES 11

typedef struct wg_cc {
    /* every field of WangateCongestionControl, same names without the underscore */
    size_t max_datagram_size;
    uint64_t congestion_window, initial_window, min_window, min_target_window;
    uint64_t bytes_in_flight;
    uint64_t ssthresh_unused;
    int state;
    uint64_t delivered_bytes;
    double delivered_at, first_sent_at;
    uint64_t app_limited_until;
    size_t bw_count; /* samples bw_round/bw_rate[0 .. bw_count), the oldest first */
    int64_t bw_round[WG_CC_BW_SAMPLES];
    double bw_rate[WG_CC_BW_SAMPLES];
    double btl_bw_bps;
    double min_rtt_s; /* < 0: none yet */
    double min_rtt_at;
    double srtt_s;    /* < 0: none yet */
    int64_t round_count;
    uint64_t next_round_delivered;
    double round_min_rtt_s, last_round_min_rtt_s;
    uint64_t round_lost_packets, round_lost_bytes, round_acked_bytes, round_acked_packets;
    uint64_t round_cruise_bytes, round_cruise_lost_bytes;
    double loss_baseline, random_loss;
    uint64_t congestion_events;
    double recovery_start;
    double full_bw_bps;
    int full_bw_count;
    int64_t full_bw_checked_round;
    int filled_pipe;
    int phase;
    double phase_start;
    double probe_rtt_done_at; /* -INFINITY: none (Python's None) */
    int64_t probe_rtt_round;
    uint64_t prior_cwnd;
} wg_cc;

void wg_cc_init(wg_cc *cc, size_t max_datagram_size);
/* `sent_bytes` of a packet sent at `now`; fills *packet */
void wg_cc_on_sent(wg_cc *cc, wg_cc_packet *packet, size_t sent_bytes, double now);
void wg_cc_on_acked(wg_cc *cc, const wg_cc_packet *packet, size_t sent_bytes, double now);
/* one call for the batch aioquic passes to on_packets_lost */
void wg_cc_on_lost(wg_cc *cc, const wg_cc_packet *packets, const size_t *sent_bytes,
                   size_t count, double now);
/* the same batch without arrays: wg_cc_on_lost_packet for each, then wg_cc_on_lost_end */
void wg_cc_on_lost_packet(wg_cc *cc, const wg_cc_packet *packet, size_t sent_bytes);
void wg_cc_on_lost_end(wg_cc *cc, double now);
void wg_cc_on_expired(wg_cc *cc, const wg_cc_packet *packets, const size_t *sent_bytes,
                      size_t count);
void wg_cc_on_expired_packet(wg_cc *cc, const wg_cc_packet *packet, size_t sent_bytes);
void wg_cc_on_rtt(wg_cc *cc, double rtt_s, double now);
void wg_cc_on_persistent_congestion(wg_cc *cc);
/* bytes per second, or < 0 where Python returns None */
double wg_cc_pacing_rate(const wg_cc *cc, double smoothed_rtt_s);
double wg_cc_sending_rate_bps(const wg_cc *cc);
double wg_cc_pacing_gain(const wg_cc *cc);
/* the Python's state strings: "startup", "drain", "probe_bw", "probe_rtt" */
const char *wg_cc_state_name(int state);

/* aioquic's QuicPacketPacer with wangate's BurstablePacer on top */
typedef struct wg_pacer {
    size_t max_datagram_size;
    double bucket_max, bucket_time, evaluation_time;
    double packet_time; /* < 0: none yet (aioquic's None: no pacing before a rate) */
    double pacing_rate_bytes;
    int burst; /* set by the channel while critical data waits */
} wg_pacer;

void wg_pacer_init(wg_pacer *pacer, size_t max_datagram_size);
/* < 0 where Python returns None: a packet may go now */
double wg_pacer_next_send_time(wg_pacer *pacer, double now);
void wg_pacer_update_after_send(wg_pacer *pacer, double now);
/* BurstablePacer.update_rate, with the controller as its rate source (NULL: none,
 * paced as aioquic does at congestion_window / smoothed_rtt) */
void wg_pacer_update_rate(wg_pacer *pacer, const wg_cc *cc, uint64_t congestion_window,
                          double smoothed_rtt_s);

#endif
