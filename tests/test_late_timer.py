"""A busy host: the process is held up while acks arrive, and its timer fires late.

Under uvloop an overdue timer runs before the sockets are polled, so the acks that came
during the stall are still unread when the timer judges the paths. Judged then, a path
is silent past its timeout and every datagram in flight is lost: repair symbols go out
for blocks that arrived whole.
"""

from __future__ import annotations

import pytest

from tests.fakelink import LinkProfile, SimulatedPair, make_header
from wangate.core.events import MessageDelivered, PathStateChanged, PeerStateChanged
from wangate.core.frames import encode_probe, stamp
from wangate.core.outbound import CodingPolicy
from wangate.core.session import LATE_TIMER_RECHECK_S, LATE_TIMER_S, PeerSession
from wangate.errors import PeerUnreachable

PATH = LinkProfile(delay_s=0.020, rate_bps=40e6)  # no loss at all
PAYLOAD = bytes(range(256)) * (16 << 10)  # 4 MiB: 0.84 s on the path
STALL_S = 0.5  # past the retransmission timeout (about 0.07 s) and the silence timeout


def stalled_transfer(*, silent_during_stall: bool = False) -> SimulatedPair:
    pair = SimulatedPair({"a": PATH}, seed=3, coding=CodingPolicy(k=32, min_repair=0))
    pair.submit("bj", make_header("grad", PAYLOAD, step=1), PAYLOAD)
    pair.run_for(0.3)  # mid-transfer, 180 datagrams in flight
    if silent_during_stall:
        pair.set_silent("a", True)
    pair.stall("bj", STALL_S)
    return pair


def path_changes(pair: SimulatedPair) -> list[tuple[float, str]]:
    return [
        (at, event.state)
        for at, event in pair.events["bj"]
        if isinstance(event, PathStateChanged) and event.path == "a"
    ]


def test_a_late_timer_reads_the_acks_that_came_before_it_judges_the_path() -> None:
    pair = stalled_transfer()
    assert pair.run_until(lambda: len(pair.events_of("bj", MessageDelivered)) == 1, 10)
    status = pair.sessions["bj"].status()
    assert status["late_timers"] == 1
    # nothing was lost, and nothing was sent again (before: 32 repair symbols, 37760
    # bytes, for blocks whose sources had all arrived, and the path down for a moment;
    # the acks read late still time the path as the stall made it look: degraded)
    assert (status["fec_bytes"], status["repair_bytes"]) == (0, 0)
    assert "down" not in [state for _, state in path_changes(pair)]


def test_a_path_that_went_silent_during_the_stall_is_judged_one_read_later() -> None:
    pair = stalled_transfer(silent_during_stall=True)
    woke_at = pair.now + STALL_S
    assert pair.run_until(lambda: path_changes(pair) != [], max_time_s=1)
    ((at, state),) = path_changes(pair)
    assert state == "down"
    assert woke_at + LATE_TIMER_RECHECK_S <= at < woke_at + LATE_TIMER_S
    assert pair.sessions["bj"].status()["late_timers"] == 1


def held_up_session() -> PeerSession:
    session = PeerSession(
        "bj", "sh", max_message_bytes=1 << 20, inbox_window_bytes=1 << 20, now=0.0
    )
    session.path_up("a", datagram_bytes=1200, now=0.0)  # the peer heard at 0
    assert session.get_timer() is not None and session.get_timer() < 1.0
    return session


def test_a_trainer_served_first_after_a_stall_does_not_find_the_peer_unreachable() -> None:
    # held up 6 s (> peer_dead_s, 5 s): a trainer's send is read before the peer's
    # datagrams that waited in the socket meanwhile
    session = held_up_session()
    session.check_reachable(6.0)  # no PeerUnreachable: the silence was ours
    assert session.peer_state(6.0)[0] != "unreachable"
    session.handle_timer(6.0)  # overdue: its work waits for the read
    session.check_reachable(6.0 + LATE_TIMER_RECHECK_S / 2)
    session.handle_datagram("a", encode_probe(1, stamp(6.0)), 6.0 + LATE_TIMER_RECHECK_S / 2)
    session.handle_timer(6.0 + LATE_TIMER_RECHECK_S)
    session.check_reachable(6.0 + LATE_TIMER_RECHECK_S)
    events = []
    while (event := session.next_event()) is not None:
        events.append(event)
    assert [e for e in events if isinstance(e, PeerStateChanged) and e.state == "unreachable"] == []


def test_a_peer_silent_through_the_stall_is_unreachable_once_it_had_time_to_answer() -> None:
    # nothing waited for the read: the peer may have stopped sending into a window we
    # left unacknowledged, so it has three round trips (srtt 0.1 s here) to answer the
    # probes we send on waking
    session = held_up_session()
    session.check_reachable(6.0)
    session.handle_timer(6.0)
    now = 6.0 + LATE_TIMER_RECHECK_S
    session.handle_timer(now)  # nothing came
    while not session.unreachable:  # from here every timer on time; nothing heard
        session.check_reachable(now)  # not yet: the silence may be ours
        while session.datagram_to_send("a", now) is not None:
            pass
        timer = session.get_timer()
        assert timer is not None
        now = max(now + 0.001, timer)
        session.handle_timer(now)
    assert now == pytest.approx(6.0 + 3 * 0.1)
    with pytest.raises(PeerUnreachable, match=r"peer sh is unreachable: silent for 6\.3 s"):
        session.check_reachable(now)


def test_a_peer_that_answers_on_waking_is_never_unreachable() -> None:
    session = held_up_session()
    session.handle_timer(6.0)
    session.handle_timer(6.0 + LATE_TIMER_RECHECK_S)  # nothing waited for the read
    session.handle_datagram("a", encode_probe(1, stamp(6.02)), 6.02)  # its answer
    now = 6.02
    while now < 7.0:
        timer = session.get_timer()
        assert timer is not None
        now = max(now + 0.001, timer)
        session.handle_timer(now)
        while session.datagram_to_send("a", now) is not None:
            pass
    session.check_reachable(now)
    assert session.peer_state(now)[0] != "unreachable" and not session.unreachable


def test_a_peer_silent_past_peer_dead_s_on_a_punctual_host_is_unreachable() -> None:
    session = held_up_session()
    now = 0.0
    for _ in range(10_000):  # every timer on time, the probes sent; nothing heard
        timer = session.get_timer()
        assert timer is not None
        now = max(now + 0.001, timer)  # as the driver arms it: at least 1 ms ahead
        session.handle_timer(now)
        while session.datagram_to_send("a", now) is not None:
            pass
        if session.unreachable:
            break
    assert 5.0 <= now < 5.0 + LATE_TIMER_S
    with pytest.raises(PeerUnreachable, match=r"silent for 5\.0 s"):
        session.check_reachable(now)


def test_timers_late_one_after_another_still_find_a_silent_peer_unreachable() -> None:
    # a host so busy that every timer fires 20 ms late: each is a stall, but the peer's
    # time to answer is not extended by the next one
    session = held_up_session()
    now = 0.0
    while not session.unreachable and now < 30.0:
        timer = session.get_timer()
        assert timer is not None
        now = max(now + 0.001, timer + 0.020)
        session.handle_timer(now)
        while session.datagram_to_send("a", now) is not None:
            pass
    assert session.unreachable
    assert 5.0 <= now < 5.0 + 3 * 0.1 + 0.1
    assert session.status()["late_timers"] > 10
