"""Which path carries critical gradients: the lowest expected delivery, without flapping.

Rules, applied on every :meth:`CriticalPathSelector.update`:

* A path is *usable* when it is not down and is *validated*: at least
  ``validation_probes`` datagrams on it were acked since the selector last saw it down (or
  since start). A path that is down is never current; with no usable path, current is
  None.
* *Sharp degradation* moves the route at once, ignoring dwell and cooldown: the current
  path is down, missing or no longer validated (it moves to the best usable path), or it
  is degraded - srtt at 3x its min RTT, a loss burst or high loss, as judged by
  :class:`~wangate.core.estimator.PathEstimator` - while another usable path is up and
  expected to deliver sooner, or the route loses ``SHARP_LOSS_RATE`` or more (it moves
  to the best up path). A degraded route that is still the fastest stays.
* Otherwise a challenger must beat the current path's expected delivery by more than
  ``margin`` (relative) and ``margin_s`` (absolute), without a break, for ``dwell_s``;
  an up path is never challenged by a degraded one. For ``cooldown_s`` after a switch
  between two paths no such switch happens (dwell timers keep running, so a challenger
  that stayed better takes over when the cooldown ends). Picking a path when there was
  none starts no cooldown.

* Flap damping: a path the route moved off is not chosen again for ``cooldown_s``
  while another candidate is there (like a routing hold-down timer), so paths that a
  burst of our own traffic degrades in turn do not pass the route back and forth.

* Duplicates: critical data also goes on the best other path (:meth:`secondary`) when
  the route loses ``duplicate_loss_rate`` or more, or when that path is expected within
  ``duplicate_within`` of the route (then jitter decides which is faster, not us).

Paths are ranked up before degraded, then by expected delivery, then by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from wangate.core.estimator import PathEstimator
from wangate.core.events import RouteChanged
from wangate.core.states import PathStateKind
from wangate.errors import LocalProtocolError

SHARP_LOSS_RATE: Final = 0.02  # a degraded route losing this much moves even to a slower path

# Times come from float arithmetic on the caller's side (e.g. 0.01 * k); a nanosecond of
# slack keeps "exactly after dwell_s" (and cooldown_s) from depending on rounding.
_TIME_EPSILON_S: Final = 1e-9


@dataclass(frozen=True)
class PathView:
    """One path as the critical selector sees it; the mapping key is its name."""

    expected_delivery_s: float
    state: PathStateKind
    loss_rate: float = 0.0
    state_reason: str = ""


def critical_view(
    estimator: PathEstimator, now: float, *, size_bytes: int = 1200, queued_bytes: int = 0
) -> PathView:
    """A :class:`PathView` for a small critical message of ``size_bytes``."""
    state = estimator.state(now)
    return PathView(
        expected_delivery_s=estimator.expected_delivery_s(size_bytes, queued_bytes, now),
        state=state.kind,
        loss_rate=estimator.loss_rate,
        state_reason=state.reason,
    )


def _delivery_s(view: PathView) -> float:
    value = view.expected_delivery_s
    return math.inf if math.isnan(value) else value


def _rank(name: str, view: PathView) -> tuple[int, float, str]:
    return (0 if view.state == PathStateKind.UP else 1, _delivery_s(view), name)


def _state_text(view: PathView) -> str:
    return f"{view.state} ({view.state_reason})" if view.state_reason else view.state


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


class CriticalPathSelector:
    def __init__(
        self,
        *,
        margin: float = 0.2,
        margin_s: float = 0.002,
        dwell_s: float = 0.5,
        cooldown_s: float = 2.0,
        validation_probes: int = 3,
        duplicate_loss_rate: float = 0.001,
        duplicate_within: float = 0.4,
    ) -> None:
        if margin < 0 or margin_s < 0 or dwell_s < 0 or cooldown_s < 0:
            raise LocalProtocolError("margin, margin_s, dwell_s and cooldown_s must be >= 0")
        if validation_probes < 0:
            raise LocalProtocolError("validation_probes must be >= 0")
        self._margin = margin
        self._margin_s = margin_s
        self._dwell_s = dwell_s
        self._cooldown_s = cooldown_s
        self._validation_probes = validation_probes
        self._duplicate_loss_rate = duplicate_loss_rate
        self._duplicate_within = duplicate_within
        self._current: str | None = None
        self._switched_at: float | None = None
        self._probes_ok: dict[str, int] = {}
        self._beating_since: dict[str, float] = {}
        self._views: dict[str, PathView] = {}
        self._left_at: dict[str, float] = {}  # when the route last moved off each path

    @property
    def current(self) -> str | None:
        return self._current

    def is_validated(self, path: str) -> bool:
        return self._probes_ok.get(path, 0) >= self._validation_probes

    def record_probe_ok(self, path: str, now: float) -> None:
        """A datagram on ``path`` was acked: one more step towards validation."""
        self._probes_ok[path] = self._probes_ok.get(path, 0) + 1

    def secondary(self) -> str | None:
        """The best usable path other than the current one (for duplicating critical data)."""
        if self._current is None:
            return None
        others = {n: v for n, v in self._usable().items() if n != self._current}
        return self._best(others)

    def needs_duplicate(self) -> bool:
        """Whether critical data should also go on :meth:`secondary`: the current path
        loses, or the secondary is expected within ``duplicate_within`` of it (jitter
        or a change may make either one the faster, and the receiver keeps whichever
        copy comes first, so the route's hysteresis costs no latency)."""
        view = self._views.get(self._current) if self._current is not None else None
        secondary = self.secondary()
        if view is None or secondary is None:
            return False
        if view.loss_rate >= self._duplicate_loss_rate:
            return True
        other = self._views[secondary]
        return other.expected_delivery_s <= view.expected_delivery_s * (1 + self._duplicate_within)

    def update(self, now: float, candidates: Mapping[str, PathView]) -> RouteChanged | None:
        self._views = dict(candidates)
        for name, view in candidates.items():
            if view.state == PathStateKind.DOWN:
                self._probes_ok[name] = 0  # must validate again when it comes back
        usable = self._usable()
        current = self._current

        if current is None or current not in usable:
            self._beating_since.clear()
            best = self._best(usable)
            if current is None:
                if best is None:
                    return None
                view = usable[best]
                return self._switch(
                    now,
                    best,
                    f"{best} is the best validated path (expected {_ms(_delivery_s(view))})",
                )
            why = self._why_unusable(current)
            if best is None:
                return self._switch(now, None, f"{current} {why}; no usable path")
            return self._switch(now, best, f"{current} {why}; moved to {best}")

        current_view = usable[current]
        sharp = current_view.loss_rate >= SHARP_LOSS_RATE
        if current_view.state != PathStateKind.UP:
            ups = self._not_held_down(
                {n: v for n, v in usable.items() if v.state == PathStateKind.UP}, now
            )
            best_up = self._best(ups)
            # Degraded but still the fastest (every path slowed by the same busy host,
            # say): staying is better than a move that makes delivery later. Loss on
            # the current path is covered by duplicates on the secondary meanwhile.
            if best_up is not None and (
                _delivery_s(ups[best_up]) >= _delivery_s(current_view) and not sharp
            ):
                best_up = None
            if best_up is not None:
                self._beating_since.clear()
                return self._switch(
                    now,
                    best_up,
                    f"{current} {_state_text(current_view)}; moved to {best_up}",
                )

        current_s = _delivery_s(current_view)
        needed_s = max(self._margin * current_s, self._margin_s)
        current_rank = _rank(current, current_view)[0]
        beating: dict[str, float] = {}
        for name, view in usable.items():
            if name == current or _rank(name, view)[0] > current_rank:
                continue
            challenger_s = _delivery_s(view)
            if current_s - challenger_s > needed_s or (
                math.isinf(current_s) and not math.isinf(challenger_s)
            ):
                beating[name] = self._beating_since.get(name, now)
        self._beating_since = beating

        if (
            self._switched_at is not None
            and now - self._switched_at < self._cooldown_s - _TIME_EPSILON_S
        ):
            return None
        ready = self._not_held_down(
            {
                n: usable[n]
                for n, since in beating.items()
                if now - since >= self._dwell_s - _TIME_EPSILON_S
            },
            now,
        )
        winner = self._best(ready)
        if winner is None:
            return None
        since = beating[winner]
        self._beating_since.clear()
        return self._switch(
            now,
            winner,
            f"{winner} expected {_ms(_delivery_s(usable[winner]))} beat {current}"
            f" {_ms(current_s)} for {now - since:.3g} s",
        )

    # ---- internals ----------------------------------------------------------------------

    def _not_held_down(self, views: dict[str, PathView], now: float) -> dict[str, PathView]:
        """Route flap damping: a path the route just left for being worse is not taken
        back before a cooldown has passed, unless nothing else is left."""
        fresh = {
            n: v
            for n, v in views.items()
            if now - self._left_at.get(n, -math.inf) >= self._cooldown_s - _TIME_EPSILON_S
        }
        return fresh or views

    def _usable(self) -> dict[str, PathView]:
        return {
            n: v
            for n, v in self._views.items()
            if v.state != PathStateKind.DOWN and self.is_validated(n)
        }

    @staticmethod
    def _best(views: Mapping[str, PathView]) -> str | None:
        if not views:
            return None
        return min(views, key=lambda n: _rank(n, views[n]))

    def _why_unusable(self, name: str) -> str:
        view = self._views.get(name)
        if view is None:
            return "gone"
        if view.state == PathStateKind.DOWN:
            return _state_text(view)
        return "not validated"

    def _switch(self, now: float, new: str | None, reason: str) -> RouteChanged:
        previous = self._current
        if previous is not None and new is not None:
            self._left_at[previous] = now
        self._current = new
        # Cooldown only after moving between two paths: picking the first one is no flap.
        self._switched_at = now if previous is not None and new is not None else None
        return RouteChanged(previous=previous, current=new, reason=reason, at=now)
