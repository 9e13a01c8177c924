"""Which path carries what: critical pieces on the selected path, bulk where it finishes first.

The session pulls work for a path when that path can send; the scheduler answers
whether the path should take critical work (it is the critical route, or there is none),
whether it should carry duplicates of critical pieces (it is the backup of a lossy
route), and whether a bulk piece is better off on it than left to the other paths.

Bulk placement is earliest-completion-first in its pull form (ECF, Lim et al.,
CoNEXT 2017): a path takes a bulk piece only if the piece would arrive on it no later
than the other paths together would finish all the bulk work still queued. Near the end
of a message, a slow path therefore steps aside instead of making the message wait.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Final

from wangate.core.estimator import PathEstimator
from wangate.core.events import RouteChanged
from wangate.core.outbound_message import Piece
from wangate.core.placement import bulk_view, earliest_finish_s
from wangate.core.selector import CriticalPathSelector, PathView, critical_view
from wangate.core.states import PathStateKind

SELECT_INTERVAL_S: Final = 0.05  # how often the critical route is reconsidered while it is used
# ... and while no critical data flows (a bulk worker never has any): the route then only
# shows in ``paths``; a critical message reconsiders it before it is routed, and a path
# whose state changes at once.
IDLE_SELECT_INTERVAL_S: Final = 1.0
# While critical traffic flows, bulk stays off the critical route whenever its RTT shows
# a queue of more than this (or a quarter of its min RTT): critical data must not wait
# behind our own bulk in the network, where we cannot reorder it.
CRITICAL_QUEUE_S: Final = 0.002
CRITICAL_ACTIVE_S: Final = 1.0  # critical traffic "flows" this long after a critical message
CRITICAL_PROBE_BYTES: Final = 1200
MAX_DUPLICATES: Final = 256  # duplicate pieces waiting for the backup path


class PathScheduler:
    def __init__(self, selector: CriticalPathSelector | None = None) -> None:
        self.selector = selector or CriticalPathSelector()
        self.duplicates: deque[Piece] = deque()
        self.last_change: RouteChanged | None = None
        self.next_select_at = 0.0
        self.selected_at = -math.inf

    # ------------------------------------------------------------- critical

    def update(
        self,
        now: float,
        estimators: Mapping[str, PathEstimator],
        open_paths: set[str],
        interval_s: float = SELECT_INTERVAL_S,
    ) -> RouteChanged | None:
        """Reconsider the critical route (next in ``interval_s``); returns the change."""
        self.selected_at = now
        self.next_select_at = now + interval_s
        views: dict[str, PathView] = {}
        for name, estimator in estimators.items():
            view = critical_view(estimator, now, size_bytes=CRITICAL_PROBE_BYTES)
            if name not in open_paths:
                view = PathView(math.inf, PathStateKind.DOWN, view.loss_rate, "not connected")
            views[name] = view
        change = self.selector.update(now, views)
        if change is not None:
            self.last_change = change
            self.duplicates.clear()
        return change

    def takes_critical(self, path: str, usable: Mapping[str, bool]) -> bool:
        route = self.critical_route(usable)
        return route is None or route == path

    def critical_route(self, usable: Mapping[str, bool]) -> str | None:
        """The path critical work goes on; None when there is none usable (then any)."""
        current = self.selector.current
        return current if current is not None and usable.get(current, False) else None

    def duplicate_target(self) -> str | None:
        if not self.selector.needs_duplicate():
            return None
        return self.selector.secondary()

    def offer_duplicate(self, piece: Piece) -> None:
        if self.duplicate_target() is not None and len(self.duplicates) < MAX_DUPLICATES:
            self.duplicates.append(piece)

    def take_duplicate(
        self, path: str, allowed: Callable[[str, str | None], bool] | None = None
    ) -> Piece | None:
        """A copy for ``path``; ``allowed(job, path)``: whether the job may use it."""
        if not self.duplicates or self.duplicate_target() != path:
            return None
        while self.duplicates:
            piece = self.duplicates.popleft()
            if allowed is not None and not allowed(piece.message.job, path):
                continue  # its job may not use this path (its policy changed)
            if piece.message.acked.first_gap(piece.start, piece.end) is not None:
                # a copy: it must not count twice in its FEC block's bookkeeping
                return replace(piece, block=-1, symbol=-1)
        return None

    def role(self, path: str) -> str:
        if self.selector.current == path:
            return "critical"
        if self.duplicate_target() == path:
            return "backup"
        return "bulk"

    # ----------------------------------------------------------------- bulk

    def _keeps_bulk_off(
        self, path: str, estimators: Mapping[str, PathEstimator], usable: Mapping[str, bool]
    ) -> bool:
        """While critical traffic flows: ``path`` is the critical route, its RTT shows a
        queue, and another path can take the bulk."""
        if path != self.selector.current:
            return False
        mine = estimators[path]
        queue_s = mine.srtt_s - mine.min_rtt_s
        others_usable = any(ok for n, ok in usable.items() if n != path)
        return others_usable and queue_s > max(CRITICAL_QUEUE_S, mine.min_rtt_s / 4)

    def bulk_helps(
        self,
        path: str,
        estimators: Mapping[str, PathEstimator],
        usable: Mapping[str, bool],
        backlog_bytes: int,
        piece_bytes: int,
        now: float,
        critical_active: bool = False,
    ) -> bool:
        if critical_active and self._keeps_bulk_off(path, estimators, usable):
            return False
        # A critical route that keeps bulk off is no alternative: deferring to it would
        # hold the end of a message until critical traffic stops.
        others = [
            name
            for name in estimators
            if name != path
            and usable.get(name, False)
            and not (critical_active and self._keeps_bulk_off(name, estimators, usable))
        ]
        if not others:
            return True  # the only path: nothing to weigh (asked once per datagram)
        piece_bytes = max(1, min(piece_bytes, backlog_bytes))  # the piece it would really get

        def alone_s(name: str) -> float:
            est = estimators[name]
            return est.srtt_s / 2 + (est.bytes_in_flight + piece_bytes) * 8 / est.planning_rate_bps

        mine_s = alone_s(path)
        # No other path would deliver this piece sooner: take it. Without this, with a
        # backlog under one piece every path defers to "the others together" and the
        # work is never sent.
        if all(mine_s <= alone_s(name) for name in others):
            return True
        # Cheap lower bound first: the others together can never finish sooner than their
        # earliest start plus the whole backlog at their summed rate.
        rate_sum_bps = sum(estimators[n].planning_rate_bps for n in others)
        earliest_start_s = min(estimators[n].srtt_s / 2 for n in others)
        if mine_s <= earliest_start_s + backlog_bytes * 8 / rate_sum_bps:
            return True
        views = [bulk_view(n, estimators[n], now) for n in others]
        return mine_s <= earliest_finish_s(views, backlog_bytes)
