"""A model-based, loss-tolerant congestion controller for aioquic ("wangate").

aioquic's "reno" and "cubic" halve the window on every loss, so 1 % random loss on a
long WAN path leaves a few percent of its capacity. This controller follows BBR v1
(draft-cheng-iccrg-bbr-congestion-control-00, with the delivery-rate estimator of
draft-cheng-iccrg-delivery-rate-estimation-00) and takes two ideas from BBR v2
(a multiplicative cut on loss, a gentler ProbeRTT):

* Model: bottleneck bandwidth = windowed max of delivery-rate samples over
  ``BW_WINDOW_ROUNDS`` round trips; propagation delay = min RTT over ``MIN_RTT_WINDOW_S``.
  BDP = bandwidth x min RTT.
* Pacing and window apart, as BBR has them: the pacer (``net/pacing.py``) takes its
  rate from ``pacing_rate_bytes``: ``gain x bandwidth / (1 - random loss)`` (the
  delivery rate counts what arrived; the wire carries the lost packets too; random
  loss: that of packets sent cruising, in rounds without a queue), times ``(min_rtt +
  allowance) / rtt`` once ``rtt`` is past the allowance (jitter, ack delay): a standing
  queue slows the rate and drains. ``rtt`` is the smoothed RTT, but around ProbeBW's
  probe the lowest RTT of this round and the last (the probe's own queue drains). The
  window only caps what is in flight: ``1.25 x max(gain, 1) x bandwidth / (1 - random
  loss) x rtt_w`` in ProbeBW, with ``rtt_w`` the smoothed RTT clamped to ``[min_rtt,
  min_rtt + allowance]``, so it does not follow a queue either.
  An application-limited sender (critical messages alone, whose own rate is then the
  model) paces at least at the window floor per RTT, as aioquic's ``cwnd / srtt`` did.
  (aioquic alone paces at ``cwnd / srtt``; with the rate tied to the window, ProbeBW's
  0.75 phase capped the flight below the BDP and left the path idle for part of every
  cycle, and the 64-datagram floor of the window paced slow paths past their queues.)
* States (BBR §4.3): Startup (gain 2/ln 2, grows by the bytes acked: about 1.5-2x
  per round) until the bandwidth grew < 25 % for 3 rounds; Drain (window = BDP) until
  in flight <= BDP; ProbeBW cycling gains 1.25, 0.75, 1 x 6, one min RTT each (probe
  for more, then drain the probe's queue, the 0.75 phase ending early once the flight
  is down to the path's BDP on the wire: this cycling is what leaves room for a
  competing TCP flow); ProbeRTT (window = BDP / 2 for 200 ms and a round) when the
  min RTT was not refreshed for ``MIN_RTT_WINDOW_S``.
* Loss (RFC 9002 §7 leaves the response to the controller): a round's loss counts as
  congestion only if at least ``LOSS_MIN_PACKETS`` packets were lost and either the
  loss exceeds ``HIGH_LOSS_RATE`` or it exceeds ``QUEUE_LOSS_RATE`` more than the
  path's usual loss (an average over the rounds not judged congestion, plus
  ``LOSS_NOISE_SIGMAS`` standard deviations of a round of that many packets) while the
  round's lowest RTT is above ``min_rtt x QUEUE_RTT_FACTOR`` (a standing queue). Busy
  gateways raise the RTT as a queue does: without the usual loss in the threshold, the
  random loss of a 1-5 % path read as congestion whenever the hosts were slow. Congestion cuts
  the bandwidth estimate by ``LOSS_BETA`` (BBR v2's beta) once per recovery epoch
  (packets sent before the cut do not count again, RFC 9002 §7.3.2). Random loss of a
  few percent leaves the model alone. In Startup, 8 lost packets at a congestion rate
  with a queue showing end it at once rather than at the round's end, keeping the
  model (Drain takes the excess out); the losses of its first two rounds (the initial
  window's, sent before the model was measured) do not end it. Persistent
  congestion (RFC 9002 §7.6) drops the window to the minimum; it regrows by the bytes
  acked, the model is kept.

Pure: aioquic passes ``now``; nothing here reads a clock or does I/O. Importing the
module registers it under ``CONGESTION_CONTROL_NAME``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from aioquic.quic.congestion.base import (
    QuicCongestionControl,
    register_congestion_control,
)
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.tls import Epoch

CONGESTION_CONTROL_NAME = "wangate"

STARTUP_GAIN = 2.0 / math.log(2.0)  # BBR: the smallest gain that doubles each round
PROBE_BW_GAINS = (1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
PROBE_BW_START_PHASE = 2  # start cruising; BBR picks at random, we stay deterministic
BW_WINDOW_ROUNDS = 10
MIN_RTT_WINDOW_S = 10.0
PROBE_RTT_DURATION_S = 0.2
PROBE_RTT_CWND_GAIN = 0.5  # BBR v2: half a BDP, not 4 packets
FULL_BW_GROWTH = 1.25
FULL_BW_ROUNDS = 3
# ProbeBW's window is an in-flight cap over what the pacer sends (BBR's is 2 BDP): room
# for acks that come late or in clumps, and for the 1.25 probe. Not more: while critical
# data waits, the link sends unpaced up to the window, and what exceeds the BDP then
# queues in front of the critical message.
CWND_GAIN = 1.25
MIN_CWND_PACKETS = 4  # after persistent congestion (RFC 9002 §7.6.2 uses 2)
# The model's window never goes below this: aioquic paces in bursts of cwnd/4 (at most
# 16 datagrams), and with a small window each pacer wake-up sends a datagram or two. On
# a fast path that costs twice the CPU per byte (measured on loopback at 1452-byte
# datagrams: 64 here halves the CPU against 16). WAN paths' BDPs are larger anyway.
MIN_TARGET_PACKETS = 64
INITIAL_WINDOW_PACKETS = MIN_TARGET_PACKETS
RTT_ALLOWANCE_FRACTION = 0.10  # queueing tolerated before the rate starts to fall...
RTT_ALLOWANCE_MIN_S = 0.005  # ...but at least this (timers, ack delay, busy hosts)
MIN_RTT_FLOOR_S = 0.001  # aioquic floors RTTs at 1 ms as well
HIGH_LOSS_RATE = 0.15
QUEUE_LOSS_RATE = 0.02
QUEUE_RTT_FACTOR = 1.25
LOSS_MIN_PACKETS = 3
STARTUP_LOSS_MIN_PACKETS = 8  # 2 % random loss needs a 400-packet round to reach this
STARTUP_LOSS_MIN_ROUNDS = 2  # rounds paced from a measured bandwidth before loss ends Startup
LOSS_BETA = 0.7
LOSS_BASELINE_WEIGHT = 0.125  # per round not judged congestion
LOSS_NOISE_SIGMAS = 3.0
APP_LIMITED_FRACTION = 0.5  # sending with less than this much of cwnd in flight
SRTT_WEIGHT = 0.125  # RFC 9002 §5.3

STARTUP, DRAIN, PROBE_BW, PROBE_RTT = "startup", "drain", "probe_bw", "probe_rtt"


class _Sent:
    """Delivery-rate state remembered for one packet until it is acked or lost."""

    __slots__ = (
        "app_limited", "cruising", "delivered", "delivered_at", "first_sent_at", "probing",
        "sent_at",
    )  # fmt: skip

    def __init__(
        self,
        delivered: int,
        delivered_at: float,
        first_sent_at: float,
        sent_at: float,
        app_limited: bool,
        cruising: bool,
        probing: bool,
    ) -> None:
        self.cruising = cruising  # sent in ProbeBW at a gain <= 1: no probe's excess
        self.probing = probing  # sent in ProbeBW at a gain > 1
        self.delivered = delivered
        self.delivered_at = delivered_at
        self.first_sent_at = first_sent_at
        self.sent_at = sent_at
        self.app_limited = app_limited


class WangateCongestionControl(QuicCongestionControl):
    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.max_datagram_size = max_datagram_size
        # RFC 9002 §7.2 suggests 10 datagrams. Ours are paced from the first one (the
        # handshake gives an RTT), and a 64 KiB critical message is 46 datagrams at a
        # 1500-byte MTU: with 10, the first one after a quiet period takes 3 RTTs.
        self.initial_window = INITIAL_WINDOW_PACKETS * max_datagram_size
        self.congestion_window = self.initial_window
        self.min_window = MIN_CWND_PACKETS * max_datagram_size
        self.min_target_window = MIN_TARGET_PACKETS * max_datagram_size
        self.state = STARTUP

        # delivery-rate estimation
        self._sent: dict[tuple[Epoch, int], _Sent] = {}
        self.delivered_bytes = 0
        self._delivered_at = 0.0
        self._first_sent_at = 0.0
        self._app_limited_until = 0  # delivered count that ends an app-limited bubble

        # model
        self._bw_samples: list[tuple[int, float]] = []  # (round, bytes/s), max-filter window
        self.btl_bw_bps = 0.0  # bytes per second
        self.min_rtt_s: float | None = None
        self._min_rtt_at = 0.0
        self.srtt_s: float | None = None

        # rounds
        self.round_count = 0
        self._next_round_delivered = 0
        self._round_min_rtt_s = math.inf
        self._last_round_min_rtt_s = math.inf
        self._round_lost_packets = 0
        self._round_lost_bytes = 0
        self._round_acked_bytes = 0
        self._round_acked_packets = 0
        self._round_cruise_bytes = 0  # acked or lost, of packets sent cruising
        self._round_cruise_lost_bytes = 0
        self.loss_baseline = 0.0  # the path's usual loss rate (bytes), congestion aside
        # the loss of packets sent cruising (ProbeBW, gain <= 1: no probe's or Startup's
        # excess) in rounds without a queue: what the path loses whatever we send. Our
        # own queue's drops must not make us send faster into it: in a buffer too
        # shallow to show in the RTT they come with the probes, and they fed the
        # 1 / (1 - loss) compensation, which overfilled the buffer further
        self.random_loss = 0.0
        self.congestion_events = 0
        self._recovery_start = -math.inf

        # state machine
        self._full_bw_bps = 0.0
        self._full_bw_count = 0
        self._full_bw_checked_round = -1
        self.filled_pipe = False
        self._phase = PROBE_BW_START_PHASE
        self._phase_start = 0.0
        self._probe_rtt_done_at: float | None = None
        self._probe_rtt_round = 0
        self._prior_cwnd = 0

    # -------------------------------------------------------------- the model

    @property
    def bdp_bytes(self) -> float:
        if self.min_rtt_s is None or self.btl_bw_bps <= 0.0:
            return float(self.initial_window)
        return self.btl_bw_bps * self.min_rtt_s

    @property
    def pacing_gain(self) -> float:
        if self.state == STARTUP:
            return STARTUP_GAIN
        if self.state == PROBE_BW:
            return PROBE_BW_GAINS[self._phase]
        return 1.0

    @property
    def sending_rate_bps(self) -> float:
        """The rate that fills the bottleneck: the delivery rate counts only what
        arrived, so with the path's usual random loss ``p`` the sender must put
        ``1 / (1 - p)`` times as much on the wire (a lost packet took its share of the
        link before it was lost) or leave ``p`` of the link unused. ``p`` is the loss of
        packets sent cruising in rounds that showed no queue, so that a queue's drops do
        not feed the queue."""
        return self.btl_bw_bps / (1.0 - min(self.random_loss, HIGH_LOSS_RATE))

    def _recent_min_rtt_s(self) -> float:
        """The lowest RTT of this round and the one before: a queue that stands (not
        ours, or ours past the allowance) raises it; ProbeBW's own probe does not, as
        its 0.75 phase drains it within the round. The smoothed RTT lags a round behind
        the probe and, followed then, slowed the cruise after each probe a second time."""
        recent = min(self._round_min_rtt_s, self._last_round_min_rtt_s)
        if recent == math.inf:
            assert self.min_rtt_s is not None
            return self.srtt_s if self.srtt_s is not None else self.min_rtt_s
        return recent

    def _rtt_allowance_s(self) -> float:
        assert self.min_rtt_s is not None
        return max(RTT_ALLOWANCE_FRACTION * self.min_rtt_s, RTT_ALLOWANCE_MIN_S)

    def _window_rtt_s(self) -> float:
        assert self.min_rtt_s is not None
        srtt = self.srtt_s if self.srtt_s is not None else self.min_rtt_s
        return min(max(srtt, self.min_rtt_s), self.min_rtt_s + self._rtt_allowance_s())

    def target_window(self) -> int:
        """The window the current state aims at (see the module notes)."""
        if self.min_rtt_s is None or self.btl_bw_bps <= 0.0:
            return self.initial_window
        bdp = self.bdp_bytes
        if self.state == PROBE_RTT:
            target = PROBE_RTT_CWND_GAIN * bdp
        elif self.state == DRAIN:
            target = bdp
        elif self.state == PROBE_BW:
            gain = max(self.pacing_gain, 1.0) * CWND_GAIN
            target = gain * self.sending_rate_bps * self._window_rtt_s()
        else:
            target = self.pacing_gain * self.sending_rate_bps * self._window_rtt_s()
        return max(int(target), self.min_target_window)

    @property
    def wire_bdp_bytes(self) -> float:
        """What the path holds in flight at the sending rate: the BDP, lost bytes included."""
        if self.min_rtt_s is None or self.btl_bw_bps <= 0.0:
            return float(self.initial_window)
        return self.sending_rate_bps * self.min_rtt_s

    def pacing_rate_bytes(self, smoothed_rtt_s: float) -> float | None:
        """The pacer's rate in bytes per second (``net/pacing.py``), or None before the
        model has a bandwidth (then aioquic's ``cwnd / srtt``). ``smoothed_rtt_s`` is
        aioquic's smoothed RTT (RFC 9002 §5.3, ack delay taken off)."""
        if self.min_rtt_s is None or self.btl_bw_bps <= 0.0:
            return None
        rate = self.pacing_gain * self.sending_rate_bps
        if self.state == STARTUP:
            # never below what the window alone gave (aioquic's cwnd / srtt; BBR too
            # starts from the initial window's rate): a model taken from the probes and
            # keep-alives of an idle connection would start a transfer at a crawl
            rate = max(rate, self.congestion_window / max(smoothed_rtt_s, MIN_RTT_FLOOR_S))
        ceiling_s = self.min_rtt_s + self._rtt_allowance_s()
        if self.state == PROBE_BW and self._phase <= PROBE_BW_START_PHASE:
            # the probe, its drain and the phase after: the smoothed RTT still shows
            # the probe's queue (its samples lag a round), which the 0.75 phase drains
            queued_rtt_s = self._recent_min_rtt_s()
        else:
            # a queue still there a round later stands: the smoothed RTT shows it, also
            # one that only empties now and then (acks queued behind the other
            # direction's data in a shallow buffer overstate the bandwidth)
            queued_rtt_s = max(smoothed_rtt_s, self._recent_min_rtt_s())
        if queued_rtt_s > ceiling_s:
            # a queue past the allowance slows us down and drains, but not below the
            # window floor per RTT (what aioquic's cwnd / srtt gave): a queue that a
            # loss-based flow keeps full would otherwise take our rate, and with it the
            # delivery rate that is our model, down round after round. Never above the
            # model's rate: on a slow path the floor exceeds its BDP and buffer.
            floor = min(rate, self.min_target_window / max(smoothed_rtt_s, queued_rtt_s))
            rate = max(rate * ceiling_s / queued_rtt_s, floor)
        if self._app_limited_until:
            # the sender has less than the path carries (critical messages alone): the
            # model is the traffic's rate, not the path's, and paced at it a 64 KiB
            # message would take as long as the gap to the next; at least the window
            # floor per RTT, as aioquic's cwnd / srtt did
            rate = max(rate, self.min_target_window / max(smoothed_rtt_s, MIN_RTT_FLOOR_S))
        return rate

    def _update_bw(self, sample_bps: float) -> None:
        samples = self._bw_samples
        while samples and samples[-1][1] <= sample_bps:
            samples.pop()  # monotonic deque: a newer, larger sample dominates
        samples.append((self.round_count, sample_bps))
        while samples[0][0] <= self.round_count - BW_WINDOW_ROUNDS:
            samples.pop(0)
        self.btl_bw_bps = samples[0][1]

    # ------------------------------------------------------- aioquic interface

    def on_packet_sent(self, *, packet: QuicSentPacket) -> None:
        sent_at = packet.sent_time if packet.sent_time is not None else self._delivered_at
        if self.bytes_in_flight == 0:
            # restart the send/ack intervals after idle (delivery-rate draft §3.2)
            self._first_sent_at = sent_at
            self._delivered_at = sent_at
        # against the flight the rate needs, not ProbeBW's window; in Startup
        # against the window, as a model taken from an idle connection's keep-alives
        # would call them a full pipe
        limit = self.congestion_window
        if self.filled_pipe and self.min_rtt_s is not None and self.btl_bw_bps > 0.0:
            limit = min(limit, int(self.sending_rate_bps * self._window_rtt_s()))
        if self.bytes_in_flight < APP_LIMITED_FRACTION * limit:
            self._app_limited_until = max(
                self.delivered_bytes + self.bytes_in_flight + packet.sent_bytes, 1
            )
        self._sent[(packet.epoch, packet.packet_number)] = _Sent(
            self.delivered_bytes,
            self._delivered_at,
            self._first_sent_at,
            sent_at,
            self._app_limited_until > 0,
            self.state == PROBE_BW and self.pacing_gain <= 1.0,
            self.state == PROBE_BW and self.pacing_gain > 1.0,
        )
        self.bytes_in_flight += packet.sent_bytes

    def on_packet_acked(self, *, now: float, packet: QuicSentPacket) -> None:
        self.bytes_in_flight -= packet.sent_bytes
        sent = self._sent.pop((packet.epoch, packet.packet_number), None)
        acked = packet.sent_bytes
        self.delivered_bytes += acked
        self._delivered_at = now
        if self._app_limited_until and self.delivered_bytes > self._app_limited_until:
            self._app_limited_until = 0
        if sent is None:
            return
        if sent.sent_at > self._recovery_start:
            self._round_acked_bytes += acked
            self._round_acked_packets += 1
            if sent.cruising:
                self._round_cruise_bytes += acked
        if sent.delivered >= self._next_round_delivered:
            self._start_round(now)
        self._first_sent_at = sent.sent_at
        send_s, ack_s = sent.sent_at - sent.first_sent_at, now - sent.delivered_at
        interval_s = max(send_s, ack_s)
        if interval_s > 0.0 and (self.min_rtt_s is None or interval_s >= self.min_rtt_s):
            rate_bps = (self.delivered_bytes - sent.delivered) / interval_s
            # a probe's sample above the model whose acks came closer together than its
            # data left shows our sending rate, not the path's: its acks queued behind
            # the other direction's data and left together (up to +14 % a probe on the
            # collectives lab's 5 Mbit/s links, then the queue overflowed)
            compressed = sent.probing and ack_s < send_s and rate_bps > self.btl_bw_bps
            if not compressed and (not sent.app_limited or rate_bps >= self.btl_bw_bps):
                self._update_bw(rate_bps)
                if not sent.app_limited and self.state == STARTUP:
                    self._check_full_pipe(rate_bps)
        self._advance_state(now)
        self._set_window(acked)

    def on_packets_expired(self, *, packets: Iterable[QuicSentPacket]) -> None:
        for packet in packets:
            self.bytes_in_flight -= packet.sent_bytes
            self._sent.pop((packet.epoch, packet.packet_number), None)

    def on_packets_lost(self, *, now: float, packets: Iterable[QuicSentPacket]) -> None:
        for packet in packets:
            self.bytes_in_flight -= packet.sent_bytes
            sent = self._sent.pop((packet.epoch, packet.packet_number), None)
            if sent is not None and sent.sent_at > self._recovery_start:
                self._round_lost_packets += 1
                self._round_lost_bytes += packet.sent_bytes
                if sent.cruising:
                    self._round_cruise_bytes += packet.sent_bytes
                    self._round_cruise_lost_bytes += packet.sent_bytes
        # judged when the round ends (_start_round): early in a round a few random
        # losses against few acks would look like a high loss rate. Startup is the
        # exception once the losses are many and a queue shows: it doubles its window
        # every round, so a round's wait overfills the bottleneck's buffer twice over.
        # Without a queue, a high rate mid-round is the small sample's doing (9 of 52 at
        # 5 % random loss ended Startup at 3 Mbit/s on a 50 Mbit/s path).
        if (
            self.state == STARTUP
            and self._round_lost_packets >= STARTUP_LOSS_MIN_PACKETS
            and self._model_measured()
            and self._is_congestion(queue_required=True)
        ):
            self._on_congestion(now)

    def on_persistent_congestion(self) -> None:
        self.congestion_window = self.min_window

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        rtt = max(rtt, MIN_RTT_FLOOR_S)
        self.srtt_s = (
            rtt if self.srtt_s is None else self.srtt_s + SRTT_WEIGHT * (rtt - self.srtt_s)
        )
        self._round_min_rtt_s = min(self._round_min_rtt_s, rtt)
        expired = now > self._min_rtt_at + MIN_RTT_WINDOW_S
        if self.min_rtt_s is None or rtt <= self.min_rtt_s or expired:
            self.min_rtt_s = rtt
            self._min_rtt_at = now
        if expired and self.state != PROBE_RTT and self.filled_pipe:
            self._enter_probe_rtt()
        self.congestion_window = min(self.congestion_window, self._ceiling())

    def get_log_data(self) -> dict[str, Any]:
        data = super().get_log_data()
        data.update(
            state=self.state,
            btl_bw_bps=int(self.btl_bw_bps),
            min_rtt_ms=None if self.min_rtt_s is None else self.min_rtt_s * 1000.0,
            pacing_gain=self.pacing_gain,
        )
        return data

    # ----------------------------------------------------------- the machine

    def _start_round(self, now: float) -> None:
        if (
            self._round_lost_packets >= LOSS_MIN_PACKETS
            and self._model_measured()
            and self._is_congestion()
        ):
            self._on_congestion(now)
        else:
            total = self._round_lost_bytes + self._round_acked_bytes
            if total:
                rate = self._round_lost_bytes / total
                self.loss_baseline += LOSS_BASELINE_WEIGHT * (rate - self.loss_baseline)
            cruise = self._round_cruise_bytes
            if cruise and not self._round_queued():
                rate = self._round_cruise_lost_bytes / cruise
                self.random_loss += LOSS_BASELINE_WEIGHT * (rate - self.random_loss)
        self.round_count += 1
        self._next_round_delivered = self.delivered_bytes
        self._last_round_min_rtt_s = self._round_min_rtt_s
        self._round_min_rtt_s = math.inf
        self._round_lost_packets = 0
        self._round_lost_bytes = 0
        self._round_acked_bytes = 0
        self._round_acked_packets = 0
        self._round_cruise_bytes = 0  # acked or lost, of packets sent cruising
        self._round_cruise_lost_bytes = 0

    def _model_measured(self) -> bool:
        """Whether losses may end Startup: not in the first rounds, whose flight left at
        the initial window's rate, not the model's (an initial window larger than a slow
        path's BDP and buffer would end Startup with a bandwidth of a tenth of the path's,
        which ProbeBW's +25 % per cycle takes seconds to undo)."""
        return self.state != STARTUP or self.round_count >= STARTUP_LOSS_MIN_ROUNDS

    def _is_congestion(self, *, queue_required: bool = False) -> bool:
        total = self._round_lost_bytes + self._round_acked_bytes
        loss_rate = self._round_lost_bytes / total if total else 0.0
        if loss_rate > HIGH_LOSS_RATE and not queue_required:
            return True
        # Startup too: random loss of a few percent must not end it (a 64 kB message on a
        # lossy path would crawl up in ProbeBW); its overshoot fills the buffer first
        queue = self._round_queued()
        usual = self.loss_baseline
        packets = max(1, self._round_lost_packets + self._round_acked_packets)
        noise = LOSS_NOISE_SIGMAS * math.sqrt(usual * (1.0 - usual) / packets)
        return loss_rate > QUEUE_LOSS_RATE + usual + noise and queue

    def _round_queued(self) -> bool:
        """Whether this round's lowest RTT showed a standing queue."""
        return (
            self.min_rtt_s is not None
            and self._round_min_rtt_s > self.min_rtt_s * QUEUE_RTT_FACTOR
            and self._round_min_rtt_s - self.min_rtt_s > RTT_ALLOWANCE_MIN_S
        )

    def _on_congestion(self, now: float) -> None:
        self.congestion_events += 1
        self._recovery_start = now
        if self.state != STARTUP:
            # Startup's excess is in flight, not in the model (a delivery rate never
            # overstates the bottleneck): Drain takes it out; cutting the model too left
            # a shallow-buffered path at a fraction of its rate for many ProbeBW cycles
            self._bw_samples = [(r, bw * LOSS_BETA) for r, bw in self._bw_samples]
            self.btl_bw_bps *= LOSS_BETA
        self._round_lost_packets = 0
        self._round_lost_bytes = 0
        self._round_acked_bytes = 0
        self._round_acked_packets = 0
        self._round_cruise_bytes = 0  # acked or lost, of packets sent cruising
        self._round_cruise_lost_bytes = 0
        if self.state == STARTUP:
            self.filled_pipe = True
            self.state = DRAIN
        self.congestion_window = min(self.congestion_window, self._ceiling())

    def _check_full_pipe(self, rate_bps: float) -> None:
        # once per round: did the bandwidth still grow by 25 %? (BBR §4.3.2.2)
        if self.round_count == self._full_bw_checked_round:
            return
        self._full_bw_checked_round = self.round_count
        if self.btl_bw_bps >= self._full_bw_bps * FULL_BW_GROWTH:
            self._full_bw_bps = self.btl_bw_bps
            self._full_bw_count = 0
            return
        self._full_bw_count += 1
        if self._full_bw_count >= FULL_BW_ROUNDS:
            self.filled_pipe = True
            self.state = DRAIN

    def _advance_state(self, now: float) -> None:
        min_rtt = self.min_rtt_s if self.min_rtt_s is not None else 0.0
        if self.state == DRAIN and self.bytes_in_flight <= self.bdp_bytes:
            self._enter_probe_bw(now)
        elif self.state == PROBE_BW:
            elapsed = now - self._phase_start > min_rtt
            gain = PROBE_BW_GAINS[self._phase]
            if elapsed or (gain < 1.0 and self.bytes_in_flight <= self.wire_bdp_bytes):
                self._phase = (self._phase + 1) % len(PROBE_BW_GAINS)
                self._phase_start = now
        elif self.state == PROBE_RTT:
            if self._probe_rtt_done_at is None:
                if self.bytes_in_flight <= self.target_window():
                    self._probe_rtt_done_at = now + PROBE_RTT_DURATION_S
                    self._probe_rtt_round = self.round_count + 1
            elif now >= self._probe_rtt_done_at and self.round_count >= self._probe_rtt_round:
                self._min_rtt_at = now
                self._enter_probe_bw(now)
                self.congestion_window = max(self.congestion_window, self._prior_cwnd)
                self._prior_cwnd = 0

    def _enter_probe_bw(self, now: float) -> None:
        self.state = PROBE_BW
        self._phase = PROBE_BW_START_PHASE
        self._phase_start = now

    def _enter_probe_rtt(self) -> None:
        self._prior_cwnd = max(self._prior_cwnd, self.congestion_window)
        self.state = PROBE_RTT
        self._probe_rtt_done_at = None

    def _ceiling(self) -> int:
        if self.state == STARTUP and not self.filled_pipe:
            return max(self.congestion_window, self.target_window())
        return self.target_window()

    def _set_window(self, acked_bytes: int) -> None:
        target = self.target_window()
        cwnd = self.congestion_window
        if self.state == STARTUP:
            # grow by what was acked, like slow start (BBR §4.2.3.6)
            if cwnd < target or self.delivered_bytes < self.initial_window:
                cwnd += acked_bytes
        else:
            cwnd = min(cwnd + acked_bytes, target)
        self.congestion_window = max(cwnd, self.min_window)


register_congestion_control(CONGESTION_CONTROL_NAME, WangateCongestionControl)
