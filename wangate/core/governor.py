"""Bulk yields the gateways' CPU while critical traffic flows.

A gateway's CPU, not a link, is often what saturates first: one Python core moves about
150 Mbit/s of QUIC. When the sending or the receiving gateway is busy, every datagram
waits in socket buffers and behind other callbacks, and a critical message waits with
them: in the lab (2 cores for both gateways), saturating bulk added 8-17 ms to every
path's RTT, and critical messages took twice their network time.

That delay is common to all paths, while a network queue belongs to one path; so the
smallest queueing delay (smoothed RTT minus min RTT) over the usable paths is read as
the hosts' delay. While critical traffic flows, bulk is paced by a token bucket whose
rate follows AIMD on that signal, once per ``interval_s``: above ``target_delay_s`` it is
cut by ``decrease``, below it grows by ``increase_fraction``. Without critical traffic bulk
is not limited at all. A token bucket (not a window) because the cost being controlled is
CPU per datagram, whatever path it takes.

It is off unless configured (``[critical] host_delay_target_ms``): when critical and bulk
gradients belong to the same training step, the step ends with its last bulk byte, and
slowing bulk makes it slower (bench/RESULTS.md has both sides of the trade).

Pure: time comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable

from wangate.core.estimator import PathEstimator


def common_delay_s(estimators: Iterable[PathEstimator]) -> float | None:
    """The smallest queueing delay over the given paths; None without any."""
    delays = [est.srtt_s - est.min_rtt_s for est in estimators]
    return max(0.0, min(delays)) if delays else None


class BulkGovernor:
    def __init__(
        self,
        *,
        target_delay_s: float = 0.008,
        interval_s: float = 0.05,
        decrease: float = 0.85,
        increase_fraction: float = 0.05,
        min_rate_bps: float = 4e6,
        burst_s: float = 0.005,
    ) -> None:
        self.target_delay_s = target_delay_s
        self.interval_s = interval_s
        self.decrease = decrease
        self.increase_fraction = increase_fraction
        self.min_rate_bps = min_rate_bps
        self.burst_s = burst_s
        self.rate_bps: float | None = None  # None: bulk is not limited
        self.cuts = 0  # times the rate was cut (for status and tests)
        self._tokens_bytes = 0.0
        self._refilled_at = 0.0
        self._window_start = 0.0
        self._window_bytes = 0
        self.next_update_at = 0.0

    def update(self, now: float, delay_s: float | None, critical_active: bool) -> None:
        """Once per interval: adjust the bulk rate to the hosts' delay."""
        if now < self.next_update_at:
            return
        elapsed_s = now - self._window_start
        # a window with idle time in it does not show what bulk can get
        measured = 0.0 < elapsed_s <= 2 * self.interval_s
        sent_bps = self._window_bytes * 8 / elapsed_s if measured else 0.0
        self._window_start, self._window_bytes = now, 0
        self.next_update_at = now + self.interval_s
        if not critical_active or delay_s is None:
            self.rate_bps = None
            return
        if self.rate_bps is None:
            if delay_s <= self.target_delay_s or not measured:
                return
            # start from what bulk really got, not from a rate it never reached
            self._set_rate(now, sent_bps)
        assert self.rate_bps is not None
        if delay_s > self.target_delay_s:
            self._set_rate(now, self.rate_bps * self.decrease)
            self.cuts += 1
        else:
            self._set_rate(now, self.rate_bps * (1.0 + self.increase_fraction))

    def _set_rate(self, now: float, rate_bps: float) -> None:
        self._refill(now)
        self.rate_bps = max(rate_bps, self.min_rate_bps)

    def _refill(self, now: float) -> None:
        if self.rate_bps is not None and now > self._refilled_at:
            cap = self.rate_bps / 8 * self.burst_s
            gained = (now - self._refilled_at) * self.rate_bps / 8
            self._tokens_bytes = min(cap, self._tokens_bytes + gained)
        self._refilled_at = now

    def allows(self, now: float) -> bool:
        """May a bulk piece go now? (One piece may overdraw the bucket.)"""
        if self.rate_bps is None:
            return True
        self._refill(now)
        return self._tokens_bytes > 0.0

    def on_bulk_sent(self, size_bytes: int) -> None:
        self._window_bytes += size_bytes
        if self.rate_bps is not None:
            self._tokens_bytes -= size_bytes

    def next_allowed_at(self) -> float | None:
        """When a blocked bulk piece may go; None when nothing is blocked."""
        if self.rate_bps is None or self._tokens_bytes > 0.0:
            return None
        return self._refilled_at + -self._tokens_bytes * 8 / self.rate_bps + 1e-4
