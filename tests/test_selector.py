"""CriticalPathSelector: hysteresis, cooldown, sharp degradation and validation, fake clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.core.estimator import PathEstimator
from wangate.core.events import RouteChanged
from wangate.core.selector import CriticalPathSelector, PathView, critical_view
from wangate.core.states import PathStateKind
from wangate.errors import LocalProtocolError

TICK_S = 0.01  # the transport updates the selector every 10 ms in these traces


def view(
    delivery_ms: float, state: PathStateKind = "up", loss: float = 0.0, reason: str = ""
) -> PathView:
    return PathView(delivery_ms / 1000, state, loss, reason)


def validated(*names: str, probes: int = 3) -> CriticalPathSelector:
    sel = CriticalPathSelector(validation_probes=probes)
    for name in names:
        for _ in range(probes):
            sel.record_probe_ok(name, 0.0)
    return sel


def run(
    sel: CriticalPathSelector,
    start_tick: int,
    end_tick: int,
    trace: Callable[[float], dict[str, PathView]],
) -> list[RouteChanged]:
    """Update at every tick in [start_tick, end_tick); times are exact tick multiples."""
    events = []
    for tick in range(start_tick, end_tick):
        now = tick * TICK_S
        event = sel.update(now, trace(now))
        if event is not None:
            events.append(event)
    return events


def test_the_first_usable_path_is_taken_at_once_and_the_best_of_several() -> None:
    sel = validated("a", "b")
    event = sel.update(0.0, {"a": view(40), "b": view(30)})
    assert event == RouteChanged(None, "b", "b is the best validated path (expected 30.0 ms)", 0.0)
    assert sel.current == "b"


def test_nothing_is_chosen_without_a_usable_path() -> None:
    sel = validated("a")
    assert sel.update(0.0, {"a": view(40, "down")}) is None
    assert sel.current is None
    sel2 = CriticalPathSelector()
    assert sel2.update(0.0, {"a": view(40)}) is None  # up, but not validated
    assert sel2.current is None


def test_paths_oscillating_within_the_margin_never_switch() -> None:
    sel = validated("a", "b")

    def trace(now: float) -> dict[str, PathView]:
        wobble = 3.0 if int(now * 100) % 2 else -3.0
        return {"a": view(40 + wobble), "b": view(40 - wobble)}  # gap <= 6 ms < 20% of 37

    events = run(sel, 0, 1000, trace)
    assert len(events) == 1 and events[0].previous is None  # only the first pick
    assert sel.current == events[0].current


def test_a_challenger_better_than_the_margin_switches_exactly_after_dwell() -> None:
    sel = validated("a", "b")  # dwell 0.5 s

    def trace(now: float) -> dict[str, PathView]:
        b_ms = 30 if now >= 1.0 else 50  # 30 < 40 * 0.8 = 32 and 10 ms > 2 ms
        return {"a": view(40), "b": view(b_ms)}

    events = run(sel, 0, 149, trace)
    assert [e.current for e in events] == ["a"]
    event = sel.update(1.49, trace(1.49))
    assert event is None
    event = sel.update(1.5, trace(1.5))
    assert event == RouteChanged("a", "b", "b expected 30.0 ms beat a 40.0 ms for 0.5 s", 1.5)


def test_a_challenger_within_the_relative_margin_does_not_switch() -> None:
    sel = validated("a", "b")
    # 33 ms is 7 ms better than 40 (more than margin_s) but less than 20%
    events = run(sel, 0, 500, lambda now: {"a": view(40), "b": view(50 if now < 1 else 33)})
    assert [e.current for e in events] == ["a"]


def test_a_challenger_within_the_absolute_margin_does_not_switch() -> None:
    sel = validated("a", "b")
    # 3 ms against 4 ms is 25% better but only 1 ms: below margin_s = 2 ms
    events = run(sel, 0, 500, lambda now: {"a": view(4), "b": view(5 if now < 1 else 3)})
    assert [e.current for e in events] == ["a"]


def test_a_break_in_the_challenge_restarts_the_dwell() -> None:
    sel = validated("a", "b")

    def trace(now: float) -> dict[str, PathView]:
        better = now >= 1.0 and not 1.4 <= now < 1.41
        return {"a": view(40), "b": view(20 if better else 50)}

    events = run(sel, 0, 300, trace)
    assert [(e.current, round(e.at, 9)) for e in events] == [("a", 0.0), ("b", 1.91)]


def test_swapping_order_faster_than_dwell_never_switches() -> None:
    sel = validated("a", "b")

    def trace(now: float) -> dict[str, PathView]:
        a_first = int(now / 0.3 + 1e-9) % 2 == 0  # swap every 300 ms
        fast, slow = view(20), view(40)
        return {"a": fast, "b": slow} if a_first else {"a": slow, "b": fast}

    events = run(sel, 0, 1000, trace)
    assert [e.current for e in events] == ["a"]


def test_within_cooldown_only_sharp_degradation_switches() -> None:
    sel = validated("a", "b", "c")  # cooldown 2 s
    phases: dict[str, PathView] = {"a": view(40), "b": view(60), "c": view(80)}

    def trace(now: float) -> dict[str, PathView]:
        if now < 1.0:
            return dict(phases)
        if now < 1.6:
            return {"a": view(40), "b": view(20), "c": view(80)}  # b takes over at 1.5
        if now < 4.0:
            return {"a": view(5), "b": view(20), "c": view(80)}  # a far better, in cooldown
        return {
            "a": view(5),
            "b": view(20, "degraded", reason="srtt 240 ms > 3x min 40 ms"),
            "c": view(80),
        }

    events = run(sel, 0, 200, trace)
    assert [(e.previous, e.current, e.at) for e in events] == [(None, "a", 0.0), ("a", "b", 1.5)]
    # a has been better since 1.6 (well past dwell), but the cooldown runs until 3.5
    assert run(sel, 200, 350, trace) == []
    event = sel.update(3.5, trace(3.5))
    assert event is not None and (event.previous, event.current) == ("b", "a")

    # a fresh cooldown: now a sharp degradation still moves the route at once
    sel2 = validated("a", "b", "c")
    run(sel2, 0, 160, trace)
    assert sel2.current == "b"
    event = sel2.update(4.0, trace(4.0))
    assert event == RouteChanged(
        "b", "a", "b degraded (srtt 240 ms > 3x min 40 ms); moved to a", 4.0
    )


def test_a_path_just_left_is_held_down_while_another_candidate_exists() -> None:
    sel = validated("a", "b", "c")  # cooldown 2 s
    sel.update(0.0, {"a": view(10), "b": view(20), "c": view(30)})
    degraded = view(50, "degraded", reason="srtt 100 ms > 3x min 20 ms")
    event = sel.update(0.1, {"a": degraded, "b": view(20), "c": view(30)})
    assert event is not None and (event.previous, event.current) == ("a", "b")
    # b degrades too while a looks fine again: the route goes on to c, not back to a
    event = sel.update(0.2, {"a": view(10), "b": degraded, "c": view(30)})
    assert event is not None and (event.previous, event.current) == ("b", "c")
    # with only the held-down path left, it is taken all the same
    event = sel.update(0.3, {"a": view(10), "b": degraded, "c": degraded})
    assert event is not None and (event.previous, event.current) == ("c", "a")


def test_a_degraded_route_that_is_still_fastest_stays_unless_it_loses_much() -> None:
    sel = validated("a", "b")
    sel.update(0.0, {"a": view(10), "b": view(30)})
    slow_but_best = view(20, "degraded", reason="srtt 40 ms > 3x min 10 ms")
    assert sel.update(0.1, {"a": slow_but_best, "b": view(30)}) is None
    lossy = view(20, "degraded", loss=0.05, reason="loss 5.0% > 5% over 200 datagrams")
    event = sel.update(0.2, {"a": lossy, "b": view(30)})
    assert event is not None and (event.previous, event.current) == ("a", "b")


def test_a_down_current_path_is_left_at_the_very_next_update_even_in_cooldown() -> None:
    sel = validated("a", "b")
    sel.update(0.0, {"a": view(40), "b": view(30)})
    run(sel, 1, 60, lambda now: {"a": view(10), "b": view(30)})
    assert sel.current == "a"  # switched at 0.5, cooldown until 2.5
    event = sel.update(0.6, {"a": view(10, "down", reason="silent for 0.51 s"), "b": view(30)})
    assert event == RouteChanged("a", "b", "a down (silent for 0.51 s); moved to b", 0.6)


def test_a_vanished_current_path_is_left_too() -> None:
    sel = validated("a", "b")
    sel.update(0.0, {"a": view(10), "b": view(30)})
    event = sel.update(0.01, {"b": view(30)})
    assert event == RouteChanged("a", "b", "a gone; moved to b", 0.01)


def test_with_every_path_down_current_becomes_none() -> None:
    sel = validated("a", "b")
    sel.update(0.0, {"a": view(10), "b": view(30)})
    event = sel.update(0.01, {"a": view(10, "down"), "b": view(30, "down")})
    assert event == RouteChanged("a", None, "a down; no usable path", 0.01)
    assert sel.current is None
    assert sel.update(0.02, {"a": view(10, "down"), "b": view(30, "down")}) is None


def test_a_path_back_from_down_must_validate_again() -> None:
    sel = validated("a", "b")
    sel.update(0.0, {"a": view(10), "b": view(30)})
    sel.update(0.01, {"a": view(10, "down"), "b": view(30)})
    assert sel.current == "b"
    assert not sel.is_validated("a")
    back = {"a": view(10), "b": view(30)}
    sel.record_probe_ok("a", 0.02)
    sel.record_probe_ok("a", 0.03)
    assert sel.update(0.03, back) is None  # two probes of three: still not eligible
    sel.record_probe_ok("a", 0.04)
    assert sel.is_validated("a")
    # eligible from 0.04 on: it must still win for a dwell, and the cooldown (from 0.01)
    # holds until 2.01
    assert run(sel, 4, 201, lambda now: back) == []
    event = sel.update(2.01, back)
    assert event is not None and (event.previous, event.current) == ("b", "a")


def test_validation_gates_the_first_choice() -> None:
    sel = CriticalPathSelector(validation_probes=3)
    sel.record_probe_ok("b", 0.0)
    sel.record_probe_ok("b", 0.0)
    paths = {"a": view(40), "b": view(20)}
    assert sel.update(0.0, paths) is None
    sel.record_probe_ok("b", 0.1)
    event = sel.update(0.1, paths)
    assert event is not None and event.current == "b"


def test_an_up_path_is_preferred_to_a_faster_degraded_one() -> None:
    sel = validated("a", "b")
    sel.update(0.0, {"a": view(40), "b": view(10, "degraded")})
    assert sel.current == "a"
    assert run(sel, 1, 500, lambda now: {"a": view(40), "b": view(10, "degraded")}) == []


def test_a_degraded_current_stays_when_every_alternative_is_degraded_too() -> None:
    sel = validated("a", "b")
    sel.update(0.0, {"a": view(40), "b": view(45)})
    events = run(sel, 1, 30, lambda now: {"a": view(40, "degraded"), "b": view(42, "degraded")})
    assert events == []
    assert sel.current == "a"


def test_duplicates_go_to_the_secondary_when_the_current_path_loses() -> None:
    sel = validated("a", "b", "c")
    sel.update(0.0, {"a": view(10), "b": view(30), "c": view(20)})
    assert sel.current == "a"
    assert sel.secondary() == "c"
    assert not sel.needs_duplicate()
    sel.update(0.01, {"a": view(10, loss=0.002), "b": view(30), "c": view(20, "down")})
    assert sel.secondary() == "b"
    assert sel.needs_duplicate()
    sel.update(0.02, {"a": view(10, loss=0.002), "b": view(30, "down"), "c": view(20, "down")})
    assert sel.secondary() is None
    assert not sel.needs_duplicate()  # nowhere to duplicate to


def test_duplicates_go_to_a_secondary_about_as_fast_as_the_current_path() -> None:
    sel = validated("a", "b")
    sel.update(0.0, {"a": view(20), "b": view(27.9)})  # within 40 %: either may be faster
    assert sel.current == "a" and sel.needs_duplicate()
    sel.update(0.01, {"a": view(20), "b": view(28.5)})
    assert not sel.needs_duplicate()
    sel.update(0.02, {"a": view(20), "b": view(27.9, "down")})
    assert not sel.needs_duplicate()


def test_critical_view_reads_the_estimator() -> None:
    est = PathEstimator()
    est.on_heard(0.0)
    est.on_rtt_sample(0.040, 0.0)
    pv = critical_view(est, 0.0, size_bytes=1000)
    assert pv == PathView(est.expected_delivery_s(1000, 0, 0.0), "up", 0.0, "ok")


def test_bad_parameters_are_local_errors() -> None:
    with pytest.raises(LocalProtocolError):
        CriticalPathSelector(dwell_s=-1)
    with pytest.raises(LocalProtocolError):
        CriticalPathSelector(validation_probes=-1)


# ---- invariants ----------------------------------------------------------------------------

_NAMES = ["a", "b", "c"]
_steps = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=1.0),  # time step
        st.lists(st.sampled_from(_NAMES), max_size=3),  # probes acked before the update
        st.dictionaries(
            st.sampled_from(_NAMES),
            st.tuples(
                st.sampled_from(["up", "degraded", "down"]), st.floats(min_value=0.0, max_value=1.0)
            ),
        ),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_current_is_always_usable_and_every_change_is_reported(
    steps: list[tuple[float, list[str], dict[str, tuple[PathStateKind, float]]]],
) -> None:
    sel = CriticalPathSelector(validation_probes=2, dwell_s=0.3, cooldown_s=1.0)
    probes = dict.fromkeys(_NAMES, 0)
    now = 0.0
    for step_s, acked, paths in steps:
        now += step_s
        for name in acked:
            sel.record_probe_ok(name, now)
            probes[name] += 1
        for name, (state, _) in paths.items():
            if state == "down":
                probes[name] = 0
        candidates = {n: PathView(d, s) for n, (s, d) in paths.items()}
        before = sel.current
        event = sel.update(now, candidates)
        usable = {n for n, v in candidates.items() if v.state != "down" and probes[n] >= 2}
        if sel.current is not None:
            assert sel.current in usable
        else:
            assert not usable
        if event is None:
            assert sel.current == before
        else:
            assert (event.previous, event.current, event.at) == (before, sel.current, now)
            assert event.previous != event.current
        secondary = sel.secondary()
        assert secondary is None or (secondary in usable and secondary != sel.current)


# ---- with real estimators: how fast critical traffic leaves a failing path -----------------


class _ProbedPath:
    """A path probed every 100 ms whose acks return after ``rtt_s`` (None: blackholed)."""

    def __init__(self, name: str, rtt_s: float) -> None:
        self.name = name
        self.rtt_s: float | None = rtt_s
        self.estimator = PathEstimator()
        self.pending: list[tuple[float, float]] = []  # (ack arrival, send time)

    def tick(self, now: float, sel: CriticalPathSelector) -> None:
        if round(now * 100) % 10 == 0:
            self.estimator.on_sent(100, now)
            if self.rtt_s is not None:
                self.pending.append((now + self.rtt_s, now))
        while self.pending and self.pending[0][0] <= now + 1e-9:
            _, sent_at = self.pending.pop(0)
            self.estimator.on_heard(now)
            self.estimator.on_rtt_sample(now - sent_at, now)
            self.estimator.on_acked(100, now)
            sel.record_probe_ok(self.name, now)


def _simulate(
    paths: list[_ProbedPath], until_tick: int, at_tick: int, fault: Callable[[], None]
) -> list[RouteChanged]:
    sel = CriticalPathSelector()
    events = []
    for tick in range(until_tick):
        now = tick * TICK_S
        if tick == at_tick:
            fault()
        for p in paths:
            p.tick(now, sel)
        views = {p.name: critical_view(p.estimator, now) for p in paths}
        event = sel.update(now, views)
        if event is not None:
            events.append(event)
    return events


def test_a_blackholed_path_loses_critical_traffic_within_a_second() -> None:
    a, b = _ProbedPath("a", 0.040), _ProbedPath("b", 0.060)

    def fault() -> None:
        a.rtt_s = None

    events = _simulate([a, b], 500, 300, fault)
    # validated at the third probe ack: a at 0.24 (b only at 0.26)
    assert events[0].at == 0.24
    # the last ack from a arrives at 2.94; down once silent for more than 0.5 s: at 3.45
    assert events[1].at == pytest.approx(3.45)
    assert events[1].reason == "a down (silent for 0.51 s); moved to b"
    assert events[1].at - 3.0 < 1.0


def test_an_rtt_jump_moves_critical_traffic_within_a_second() -> None:
    a, b = _ProbedPath("a", 0.040), _ProbedPath("b", 0.060)

    def fault() -> None:
        a.rtt_s = 0.300

    events = _simulate([a, b], 500, 300, fault)
    assert [(e.previous, e.current) for e in events] == [(None, "a"), ("a", "b")]
    # acks of 300 ms arrive at 3.3, 3.4, 3.5: srtt = 0.3 - 0.26 * (7/8)**k passes
    # 3 x 40 ms at k = 3 (126 ms)
    assert events[1].at == pytest.approx(3.5)
    assert events[1].reason == "a degraded (srtt 126 ms > 3x min 40 ms); moved to b"
