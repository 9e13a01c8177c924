"""A path's capacity: the rate it delivered while it was kept busy, remembered across idle.

The delivery rate of ``PathEstimator`` (``rate_mbps``) is the highest sample over the last
10 s of wall time, which is what placement needs during a burst, but it forgets what a
path carried once 10 s pass with only light traffic (keep-alive probes, a collective's
small control messages), and its 50 ms samples can read a clump of acks above the link. Planning
shares needs what a path *can* carry, so this filter keeps its memory in **busy time**:

* A sample is *busy* when the sender kept the path full over the whole sample interval,
  i.e. it was not application-limited (the delivery-rate draft's rule,
  draft-cheng-iccrg-delivery-rate-estimation-02 §3.4, as BBR uses it: a sample taken while
  the application had nothing to send shows the application, not the path).
* The estimate is the maximum busy sample over the last ``window_busy_s`` seconds of busy
  time. Busy time advances only between consecutive busy samples (a gap longer than
  ``max_gap_s`` counts as ``max_gap_s``), so idle or lightly used time never ages the
  estimate: a path idle for an hour keeps it; a path that got slower shows its new rate
  after ``window_busy_s`` seconds of load at that rate.
* An application-limited sample above the estimate raises it (it proves at least that
  rate, BBR's rule) and ages like a busy sample taken at that busy time; one below is
  ignored.
* Samples come from acks (``on_acked``): acknowledged bytes over at least
  ``max(min_interval_s, 2 srtt)``. Longer than the 50 ms of ``rate_mbps``: acks come in
  clumps (one per 5 ms, or per 256 datagrams on a fast path), and over 50 ms one clump
  reads a tenth above the truth; over 0.5 s a hundredth.
  The interval is the longer of the acks' and the sends' (the newest acknowledged
  datagram's send time at either end), as the delivery-rate draft does (§3.3): a
  receiver that stalls and then acks at once, or a queue that drains, shortens the ack
  interval but not the send interval. In the lab, ack intervals alone read 5.5-7.1
  Mbit/s on 5 Mbit/s links.

Pure: samples come with ``now``; reading the estimate needs no clock.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from wangate.errors import LocalProtocolError

DEFAULT_WINDOW_BUSY_S: Final = 10.0
DEFAULT_MAX_GAP_S: Final = 0.5
DEFAULT_MIN_INTERVAL_S: Final = 0.5


class CapacityFilter:
    """Windowed max of delivery-rate samples over busy time (see the module's notes)."""

    def __init__(
        self,
        *,
        window_busy_s: float = DEFAULT_WINDOW_BUSY_S,
        max_gap_s: float = DEFAULT_MAX_GAP_S,
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
    ) -> None:
        if not window_busy_s > 0 or not max_gap_s > 0 or not min_interval_s > 0:
            raise LocalProtocolError("window_busy_s, max_gap_s and min_interval_s must be > 0")
        self._window_busy_s = window_busy_s
        self._max_gap_s = max_gap_s
        self._min_interval_s = min_interval_s
        # (ack time, acked bytes so far, send time of the newest datagram acked so far)
        self._acks: deque[tuple[float, int, float]] = deque()
        self._busy_s = 0.0  # busy time so far
        self._last_busy_at: float | None = None  # the previous busy sample's time
        # (busy time, rate) with rates strictly decreasing from left to right
        self._max: deque[tuple[float, float]] = deque()

    @property
    def capacity_bps(self) -> float:
        """The estimate in bits per second; 0.0 before any sample."""
        return self._max[0][1] if self._max else 0.0

    @property
    def busy_s(self) -> float:
        """Seconds of busy time seen so far."""
        return self._busy_s

    def on_acked(
        self, acked_bytes: int, now: float, *, sent_at: float, srtt_s: float, busy_from: float
    ) -> None:
        """An ack brought the path's acknowledged bytes to ``acked_bytes``; the newest
        datagram acknowledged so far was sent at ``sent_at``; what is acked from
        ``busy_from`` on was sent while the sender kept the path busy (``inf``: not yet).
        Takes a sample when one interval of acks is known."""
        acks = self._acks
        if acks and acks[-1][0] == now:
            acks.pop()  # the datagrams of one ack come together: one entry per ack
        acks.append((now, acked_bytes, sent_at))
        cutoff = now - max(self._min_interval_s, 2 * srtt_s)
        # keep exactly one entry at or before the cutoff: the start of the next sample
        while len(acks) >= 2 and acks[1][0] <= cutoff:
            acks.popleft()
        start_at, start_bytes, start_sent_at = acks[0]
        if start_at > cutoff:
            return
        interval_s = max(now - start_at, sent_at - start_sent_at)
        rate_bps = (acked_bytes - start_bytes) * 8 / interval_s
        self.on_sample(rate_bps, now, app_limited=busy_from > start_at)

    def on_sample(self, rate_bps: float, now: float, *, app_limited: bool) -> None:
        if not rate_bps >= 0:
            raise LocalProtocolError(f"rate sample {rate_bps!r} < 0")
        if app_limited:
            self._last_busy_at = None  # the next busy sample starts a new busy period
            if rate_bps > self.capacity_bps:
                self._push(rate_bps)
            return
        if self._last_busy_at is not None:
            self._busy_s += min(max(0.0, now - self._last_busy_at), self._max_gap_s)
        self._last_busy_at = now
        self._push(rate_bps)

    def _push(self, rate_bps: float) -> None:
        rates = self._max
        while rates and rates[-1][1] <= rate_bps:
            rates.pop()
        rates.append((self._busy_s, rate_bps))
        while rates[0][0] < self._busy_s - self._window_busy_s:
            rates.popleft()
