"""TimerTable: the earliest of its named deadlines, which are due and in what order,
replacing and removing them, and the holds a late timer leaves."""

from __future__ import annotations

import math

from wangate.core.timers import LATE_TIMER_RECHECK_S, LATE_TIMER_S, TimerTable


def test_the_timer_is_the_earliest_named_deadline() -> None:
    timers = TimerTable()
    assert timers.earliest() is None and timers.arm() is None
    timers.set("route selection", 10.5)
    timers.set(("loss", "a"), 10.2)
    timers.set(("ack", "a"), 10.3)
    timers.set("peer liveness", math.inf)
    assert timers.earliest() == 10.2
    assert timers.arm() == 10.2 and timers.armed_at == 10.2


def test_replacing_moves_a_deadline_and_removing_or_none_drops_it() -> None:
    timers = TimerTable()
    timers.set("a", 3.0)
    timers.set("b", 2.0)
    timers.set("b", 4.0)  # replaced, later now
    assert timers.get("b") == 4.0 and timers.earliest() == 3.0
    timers.set("a", None)
    assert timers.get("a") is None and timers.names() == ["b"]
    timers.remove("b")
    timers.remove("b")  # removing what is not there is nothing
    assert timers.names() == [] and timers.earliest() is None


def test_arming_with_deadlines_replaces_them_all() -> None:
    timers = TimerTable()
    timers.set("stale", 1.0)
    assert timers.arm({"route selection": 7.0, ("probe", "a"): 6.5}) == 6.5
    assert timers.names() == ["route selection", ("probe", "a")]
    assert timers.get("stale") is None
    assert timers.arm({}) is None and timers.armed_at is None


def test_due_deadlines_come_earliest_first_and_ties_in_the_order_names_were_added() -> None:
    timers = TimerTable()
    timers.set("c", 5.0)
    timers.set(("probe", "a"), 4.0)
    timers.set("a", 5.0)
    timers.set("b", 5.0)
    timers.set("late", 6.0)
    assert timers.due(5.0) == [("probe", "a"), "c", "a", "b"]
    timers.set("c", 5.0)  # replaced: keeps its place among equals
    assert timers.due(5.0) == [("probe", "a"), "c", "a", "b"]
    timers.remove("c")
    timers.set("c", 5.0)  # removed and added again: last among equals
    assert timers.due(5.0) == [("probe", "a"), "a", "b", "c"]
    assert timers.due(3.9) == []
    assert timers.due(6.0)[-1] == "late"


def test_a_timer_on_time_is_not_deferred() -> None:
    timers = TimerTable()
    timers.set("x", 1.0)
    timers.arm()
    assert not timers.defer_if_late(1.0 + LATE_TIMER_S, lambda: 0.05)
    assert (timers.recheck_at, timers.answer_by, timers.late_timers) == (None, None, 0)
    assert timers.answer_due(1.0 + LATE_TIMER_S)


def test_a_late_timer_waits_one_read_and_holds_the_peer_judgement() -> None:
    timers = TimerTable()
    timers.set("x", 1.0)
    timers.arm()
    woke = 1.5
    asked: list[int] = []

    def wait_s() -> float:
        asked.append(1)
        return 0.2

    assert timers.defer_if_late(woke, wait_s)
    assert timers.recheck_at == woke + LATE_TIMER_RECHECK_S
    assert timers.answer_by == woke + 0.2 and timers.late_timers == 1
    assert timers.held_up(woke)
    # the work waits for the read: the timer is armed no sooner than the recheck
    assert timers.arm() == woke + LATE_TIMER_RECHECK_S
    # the liveness deadline is held until the peer could answer
    assert timers.not_before_answer(1.2) == woke + 0.2
    assert timers.not_before_answer(9.0) == 9.0
    # the recheck runs the work; the peer is not judged before the answer-by hold
    at = woke + LATE_TIMER_RECHECK_S
    assert not timers.defer_if_late(at, wait_s)
    assert timers.recheck_at is None
    assert not timers.answer_due(at) and timers.held_up(at)
    assert timers.answer_due(woke + 0.2)
    assert timers.answer_by is None and timers.not_before_answer(1.2) == 1.2
    assert asked == [1]


def test_late_timers_in_a_row_do_not_extend_the_answer_by_hold() -> None:
    timers = TimerTable()
    timers.set("x", 1.0)
    timers.arm()
    assert timers.defer_if_late(1.5, lambda: 0.2)
    timers.arm()  # armed for the recheck, 1.501
    assert not timers.defer_if_late(1.501, lambda: 0.2)
    timers.set("x", 1.6)
    timers.arm()
    assert timers.defer_if_late(1.61, lambda: 5.0)  # late again, within the hold
    assert timers.answer_by == 1.7 and timers.late_timers == 2


def test_an_overdue_timer_counts_as_held_up_before_it_fires() -> None:
    timers = TimerTable()
    assert not timers.held_up(100.0)  # never armed
    timers.set("x", 2.0)
    timers.arm()
    assert not timers.held_up(2.0 + LATE_TIMER_S)
    assert timers.held_up(2.0 + 2 * LATE_TIMER_S)
