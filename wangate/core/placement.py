"""Where bulk bytes go: the path (or the split over paths) that finishes earliest.

A path's finish time for ``n`` more bytes is::

    (queued + in flight + n) * 8 / rate + one-way delay

``choose_bulk_path`` gives a whole shard to the path that finishes it first, so a slow
path only gets a shard when the fast ones are backed up enough that it finishes sooner.
``plan_shares`` splits a message so that every path carrying part of it finishes at the
same earliest time T (water-filling); a path that cannot start delivering before T gets
nothing, so a message never waits on a slow path. Down paths are never used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from wangate.core.estimator import PathEstimator, PathStateKind
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
    return [p for p in paths if p.state != "down" and 0 < p.rate_bps < math.inf]


def choose_bulk_path(paths: Sequence[BulkPathView], size_bytes: int) -> str | None:
    """The usable path that finishes ``size_bytes`` first; ties go to the earlier one listed.

    None when every path is down.
    """
    if size_bytes < 0:
        raise LocalProtocolError(f"size_bytes {size_bytes} < 0")
    best: BulkPathView | None = None
    best_finish_s = math.inf
    for path in _usable(paths):
        finish_s = path.finish_s(size_bytes)
        if best is None or finish_s < best_finish_s:
            best, best_finish_s = path, finish_s
    return None if best is None else best.name


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


def plan_shares(
    paths: Sequence[BulkPathView], total_bytes: int, *, unit_bytes: int = 1
) -> dict[str, int]:
    """Split ``total_bytes`` over the usable paths so that all finish together, earliest.

    Shares are whole multiples of ``unit_bytes`` (a shard), except that when
    ``total_bytes`` is not a multiple the largest share carries the short last unit. The
    shares sum to ``total_bytes``; only paths with a positive share appear. Empty when no
    path is usable or ``total_bytes`` is 0.

    Ideal shares are rounded down to whole units; each remaining unit (fewer than the
    number of paths) then goes to the path that would finish it first.
    """
    if unit_bytes < 1:
        raise LocalProtocolError(f"unit_bytes {unit_bytes} < 1")
    finish_s = earliest_finish_s(paths, total_bytes)
    if total_bytes == 0 or math.isinf(finish_s):
        return {}
    total_units = -(-total_bytes // unit_bytes)
    units: dict[str, int] = {}
    usable = _usable(paths)
    for path in usable:
        ideal_bytes = max(0.0, (finish_s - path.start_s) * path.rate_bps / 8)
        units[path.name] = math.floor(ideal_bytes / unit_bytes)
    # Float rounding can overshoot by a unit at most; trim from the latest finisher.
    by_name = {p.name: p for p in usable}

    def finish_with(name: str, extra_units: int) -> float:
        return by_name[name].finish_s((units[name] + extra_units) * unit_bytes)

    while sum(units.values()) > total_units:
        latest = max((n for n in units if units[n] > 0), key=lambda n: finish_with(n, 0))
        units[latest] -= 1
    for _ in range(total_units - sum(units.values())):
        first = min(units, key=lambda n: finish_with(n, 1))
        units[first] += 1
    shares = {name: count * unit_bytes for name, count in units.items() if count > 0}
    shortfall = total_units * unit_bytes - total_bytes
    if shortfall:
        largest = max(shares, key=lambda n: shares[n])
        shares[largest] -= shortfall
    return shares
