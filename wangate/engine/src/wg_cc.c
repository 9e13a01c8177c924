/* WangateCongestionControl (wangate/net/congestion.py) in C: BBR v1
 * (draft-cheng-iccrg-bbr-congestion-control-00, with the delivery-rate estimator of
 * draft-cheng-iccrg-delivery-rate-estimation-00) with BBR v2's multiplicative cut on
 * loss and gentler ProbeRTT.  The Python module's notes explain the model; this is
 * the same code, statement for statement, in the same floating-point order, so the
 * differential tests (tests/test_engine_cc.py) can demand equal results. */
#include <math.h>

#include "wg_cc.h"

#define STARTUP_GAIN (2.0 / log(2.0)) /* BBR: the smallest gain that doubles each round */
static const double PROBE_BW_GAINS[] = {1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
#define PROBE_BW_PHASES ((int)(sizeof PROBE_BW_GAINS / sizeof PROBE_BW_GAINS[0]))
#define PROBE_BW_START_PHASE 2 /* start cruising; BBR picks at random, we stay deterministic */
#define BW_WINDOW_ROUNDS 10
#define MIN_RTT_WINDOW_S 10.0
#define PROBE_RTT_DURATION_S 0.2
#define PROBE_RTT_CWND_GAIN 0.5 /* BBR v2: half a BDP, not 4 packets */
#define FULL_BW_GROWTH 1.25
#define FULL_BW_ROUNDS 3
/* ProbeBW's window caps what is in flight over what the pacer sends (BBR's is 2 BDP):
 * room for late or clumped acks and the 1.25 probe, not more, as unpaced bursts of
 * critical data queue behind whatever exceeds the BDP */
#define CWND_GAIN 1.25
#define MIN_CWND_PACKETS 4 /* after persistent congestion (RFC 9002 §7.6.2 uses 2) */
/* the model's window floor: aioquic-style pacing sends bursts of cwnd / 4, and a small
 * window costs CPU per byte on fast paths (WAN BDPs are larger anyway) */
#define MIN_TARGET_PACKETS 64
#define INITIAL_WINDOW_PACKETS MIN_TARGET_PACKETS
#define RTT_ALLOWANCE_FRACTION 0.10 /* queueing tolerated before the rate starts to fall... */
#define RTT_ALLOWANCE_MIN_S 0.005   /* ...but at least this (timers, ack delay, busy hosts) */
#define MIN_RTT_FLOOR_S 0.001       /* aioquic floors RTTs at 1 ms as well */
#define HIGH_LOSS_RATE 0.15
#define QUEUE_LOSS_RATE 0.02
#define QUEUE_RTT_FACTOR 1.25
#define LOSS_MIN_PACKETS 3
#define STARTUP_LOSS_MIN_PACKETS 8 /* 2 % random loss needs a 400-packet round to reach this */
#define STARTUP_LOSS_MIN_ROUNDS 2  /* rounds paced from a measured bandwidth before loss ends Startup */
#define LOSS_BETA 0.7
#define LOSS_BASELINE_WEIGHT 0.125 /* per round not judged congestion */
#define LOSS_NOISE_SIGMAS 3.0
#define APP_LIMITED_FRACTION 0.5 /* sending with less than this much of cwnd in flight */
#define SRTT_WEIGHT 0.125        /* RFC 9002 §5.3 */

/* Python's min() and max() of two: the first unless the second is strictly beyond */
static double py_min(double a, double b) { return b < a ? b : a; }
static double py_max(double a, double b) { return b > a ? b : a; }
static uint64_t u_min(uint64_t a, uint64_t b) { return b < a ? b : a; }
static uint64_t u_max(uint64_t a, uint64_t b) { return b > a ? b : a; }

static int has_min_rtt(const wg_cc *cc) { return cc->min_rtt_s >= 0.0; }
static int has_model(const wg_cc *cc) { return has_min_rtt(cc) && cc->btl_bw_bps > 0.0; }

void wg_cc_init(wg_cc *cc, size_t max_datagram_size) {
    *cc = (wg_cc){0};
    cc->max_datagram_size = max_datagram_size;
    /* RFC 9002 §7.2 suggests 10 datagrams; ours are paced from the first, and a 64 KiB
     * critical message would take 3 RTTs after a quiet period with 10 */
    cc->initial_window = (uint64_t)INITIAL_WINDOW_PACKETS * max_datagram_size;
    cc->congestion_window = cc->initial_window;
    cc->min_window = (uint64_t)MIN_CWND_PACKETS * max_datagram_size;
    cc->min_target_window = (uint64_t)MIN_TARGET_PACKETS * max_datagram_size;
    cc->state = WG_CC_STARTUP;
    cc->min_rtt_s = -1.0;
    cc->srtt_s = -1.0;
    cc->round_min_rtt_s = INFINITY;
    cc->last_round_min_rtt_s = INFINITY;
    cc->recovery_start = -INFINITY;
    cc->full_bw_checked_round = -1;
    cc->phase = PROBE_BW_START_PHASE;
    cc->probe_rtt_done_at = -INFINITY;
}

const char *wg_cc_state_name(int state) {
    switch (state) {
    case WG_CC_STARTUP: return "startup";
    case WG_CC_DRAIN: return "drain";
    case WG_CC_PROBE_BW: return "probe_bw";
    case WG_CC_PROBE_RTT: return "probe_rtt";
    default: return "?";
    }
}

/* -------------------------------------------------------------- the model */

static double bdp_bytes(const wg_cc *cc) {
    if (!has_model(cc)) return (double)cc->initial_window;
    return cc->btl_bw_bps * cc->min_rtt_s;
}

double wg_cc_pacing_gain(const wg_cc *cc) {
    if (cc->state == WG_CC_STARTUP) return STARTUP_GAIN;
    if (cc->state == WG_CC_PROBE_BW) return PROBE_BW_GAINS[cc->phase];
    return 1.0;
}

/* what fills the bottleneck: the delivery rate counts only what arrived, so with the
 * path's usual random loss p the wire needs 1 / (1 - p) times as much */
double wg_cc_sending_rate_bps(const wg_cc *cc) {
    return cc->btl_bw_bps / (1.0 - py_min(cc->random_loss, HIGH_LOSS_RATE));
}

/* the lowest RTT of this round and the one before: a standing queue raises it,
 * ProbeBW's own probe (drained within the round) does not */
static double recent_min_rtt_s(const wg_cc *cc) {
    double recent = py_min(cc->round_min_rtt_s, cc->last_round_min_rtt_s);
    if (recent == INFINITY) return cc->srtt_s >= 0.0 ? cc->srtt_s : cc->min_rtt_s;
    return recent;
}

static double rtt_allowance_s(const wg_cc *cc) {
    return py_max(RTT_ALLOWANCE_FRACTION * cc->min_rtt_s, RTT_ALLOWANCE_MIN_S);
}

static double window_rtt_s(const wg_cc *cc) {
    double srtt = cc->srtt_s >= 0.0 ? cc->srtt_s : cc->min_rtt_s;
    return py_min(py_max(srtt, cc->min_rtt_s), cc->min_rtt_s + rtt_allowance_s(cc));
}

/* the window the current state aims at (see the Python module's notes) */
static uint64_t target_window(const wg_cc *cc) {
    if (!has_model(cc)) return cc->initial_window;
    double bdp = bdp_bytes(cc), target;
    if (cc->state == WG_CC_PROBE_RTT) {
        target = PROBE_RTT_CWND_GAIN * bdp;
    } else if (cc->state == WG_CC_DRAIN) {
        target = bdp;
    } else if (cc->state == WG_CC_PROBE_BW) {
        double gain = py_max(wg_cc_pacing_gain(cc), 1.0) * CWND_GAIN;
        target = gain * wg_cc_sending_rate_bps(cc) * window_rtt_s(cc);
    } else {
        target = wg_cc_pacing_gain(cc) * wg_cc_sending_rate_bps(cc) * window_rtt_s(cc);
    }
    return u_max((uint64_t)target, cc->min_target_window); /* int(): truncation */
}

/* what the path holds in flight at the sending rate: the BDP, lost bytes included */
static double wire_bdp_bytes(const wg_cc *cc) {
    if (!has_model(cc)) return (double)cc->initial_window;
    return wg_cc_sending_rate_bps(cc) * cc->min_rtt_s;
}

double wg_cc_pacing_rate(const wg_cc *cc, double smoothed_rtt_s) {
    if (!has_model(cc)) return -1.0; /* None: the pacer uses aioquic's cwnd / srtt */
    double rate = wg_cc_pacing_gain(cc) * wg_cc_sending_rate_bps(cc);
    if (cc->state == WG_CC_STARTUP) {
        /* never below the window's own rate: a model taken from an idle connection's
         * keep-alives would start a transfer at a crawl */
        rate = py_max(rate, (double)cc->congestion_window /
                                py_max(smoothed_rtt_s, MIN_RTT_FLOOR_S));
    }
    double ceiling_s = cc->min_rtt_s + rtt_allowance_s(cc), queued_rtt_s;
    if (cc->state == WG_CC_PROBE_BW && cc->phase <= PROBE_BW_START_PHASE) {
        /* around the probe the smoothed RTT still shows the probe's own queue */
        queued_rtt_s = recent_min_rtt_s(cc);
    } else {
        /* a queue still there a round later stands: the smoothed RTT shows it */
        queued_rtt_s = py_max(smoothed_rtt_s, recent_min_rtt_s(cc));
    }
    if (queued_rtt_s > ceiling_s) {
        /* slow down and drain, but not below the window floor per RTT (a loss-based
         * flow's full queue would take the model down round after round), nor above
         * the model's rate */
        double floor = py_min(rate, (double)cc->min_target_window /
                                        py_max(smoothed_rtt_s, queued_rtt_s));
        rate = py_max(rate * ceiling_s / queued_rtt_s, floor);
    }
    if (cc->app_limited_until) {
        /* app-limited: the model is the traffic's rate, not the path's; at least the
         * window floor per RTT, as aioquic's cwnd / srtt did */
        rate = py_max(rate, (double)cc->min_target_window /
                                py_max(smoothed_rtt_s, MIN_RTT_FLOOR_S));
    }
    return rate;
}

/* windowed max over BW_WINDOW_ROUNDS rounds, a monotonic deque holding only each
 * round's first sample (see WG_CC_BW_SAMPLES: the same front as the Python's) */
static void update_bw(wg_cc *cc, double sample_bps) {
    while (cc->bw_count && cc->bw_rate[cc->bw_count - 1] <= sample_bps)
        cc->bw_count--; /* a newer, larger sample dominates */
    if (cc->bw_count == 0 || cc->bw_round[cc->bw_count - 1] != cc->round_count) {
        cc->bw_round[cc->bw_count] = cc->round_count;
        cc->bw_rate[cc->bw_count] = sample_bps;
        cc->bw_count++;
    }
    size_t expired = 0;
    while (cc->bw_round[expired] <= cc->round_count - BW_WINDOW_ROUNDS) expired++;
    if (expired) {
        for (size_t i = expired; i < cc->bw_count; i++) {
            cc->bw_round[i - expired] = cc->bw_round[i];
            cc->bw_rate[i - expired] = cc->bw_rate[i];
        }
        cc->bw_count -= expired;
    }
    cc->btl_bw_bps = cc->bw_rate[0];
}

/* ----------------------------------------------------------- the machine */

static void clear_round_counts(wg_cc *cc) {
    cc->round_lost_packets = 0;
    cc->round_lost_bytes = 0;
    cc->round_acked_bytes = 0;
    cc->round_acked_packets = 0;
    cc->round_cruise_bytes = 0; /* acked or lost, of packets sent cruising */
    cc->round_cruise_lost_bytes = 0;
}

/* whether losses may end Startup: not in its first rounds, whose flight left at the
 * initial window's rate rather than the model's */
static int model_measured(const wg_cc *cc) {
    return cc->state != WG_CC_STARTUP || cc->round_count >= STARTUP_LOSS_MIN_ROUNDS;
}

/* whether this round's lowest RTT showed a standing queue */
static int round_queued(const wg_cc *cc) {
    return has_min_rtt(cc) && cc->round_min_rtt_s > cc->min_rtt_s * QUEUE_RTT_FACTOR &&
           cc->round_min_rtt_s - cc->min_rtt_s > RTT_ALLOWANCE_MIN_S;
}

/* RFC 9002 §7 leaves the response to loss to the controller: congestion is a high
 * loss rate, or one past the path's usual loss (plus its noise) with a queue */
static int is_congestion(const wg_cc *cc, int queue_required) {
    uint64_t total = cc->round_lost_bytes + cc->round_acked_bytes;
    double loss_rate = total ? (double)cc->round_lost_bytes / (double)total : 0.0;
    if (loss_rate > HIGH_LOSS_RATE && !queue_required) return 1;
    /* Startup too: random loss of a few percent must not end it */
    int queue = round_queued(cc);
    double usual = cc->loss_baseline;
    uint64_t packets = u_max(1, cc->round_lost_packets + cc->round_acked_packets);
    double noise = LOSS_NOISE_SIGMAS * sqrt(usual * (1.0 - usual) / (double)packets);
    return loss_rate > QUEUE_LOSS_RATE + usual + noise && queue;
}

static uint64_t ceiling(const wg_cc *cc) {
    if (cc->state == WG_CC_STARTUP && !cc->filled_pipe)
        return u_max(cc->congestion_window, target_window(cc));
    return target_window(cc);
}

static void on_congestion(wg_cc *cc, double now) {
    cc->congestion_events++;
    cc->recovery_start = now; /* once per recovery epoch (RFC 9002 §7.3.2) */
    if (cc->state != WG_CC_STARTUP) {
        /* BBR v2's beta; Startup's excess is in flight, not in the model: Drain takes
         * it out */
        for (size_t i = 0; i < cc->bw_count; i++) cc->bw_rate[i] = cc->bw_rate[i] * LOSS_BETA;
        cc->btl_bw_bps *= LOSS_BETA;
    }
    clear_round_counts(cc);
    if (cc->state == WG_CC_STARTUP) {
        cc->filled_pipe = 1;
        cc->state = WG_CC_DRAIN;
    }
    cc->congestion_window = u_min(cc->congestion_window, ceiling(cc));
}

static void start_round(wg_cc *cc, double now) {
    if (cc->round_lost_packets >= LOSS_MIN_PACKETS && model_measured(cc) &&
        is_congestion(cc, 0)) {
        on_congestion(cc, now);
    } else {
        uint64_t total = cc->round_lost_bytes + cc->round_acked_bytes;
        if (total) {
            double rate = (double)cc->round_lost_bytes / (double)total;
            cc->loss_baseline += LOSS_BASELINE_WEIGHT * (rate - cc->loss_baseline);
        }
        uint64_t cruise = cc->round_cruise_bytes;
        if (cruise && !round_queued(cc)) {
            double rate = (double)cc->round_cruise_lost_bytes / (double)cruise;
            cc->random_loss += LOSS_BASELINE_WEIGHT * (rate - cc->random_loss);
        }
    }
    cc->round_count++;
    cc->next_round_delivered = cc->delivered_bytes;
    cc->last_round_min_rtt_s = cc->round_min_rtt_s;
    cc->round_min_rtt_s = INFINITY;
    clear_round_counts(cc);
}

/* once per round: did the bandwidth still grow by 25 %? (BBR §4.3.2.2) */
static void check_full_pipe(wg_cc *cc) {
    if (cc->round_count == cc->full_bw_checked_round) return;
    cc->full_bw_checked_round = cc->round_count;
    if (cc->btl_bw_bps >= cc->full_bw_bps * FULL_BW_GROWTH) {
        cc->full_bw_bps = cc->btl_bw_bps;
        cc->full_bw_count = 0;
        return;
    }
    cc->full_bw_count++;
    if (cc->full_bw_count >= FULL_BW_ROUNDS) {
        cc->filled_pipe = 1;
        cc->state = WG_CC_DRAIN;
    }
}

static void enter_probe_bw(wg_cc *cc, double now) {
    cc->state = WG_CC_PROBE_BW;
    cc->phase = PROBE_BW_START_PHASE;
    cc->phase_start = now;
}

static void enter_probe_rtt(wg_cc *cc) {
    cc->prior_cwnd = u_max(cc->prior_cwnd, cc->congestion_window);
    cc->state = WG_CC_PROBE_RTT;
    cc->probe_rtt_done_at = -INFINITY;
}

static void advance_state(wg_cc *cc, double now) {
    double min_rtt = has_min_rtt(cc) ? cc->min_rtt_s : 0.0;
    if (cc->state == WG_CC_DRAIN && (double)cc->bytes_in_flight <= bdp_bytes(cc)) {
        enter_probe_bw(cc, now);
    } else if (cc->state == WG_CC_PROBE_BW) {
        int elapsed = now - cc->phase_start > min_rtt;
        double gain = PROBE_BW_GAINS[cc->phase];
        if (elapsed || (gain < 1.0 && (double)cc->bytes_in_flight <= wire_bdp_bytes(cc))) {
            cc->phase = (cc->phase + 1) % PROBE_BW_PHASES;
            cc->phase_start = now;
        }
    } else if (cc->state == WG_CC_PROBE_RTT) {
        if (cc->probe_rtt_done_at == -INFINITY) {
            if (cc->bytes_in_flight <= target_window(cc)) {
                cc->probe_rtt_done_at = now + PROBE_RTT_DURATION_S;
                cc->probe_rtt_round = cc->round_count + 1;
            }
        } else if (now >= cc->probe_rtt_done_at && cc->round_count >= cc->probe_rtt_round) {
            cc->min_rtt_at = now;
            enter_probe_bw(cc, now);
            cc->congestion_window = u_max(cc->congestion_window, cc->prior_cwnd);
            cc->prior_cwnd = 0;
        }
    }
}

static void set_window(wg_cc *cc, uint64_t acked_bytes) {
    uint64_t target = target_window(cc), cwnd = cc->congestion_window;
    if (cc->state == WG_CC_STARTUP) {
        /* grow by what was acked, like slow start (BBR §4.2.3.6) */
        if (cwnd < target || cc->delivered_bytes < cc->initial_window) cwnd += acked_bytes;
    } else {
        cwnd = u_min(cwnd + acked_bytes, target);
    }
    cc->congestion_window = u_max(cwnd, cc->min_window);
}

/* ------------------------------------------------------- aioquic interface */

void wg_cc_on_sent(wg_cc *cc, wg_cc_packet *packet, size_t sent_bytes, double now) {
    double sent_at = now;
    if (cc->bytes_in_flight == 0) {
        /* restart the send/ack intervals after idle (delivery-rate draft §3.2) */
        cc->first_sent_at = sent_at;
        cc->delivered_at = sent_at;
    }
    /* against the flight the rate needs, not ProbeBW's window; in Startup against the
     * window, as a model from an idle connection's keep-alives would call them full */
    uint64_t limit = cc->congestion_window;
    if (cc->filled_pipe && has_model(cc))
        limit = u_min(limit, (uint64_t)(wg_cc_sending_rate_bps(cc) * window_rtt_s(cc)));
    if ((double)cc->bytes_in_flight < APP_LIMITED_FRACTION * (double)limit)
        cc->app_limited_until =
            u_max(cc->delivered_bytes + cc->bytes_in_flight + sent_bytes, 1);
    double gain = wg_cc_pacing_gain(cc);
    *packet = (wg_cc_packet){
        .delivered = cc->delivered_bytes,
        .delivered_at = cc->delivered_at,
        .first_sent_at = cc->first_sent_at,
        .sent_at = sent_at,
        .app_limited = cc->app_limited_until > 0,
        .cruising = cc->state == WG_CC_PROBE_BW && gain <= 1.0,
        .probing = cc->state == WG_CC_PROBE_BW && gain > 1.0,
        .tracked = 1,
    };
    cc->bytes_in_flight += sent_bytes;
}

void wg_cc_on_acked(wg_cc *cc, const wg_cc_packet *sent, size_t sent_bytes, double now) {
    cc->bytes_in_flight -= sent_bytes;
    uint64_t acked = sent_bytes;
    cc->delivered_bytes += acked;
    cc->delivered_at = now;
    if (cc->app_limited_until && cc->delivered_bytes > cc->app_limited_until)
        cc->app_limited_until = 0;
    if (!sent->tracked) return;
    if (sent->sent_at > cc->recovery_start) {
        cc->round_acked_bytes += acked;
        cc->round_acked_packets += 1;
        if (sent->cruising) cc->round_cruise_bytes += acked;
    }
    if (sent->delivered >= cc->next_round_delivered) start_round(cc, now);
    cc->first_sent_at = sent->sent_at;
    double send_s = sent->sent_at - sent->first_sent_at, ack_s = now - sent->delivered_at;
    double interval_s = py_max(send_s, ack_s);
    if (interval_s > 0.0 && (!has_min_rtt(cc) || interval_s >= cc->min_rtt_s)) {
        double rate_bps = (double)(cc->delivered_bytes - sent->delivered) / interval_s;
        /* a probe's sample above the model whose acks came closer together than its
         * data left shows our sending rate, not the path's (acks queued behind the
         * other direction's data) */
        int compressed = sent->probing && ack_s < send_s && rate_bps > cc->btl_bw_bps;
        if (!compressed && (!sent->app_limited || rate_bps >= cc->btl_bw_bps)) {
            update_bw(cc, rate_bps);
            if (!sent->app_limited && cc->state == WG_CC_STARTUP) check_full_pipe(cc);
        }
    }
    advance_state(cc, now);
    set_window(cc, acked);
}

void wg_cc_on_expired_packet(wg_cc *cc, const wg_cc_packet *packet, size_t sent_bytes) {
    cc->bytes_in_flight -= sent_bytes;
}

void wg_cc_on_expired(wg_cc *cc, const wg_cc_packet *packets, const size_t *sent_bytes,
                      size_t count) {
    for (size_t i = 0; i < count; i++) wg_cc_on_expired_packet(cc, &packets[i], sent_bytes[i]);
}

void wg_cc_on_lost_packet(wg_cc *cc, const wg_cc_packet *sent, size_t sent_bytes) {
    cc->bytes_in_flight -= sent_bytes;
    if (sent->tracked && sent->sent_at > cc->recovery_start) {
        cc->round_lost_packets += 1;
        cc->round_lost_bytes += sent_bytes;
        if (sent->cruising) {
            cc->round_cruise_bytes += sent_bytes;
            cc->round_cruise_lost_bytes += sent_bytes;
        }
    }
}

void wg_cc_on_lost_end(wg_cc *cc, double now) {
    /* judged when the round ends (start_round), but Startup not once the losses are
     * many and a queue shows: it doubles its window every round, and a round's wait
     * overfills the bottleneck's buffer twice over */
    if (cc->state == WG_CC_STARTUP && cc->round_lost_packets >= STARTUP_LOSS_MIN_PACKETS &&
        model_measured(cc) && is_congestion(cc, 1))
        on_congestion(cc, now);
}

void wg_cc_on_lost(wg_cc *cc, const wg_cc_packet *packets, const size_t *sent_bytes,
                   size_t count, double now) {
    for (size_t i = 0; i < count; i++) wg_cc_on_lost_packet(cc, &packets[i], sent_bytes[i]);
    wg_cc_on_lost_end(cc, now);
}

/* RFC 9002 §7.6: the window drops to the minimum and regrows; the model is kept */
void wg_cc_on_persistent_congestion(wg_cc *cc) { cc->congestion_window = cc->min_window; }

void wg_cc_on_rtt(wg_cc *cc, double rtt_s, double now) {
    double rtt = py_max(rtt_s, MIN_RTT_FLOOR_S);
    cc->srtt_s = cc->srtt_s < 0.0 ? rtt : cc->srtt_s + SRTT_WEIGHT * (rtt - cc->srtt_s);
    cc->round_min_rtt_s = py_min(cc->round_min_rtt_s, rtt);
    int expired = now > cc->min_rtt_at + MIN_RTT_WINDOW_S;
    if (!has_min_rtt(cc) || rtt <= cc->min_rtt_s || expired) {
        cc->min_rtt_s = rtt;
        cc->min_rtt_at = now;
    }
    if (expired && cc->state != WG_CC_PROBE_RTT && cc->filled_pipe) enter_probe_rtt(cc);
    cc->congestion_window = u_min(cc->congestion_window, ceiling(cc));
}
