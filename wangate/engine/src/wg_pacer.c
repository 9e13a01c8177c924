/* aioquic's QuicPacketPacer with wangate's BurstablePacer (wangate/net/pacing.py) on
 * top, in C: paced at the controller's rate when it has one (BBR keeps rate and window
 * apart), otherwise at cwnd / srtt as aioquic; a bucket of sending time makes up for
 * late wake-ups; `burst` turns pacing off while critical data waits.  Same statements
 * and floating-point order as the Python, for the differential tests. */
#include "wg_cc.h"

#define K_MICRO_SECOND 0.000001 /* aioquic's recovery.py */
#define K_SECOND 1.0
#define BUCKET_DATAGRAMS 16 /* aioquic's bucket (CPU: datagrams per wake-up on fast short paths) */
#define BUCKET_SHORT_S 0.004 /* ... but no more than this much of a slow path's rate */
#define BUCKET_MIN_DATAGRAMS 2 /* aioquic's floor */
#define BUCKET_RTT_FRACTION 0.25 /* catch-up after a late wake-up: up to a quarter of the RTT... */
#define BUCKET_MAX_S 0.010 /* ...and at most this */

/* Python's min() and max() of two: the first unless the second is strictly beyond */
static double py_min(double a, double b) { return b < a ? b : a; }
static double py_max(double a, double b) { return b > a ? b : a; }

void wg_pacer_init(wg_pacer *pacer, size_t max_datagram_size) {
    *pacer = (wg_pacer){0};
    pacer->max_datagram_size = max_datagram_size;
    pacer->packet_time = -1.0;
}

static void update_bucket(wg_pacer *pacer, double now) {
    if (now > pacer->evaluation_time) {
        pacer->bucket_time =
            py_min(pacer->bucket_time + (now - pacer->evaluation_time), pacer->bucket_max);
        pacer->evaluation_time = now;
    }
}

double wg_pacer_next_send_time(wg_pacer *pacer, double now) {
    if (pacer->burst) return -1.0;
    if (pacer->packet_time >= 0.0) {
        update_bucket(pacer, now);
        if (pacer->bucket_time <= 0) return now + pacer->packet_time;
    }
    return -1.0;
}

void wg_pacer_update_after_send(wg_pacer *pacer, double now) {
    if (pacer->burst) return;
    if (pacer->packet_time >= 0.0) {
        update_bucket(pacer, now);
        if (pacer->bucket_time < pacer->packet_time)
            pacer->bucket_time = 0.0;
        else
            pacer->bucket_time -= pacer->packet_time;
    }
}

/* aioquic's QuicPacketPacer.update_rate: cwnd / srtt */
static void update_rate_aioquic(wg_pacer *pacer, uint64_t congestion_window,
                                double smoothed_rtt) {
    double size = (double)pacer->max_datagram_size;
    double pacing_rate = (double)congestion_window / py_max(smoothed_rtt, K_MICRO_SECOND);
    pacer->packet_time = py_max(K_MICRO_SECOND, py_min(size / pacing_rate, K_SECOND));
    uint64_t quarter = congestion_window / 4, cap = 16 * (uint64_t)pacer->max_datagram_size;
    uint64_t floor = 2 * (uint64_t)pacer->max_datagram_size;
    uint64_t bucket = quarter < cap ? quarter : cap;
    pacer->bucket_max = (double)(bucket > floor ? bucket : floor) / pacing_rate;
    if (pacer->bucket_time > pacer->bucket_max) pacer->bucket_time = pacer->bucket_max;
}

void wg_pacer_update_rate(wg_pacer *pacer, const wg_cc *cc, uint64_t congestion_window,
                          double smoothed_rtt_s) {
    double rate = cc == NULL ? -1.0 : wg_cc_pacing_rate(cc, smoothed_rtt_s);
    if (rate < 0.0) {
        update_rate_aioquic(pacer, congestion_window, smoothed_rtt_s);
        pacer->pacing_rate_bytes =
            (double)congestion_window / py_max(smoothed_rtt_s, K_MICRO_SECOND);
        return;
    }
    double size = (double)pacer->max_datagram_size;
    rate = py_max(rate, size / K_SECOND);
    pacer->pacing_rate_bytes = rate;
    pacer->packet_time = py_max(K_MICRO_SECOND, py_min(size / rate, K_SECOND));
    double catch_up_s = py_min(BUCKET_RTT_FRACTION * smoothed_rtt_s, BUCKET_MAX_S);
    double short_bytes = py_min(BUCKET_DATAGRAMS * size, BUCKET_SHORT_S * rate);
    double bucket_bytes = py_min((double)(congestion_window / 4),
                                 py_max(catch_up_s * rate, short_bytes));
    pacer->bucket_max = py_max(BUCKET_MIN_DATAGRAMS * size, bucket_bytes) / rate;
    if (pacer->bucket_time > pacer->bucket_max) pacer->bucket_time = pacer->bucket_max;
}
