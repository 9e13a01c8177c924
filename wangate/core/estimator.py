"""What one WAN path delivers right now: RTT, jitter, loss, delivery rate, up/degraded/down.

Pure: the transport reports what happened on the path (sent, acked, lost, RTT and one-way
transit samples, anything heard) with the time ``now`` in seconds; nothing here reads a
clock. Sliding windows end at the latest sample of their kind, so reading a property never
needs ``now``.

RTT follows RFC 9002 §5 (srtt/rttvar smoothing, ack-delay adjustment), except that
``min_rtt_s`` is a minimum over the last ``window_s`` seconds rather than over the
connection's lifetime, so a path whose route changed settles on its new baseline.
Jitter is the RFC 3550 §6.4.1 interarrival jitter over our own datagram timestamps.

Delivery rate (``delivery_rate_bps``, bits per second): each ack yields a sample
``bytes acked since the ack at least one interval ago / time since then``, with
interval = max(srtt, ``rate_min_interval_s``) so that acks arriving in a clump cannot
fake a high rate. The estimate is the maximum sample over the last ``rate_window_s``
seconds (a BBR-like max filter): while the path is idle or lightly used it keeps the rate
it showed when busy, which is what placement needs at the start of the next gradient
burst. A path that slows down shows it through growing ``bytes_in_flight`` long before the
filter forgets.

Capacity (``capacity_bps``): a ``CapacityFilter`` fed the same acks, which keeps only
samples taken while the sender kept the path busy, over longer intervals, and remembers
them over busy time, not wall time (``wangate.core.capacity``). The sender says when it
had nothing to send (``on_app_limited``); a sample is busy when everything in flight at
that moment had been acknowledged and what the acks of the sample's interval cover was
sent after that (one srtt before the interval began), as the delivery-rate draft marks
packets sent while app-limited.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Final

from wangate.core.capacity import CapacityFilter
from wangate.core.states import PathStateKind
from wangate.errors import LocalProtocolError

_DELIVERED, _LOST, _BURST_LOST = 0, 1, 2
# Random loss of a few percent seldom loses 3 in a row (2 % loss: 1 run in 2500 losses).
FEC_BURST_LOSSES: Final = 3
_JITTER_KEEP: Final = 15 / 16  # of the jitter estimate per transit sample (RFC 3550 §6.4.1)


@dataclass(frozen=True)
class PathState:
    """A path's health at one moment, with the reason a person reads in ``wangate paths``."""

    kind: PathStateKind
    reason: str


class PathEstimator:
    """Measurements of one path, fed by the transport, read by the schedulers and the CLI.

    State rules, evaluated in this order by :meth:`state`:

    * **down** when nothing was ever heard, or nothing was heard for longer than
      ``max(silence_rtts * srtt + 4 * rttvar, min_silence_s)``. With the defaults (3 RTTs,
      0.5 s) a silent 80 ms path is down after 0.5 s and a silent 300 ms path after about
      1 s; the 0.5 s floor is five missed 100 ms keep-alive probes, so an idle but healthy
      link does not flap.
    * **degraded** when the last ``burst_losses`` datagrams in a row were lost (a loss
      burst, seen long before the loss window fills); or ``loss_rate > loss_degraded``
      over at least ``min_loss_samples`` outcomes; or ``srtt > rtt_degraded_factor *
      max(min_rtt, rtt_degraded_floor_s)``. The floor (10 ms) keeps the rule about the
      path: below it an RTT measures mostly the two gateways' scheduling (a busy host
      adds several milliseconds to a loopback or LAN path's 0.1 ms), so a short path is
      judged as if it were 10 ms long; a WAN path's longer minimum is unaffected.
    * **up** otherwise.
    """

    def __init__(
        self,
        *,
        window_s: float = 10.0,
        loss_window_packets: int = 1000,
        initial_rtt_s: float = 0.1,
        rate_window_s: float = 10.0,
        rate_min_interval_s: float = 0.05,
        rate_floor_bps: float = 1e6,
        rtt_history_max: int = 10_000,
        silence_rtts: float = 3.0,
        min_silence_s: float = 0.5,
        rtt_degraded_factor: float = 3.0,
        rtt_degraded_floor_s: float = 0.010,
        loss_degraded: float = 0.05,
        min_loss_samples: int = 100,
        burst_losses: int = 4,
    ) -> None:
        if window_s <= 0 or rate_window_s <= 0 or initial_rtt_s <= 0:
            raise LocalProtocolError("window_s, rate_window_s and initial_rtt_s must be > 0")
        if loss_window_packets < 1 or rtt_history_max < 1 or burst_losses < 1:
            raise LocalProtocolError(
                "loss_window_packets, rtt_history_max and burst_losses must be >= 1"
            )
        if rate_floor_bps <= 0:
            raise LocalProtocolError("rate_floor_bps must be > 0")
        self._window_s = window_s
        self._initial_rtt_s = initial_rtt_s
        self._rate_window_s = rate_window_s
        self._rate_min_interval_s = rate_min_interval_s
        self._rate_floor_bps = rate_floor_bps
        self._silence_rtts = silence_rtts
        self._min_silence_s = min_silence_s
        self._rtt_degraded_factor = rtt_degraded_factor
        self._rtt_degraded_floor_s = rtt_degraded_floor_s
        self._loss_degraded = loss_degraded
        self._min_loss_samples = min_loss_samples
        self._burst_losses = burst_losses

        # RTT (RFC 9002 §5.2-5.3; §6.2.2 for the initial rttvar).
        self._rtt_samples = 0
        self._srtt_s = initial_rtt_s
        self._rttvar_s = initial_rtt_s / 2
        self._latest_rtt_s = initial_rtt_s
        # Windowed min: (time, rtt) with rtt strictly increasing from left to right.
        self._min_filter: deque[tuple[float, float]] = deque()
        # Every sample in the window, for the p99; sorted copy cached until the next sample.
        self._rtt_history: deque[tuple[float, float]] = deque(maxlen=rtt_history_max)
        self._rtt_sorted: list[float] | None = None

        # Jitter (RFC 3550 §6.4.1).
        self._last_transit_s: float | None = None
        self._jitter_s = 0.0

        # Loss: outcome of the last loss_window_packets datagrams: _DELIVERED, _LOST, or
        # _BURST_LOST (one of a run of at least ``fec_burst_losses``).
        self._outcomes: deque[int] = deque(maxlen=loss_window_packets)
        self._lost_in_window = 0
        self._burst_lost_in_window = 0
        self._consecutive_losses = 0

        # Delivery rate: (ack time, cumulative acked bytes) and a max filter of samples.
        self._ack_history: deque[tuple[float, int]] = deque()
        self._rate_filter: deque[tuple[float, float]] = deque()
        # App-limited (delivery-rate draft §3.4): acked bytes that end the current
        # app-limited period (0: none), and from when acks are of busy sends again.
        self._app_limited_until = 0
        self._busy_from = -math.inf
        self._newest_acked_sent_at = -math.inf
        self._capacity = CapacityFilter()

        self._bytes_in_flight = 0
        self._sent_bytes = 0
        self._acked_bytes = 0
        self._lost_bytes = 0
        self._last_heard_at: float | None = None

    # ---- inputs -------------------------------------------------------------------------

    def on_sent(self, size_bytes: int, now: float) -> None:
        _check_size(size_bytes)
        self._sent_bytes += size_bytes
        self._bytes_in_flight += size_bytes

    def on_acked(
        self, size_bytes: int, now: float, *, sent_at: float | None = None, datagrams: int = 1
    ) -> None:
        """``size_bytes`` acknowledged in ``datagrams`` datagrams (one ack's: the rate
        samples of an ack are taken once, at its end), the newest sent at ``sent_at``
        (unknown: ``now``)."""
        _check_size(size_bytes)
        sent = now if sent_at is None else sent_at
        if sent > self._newest_acked_sent_at:
            self._newest_acked_sent_at = sent
        self._acked_bytes += size_bytes
        # Clamped: a duplicate report must not drive the count negative and wedge placement.
        self._bytes_in_flight = max(0, self._bytes_in_flight - size_bytes)
        self._record_delivered(datagrams)
        self._consecutive_losses = 0
        if self._app_limited_until and self._acked_bytes > self._app_limited_until:
            self._app_limited_until = 0
            self._busy_from = now + self._srtt_s
        self._sample_rate(now)
        busy_from = math.inf if self._app_limited_until else self._busy_from
        self._capacity.on_acked(
            self._acked_bytes,
            now,
            sent_at=self._newest_acked_sent_at,
            srtt_s=self._srtt_s,
            busy_from=busy_from,
        )

    def on_app_limited(self, now: float) -> None:
        """The sender could have sent on this path and had nothing for it: rate samples
        stay app-limited until what is in flight now has been acknowledged."""
        self._app_limited_until = max(self._acked_bytes + self._bytes_in_flight, 1)

    def on_lost(self, size_bytes: int, now: float) -> None:
        _check_size(size_bytes)
        self._lost_bytes += size_bytes
        self._bytes_in_flight = max(0, self._bytes_in_flight - size_bytes)
        self._consecutive_losses += 1
        self._record_outcome(lost=True)

    def on_abandoned(self, size_bytes: int, now: float) -> None:
        """In flight when the path went down: no longer in flight, but no loss sample.

        An outage is reported by the state (down); counting what it swallowed as loss
        would make the path look bursty for a whole loss window after it came back.
        """
        _check_size(size_bytes)
        self._bytes_in_flight = max(0, self._bytes_in_flight - size_bytes)

    def forget_losses(self) -> None:
        """The path went down: the losses that led up to it were the outage, not the
        path's loss rate, and must not keep it degraded once it is back."""
        self._outcomes.clear()
        self._lost_in_window = 0
        self._burst_lost_in_window = 0
        self._consecutive_losses = 0

    def on_spurious_loss(self, size_bytes: int, now: float) -> None:
        """A datagram reported lost was acknowledged after all: take the loss back.

        The newest loss still in the window is turned into a delivery (which loss it
        was does not change the rate); bytes count as acked, not lost.
        """
        _check_size(size_bytes)
        self._lost_bytes = max(0, self._lost_bytes - size_bytes)
        self._acked_bytes += size_bytes
        self._consecutive_losses = 0
        outcomes = self._outcomes
        for i in range(len(outcomes) - 1, -1, -1):
            if outcomes[i] != _DELIVERED:
                if outcomes[i] == _BURST_LOST:
                    self._burst_lost_in_window -= 1
                outcomes[i] = _DELIVERED
                self._lost_in_window -= 1
                break

    def on_rtt_sample(self, rtt_s: float, now: float, *, ack_delay_s: float = 0.0) -> None:
        """One RTT measurement; ``ack_delay_s`` is the delay the receiver reported."""
        if not rtt_s >= 0 or not ack_delay_s >= 0:
            raise LocalProtocolError(f"RTT sample {rtt_s!r} / ack delay {ack_delay_s!r} < 0")
        self._latest_rtt_s = rtt_s
        self._push_min(rtt_s, now)
        self._rtt_history.append((now, rtt_s))
        while self._rtt_history[0][0] < now - self._window_s:
            self._rtt_history.popleft()
        self._rtt_sorted = None
        if self._rtt_samples == 0:
            # RFC 9002 §5.3: the first sample initialises both estimators.
            self._srtt_s = rtt_s
            self._rttvar_s = rtt_s / 2
        else:
            # RFC 9002 §5.3: subtract the ack delay unless that would go below min_rtt.
            adjusted_s = rtt_s
            if rtt_s >= self.min_rtt_s + ack_delay_s:
                adjusted_s = rtt_s - ack_delay_s
            # Written as increments so that a constant input leaves srtt exactly unchanged.
            self._rttvar_s += (abs(self._srtt_s - adjusted_s) - self._rttvar_s) / 4
            self._srtt_s += (adjusted_s - self._srtt_s) / 8
        self._rtt_samples += 1

    def on_transit_sample(self, transit_s: float, now: float) -> None:
        """Receive time minus the sender's timestamp; only differences between samples count."""
        if self._last_transit_s is not None:
            d_s = transit_s - self._last_transit_s
            self._jitter_s += (abs(d_s) - self._jitter_s) / 16  # RFC 3550 §6.4.1
        self._last_transit_s = transit_s

    def on_transit_run(self, count: int, jitter_s: float, last_transit_s: float) -> None:
        """``count`` more samples, all arriving at once after the last one: the RFC 3550
        filter run over their differences from 0 gave ``jitter_s``; the newest sample
        is ``last_transit_s`` (see ``place_shards``)."""
        self._jitter_s = self._jitter_s * _JITTER_KEEP**count + jitter_s
        self._last_transit_s = last_transit_s

    def on_heard(self, now: float) -> None:
        if self._last_heard_at is None or now > self._last_heard_at:
            self._last_heard_at = now

    # ---- read-only measurements ---------------------------------------------------------

    @property
    def rtt_samples(self) -> int:
        return self._rtt_samples

    @property
    def srtt_s(self) -> float:
        return self._srtt_s

    @property
    def rttvar_s(self) -> float:
        return self._rttvar_s

    @property
    def min_rtt_s(self) -> float:
        """Minimum RTT over the last ``window_s`` seconds (``initial_rtt_s`` before any)."""
        return self._min_filter[0][1] if self._min_filter else self._initial_rtt_s

    @property
    def rtt_p99_s(self) -> float:
        """Nearest-rank 99th percentile of RTT samples in the window."""
        if not self._rtt_history:
            return self._initial_rtt_s
        if self._rtt_sorted is None:
            self._rtt_sorted = sorted(rtt for _, rtt in self._rtt_history)
        rank = math.ceil(0.99 * len(self._rtt_sorted))
        return self._rtt_sorted[rank - 1]

    @property
    def latest_rtt_s(self) -> float:
        return self._latest_rtt_s

    @property
    def jitter_s(self) -> float:
        return self._jitter_s

    @property
    def loss_rate(self) -> float:
        """Fraction lost among the last ``loss_window_packets`` outcomes (0.0 before any)."""
        if not self._outcomes:
            return 0.0
        return self._lost_in_window / len(self._outcomes)

    @property
    def random_loss_rate(self) -> float:
        """``loss_rate`` without losses in runs of ``FEC_BURST_LOSSES`` or more.

        What FEC is sized for. A run is a queue overflowing (our own startup, a
        competing flow) or an outage: a repair symbol or two per block cannot rebuild
        it, and paying for them on every block would cost more than the selective
        repair that does.
        """
        if not self._outcomes:
            return 0.0
        return (self._lost_in_window - self._burst_lost_in_window) / len(self._outcomes)

    @property
    def loss_samples(self) -> int:
        return len(self._outcomes)

    @property
    def consecutive_losses(self) -> int:
        return self._consecutive_losses

    @property
    def delivery_rate_bps(self) -> float:
        """Max delivery-rate sample over the last ``rate_window_s``; 0.0 before any."""
        return self._rate_filter[0][1] if self._rate_filter else 0.0

    @property
    def capacity_bps(self) -> float:
        """What the path delivered while kept busy, over busy time (``CapacityFilter``);
        0.0 before any sample."""
        return self._capacity.capacity_bps

    @property
    def planning_rate_bps(self) -> float:
        """The rate schedulers plan with: measured, but never below ``rate_floor_bps``.

        The floor lets a path that has carried only probes still win work when the others
        back up; the work it then carries measures its real rate.
        """
        return max(self.delivery_rate_bps, self._rate_floor_bps)

    @property
    def bytes_in_flight(self) -> int:
        return self._bytes_in_flight

    @property
    def sent_bytes(self) -> int:
        return self._sent_bytes

    @property
    def acked_bytes(self) -> int:
        return self._acked_bytes

    @property
    def lost_bytes(self) -> int:
        return self._lost_bytes

    # ---- judgements ---------------------------------------------------------------------

    @property
    def last_heard_at(self) -> float | None:
        """When anything was last heard from the peer on this path (None: never)."""
        return self._last_heard_at

    def silence_timeout_s(self) -> float:
        """How long the path may stay silent before it counts as down."""
        return max(self._silence_rtts * self._srtt_s + 4 * self._rttvar_s, self._min_silence_s)

    def state(self, now: float) -> PathState:
        if self._last_heard_at is None:
            return PathState(PathStateKind.DOWN, "never heard from peer")
        silent_s = now - self._last_heard_at
        if silent_s > self.silence_timeout_s():
            return PathState(PathStateKind.DOWN, f"silent for {silent_s:.3g} s")
        if self._consecutive_losses >= self._burst_losses:
            return PathState(
                PathStateKind.DEGRADED, f"loss burst: {self._consecutive_losses} in a row"
            )
        if self.loss_samples >= self._min_loss_samples and self.loss_rate > self._loss_degraded:
            return PathState(
                PathStateKind.DEGRADED,
                f"loss {self.loss_rate * 100:.1f}% > {self._loss_degraded * 100:g}%"
                f" over {self.loss_samples} datagrams",
            )
        if self._rtt_samples:
            srtt, min_rtt = self._srtt_s, self.min_rtt_s
            base = max(min_rtt, self._rtt_degraded_floor_s)
            if srtt > self._rtt_degraded_factor * base:
                if base == min_rtt:
                    what = f"min {min_rtt * 1e3:.0f} ms"
                else:
                    what = f"the {base * 1e3:.0f} ms floor (min {min_rtt * 1e3:.1f} ms)"
                return PathState(
                    PathStateKind.DEGRADED,
                    f"srtt {srtt * 1e3:.0f} ms > {self._rtt_degraded_factor:g}x {what}",
                )
        return PathState(PathStateKind.UP, "ok")

    def expected_delivery_s(self, size_bytes: int, queued_bytes: int, now: float) -> float:
        """When ``size_bytes`` sent behind ``queued_bytes`` would arrive, from now.

        (queued + in flight + size) at the planning rate, plus a one-way delay of srtt/2.
        """
        backlog_bytes = queued_bytes + self._bytes_in_flight + size_bytes
        return backlog_bytes * 8 / self.planning_rate_bps + self._srtt_s / 2

    def snapshot(self, now: float) -> dict[str, float | int | str]:
        """The row ``wangate paths --json`` shows for this path."""
        state = self.state(now)
        return {
            "srtt_ms": self._srtt_s * 1e3,
            "min_rtt_ms": self.min_rtt_s * 1e3,
            "rtt_p99_ms": self.rtt_p99_s * 1e3,
            "jitter_ms": self._jitter_s * 1e3,
            "loss": self.loss_rate,
            "loss_samples": self.loss_samples,
            "rate_mbps": self.delivery_rate_bps / 1e6,
            "capacity_mbps": self.capacity_bps / 1e6,
            "inflight_bytes": self._bytes_in_flight,
            "sent_bytes": self._sent_bytes,
            "acked_bytes": self._acked_bytes,
            "lost_bytes": self._lost_bytes,
            "state": state.kind,
            "state_reason": state.reason,
        }

    # ---- internals ----------------------------------------------------------------------

    def _push_min(self, rtt_s: float, now: float) -> None:
        while self._min_filter and self._min_filter[-1][1] >= rtt_s:
            self._min_filter.pop()
        self._min_filter.append((now, rtt_s))
        while self._min_filter[0][0] < now - self._window_s:
            self._min_filter.popleft()

    def _record_delivered(self, count: int) -> None:
        """``_record_outcome(lost=False)``, ``count`` times: the window's oldest outcomes
        leave (only losses among them are uncounted), as many deliveries come in."""
        outcomes = self._outcomes
        maxlen = outcomes.maxlen
        assert maxlen is not None
        leaving = min(len(outcomes) + count - maxlen, len(outcomes))
        if leaving > 0 and self._lost_in_window:
            for outcome in itertools.islice(outcomes, leaving):
                if outcome != _DELIVERED:
                    self._lost_in_window -= 1
                    if outcome == _BURST_LOST:
                        self._burst_lost_in_window -= 1
        outcomes.extend([_DELIVERED] * min(count, maxlen))

    def _record_outcome(self, *, lost: bool) -> None:
        outcomes = self._outcomes
        if len(outcomes) == outcomes.maxlen and outcomes[0] != _DELIVERED:
            self._lost_in_window -= 1
            if outcomes[0] == _BURST_LOST:
                self._burst_lost_in_window -= 1
        if not lost:
            outcomes.append(_DELIVERED)
            return
        self._lost_in_window += 1
        run = self._consecutive_losses
        if run < FEC_BURST_LOSSES:
            outcomes.append(_LOST)
            return
        outcomes.append(_BURST_LOST)
        self._burst_lost_in_window += 1
        if run == FEC_BURST_LOSSES:  # the run's earlier losses were counted as random
            for i in range(2, min(run, len(outcomes)) + 1):
                if outcomes[-i] == _LOST:
                    outcomes[-i] = _BURST_LOST
                    self._burst_lost_in_window += 1

    def _sample_rate(self, now: float) -> None:
        history = self._ack_history
        history.append((now, self._acked_bytes))
        cutoff = now - max(self._srtt_s, self._rate_min_interval_s)
        # Keep exactly one entry at or before the cutoff: the start of the next sample.
        while len(history) >= 2 and history[1][0] <= cutoff:
            history.popleft()
        start_at, start_bytes = history[0]
        if start_at > cutoff:
            return  # not one interval of history yet
        rate_bps = (self._acked_bytes - start_bytes) * 8 / (now - start_at)
        rates = self._rate_filter
        while rates and rates[-1][1] <= rate_bps:
            rates.pop()
        rates.append((now, rate_bps))
        while rates[0][0] < now - self._rate_window_s:
            rates.popleft()


def _check_size(size_bytes: int) -> None:
    if size_bytes < 0:
        raise LocalProtocolError(f"datagram size {size_bytes} < 0")
