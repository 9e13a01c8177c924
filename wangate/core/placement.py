"""When bulk bytes spread over the usable paths would all be delivered.

A path's finish time for ``n`` more bytes is::

    (queued + in flight + n) * 8 / rate + one-way delay

``earliest_finish_s`` is the earliest time T by which a backlog split over the usable
paths is all delivered, each path carrying what it can deliver by T (water-filling); a
path that cannot start delivering before T carries nothing. The scheduler's
earliest-completion-first rule compares one path's own finish time against this T of
the other paths. Down paths are never counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from wangate.core.estimator import PathEstimator
from wangate.core.states import PathStateKind
from wangate.errors import LocalProtocolError


@dataclass(frozen=True)
class BulkPathView:
    """What placement needs to know about one path at one moment."""

    name: str
    state: PathStateKind
    rate_bps: float
    one_way_delay_s: float
    queued_bytes: int = 0
    inflight_bytes: int = 0

    @property
    def backlog_bytes(self) -> int:
        return self.queued_bytes + self.inflight_bytes

    @property
    def start_s(self) -> float:
        """When a byte added now would start to arrive: after the backlog, plus the delay."""
        return self.backlog_bytes * 8 / self.rate_bps + self.one_way_delay_s

    def finish_s(self, size_bytes: int) -> float:
        return self.start_s + size_bytes * 8 / self.rate_bps


def bulk_view(
    name: str, estimator: PathEstimator, now: float, *, queued_bytes: int = 0
) -> BulkPathView:
    """A :class:`BulkPathView` from a path's estimator and the bytes queued for it."""
    return BulkPathView(
        name=name,
        state=estimator.state(now).kind,
        rate_bps=estimator.planning_rate_bps,
        one_way_delay_s=estimator.srtt_s / 2,
        queued_bytes=queued_bytes,
        inflight_bytes=estimator.bytes_in_flight,
    )


def _usable(paths: Sequence[BulkPathView]) -> list[BulkPathView]:
    names = [p.name for p in paths]
    if len(set(names)) != len(names):
        raise LocalProtocolError(f"path names are not unique: {names}")
    return [p for p in paths if p.state != PathStateKind.DOWN and 0 < p.rate_bps < math.inf]


def earliest_finish_s(paths: Sequence[BulkPathView], total_bytes: int) -> float:
    """The time T at which ``total_bytes`` spread over the usable paths is all delivered.

    Each path with start time s < T delivers (T - s) * rate / 8 bytes by T; T solves
    sum = total over the paths that start before T. math.inf when no path is usable.
    """
    if total_bytes < 0:
        raise LocalProtocolError(f"total_bytes {total_bytes} < 0")
    usable = sorted(_usable(paths), key=lambda p: p.start_s)
    if not usable:
        return math.inf
    # Add paths in order of start time while the next one starts before the current T.
    rate_sum_bps = 0.0
    weighted_start = 0.0
    finish_s = math.inf
    for path in usable:
        if path.start_s >= finish_s:
            break
        rate_sum_bps += path.rate_bps
        weighted_start += path.start_s * path.rate_bps
        finish_s = (total_bytes * 8 + weighted_start) / rate_sum_bps
    return finish_s
