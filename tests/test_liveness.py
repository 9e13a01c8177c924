"""The peer-state machine and the done/taken bookkeeping, sans-IO under the fake clock
(proto/delivery.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fakelink import LinkProfile, SimPath, SimulatedPair, make_header
from wangate.core.events import (
    MessageDelivered,
    MessageTaken,
    PeerStateChanged,
    SendFailed,
)
from wangate.core.frames import (
    ControlFrame,
    ControlStreamDecoder,
    MessagesDone,
    MessagesTaken,
    encode_control,
)
from wangate.core.liveness import DEFAULT_PEER_DEAD_S, PEER_QUIET_S, PeerLiveness
from wangate.core.session import PeerSession
from wangate.errors import PeerUnreachable

PATHS = {"a": LinkProfile(delay_s=0.01), "b": LinkProfile(delay_s=0.02)}
RESTART_REASON = "peer sh restarted with it in its inbox, before a trainer took it"
ALL_SENT = "peer sh unreachable: silent for 5.0 s, after all of it was sent"


def submit(pair: SimulatedPair, tag: str, step: int, size: int = 20_000) -> int:
    payload = bytes([step % 256]) * size
    return pair.submit("bj", make_header(tag, payload, step=step), payload)


def test_a_silent_peer_goes_degraded_then_unreachable_and_comes_back() -> None:
    pair = SimulatedPair(PATHS, auto_consume=False, inbox_window_bytes=1 << 20)
    bj = pair.sessions["bj"]
    pair.run_for(0.5)
    assert bj.peer_state(pair.now) == ("up", "2 of 2 paths up")
    # a message larger than the window: part of it is still on its way when all goes quiet
    pending = submit(pair, "grad", 7, size=3 << 20)
    waiting = submit(pair, "grad", 8)
    pair.run_for(0.05)
    for name in PATHS:
        pair.set_silent(name, True)
    silent_from = pair.now
    pair.run_for(PEER_QUIET_S + 0.5)
    state, reason = bj.peer_state(pair.now)
    assert state == "degraded" and reason.startswith("silent for 1.")
    rows = [bj.path_snapshot(p, pair.now) for p in PATHS]
    assert [r["peer_state"] for r in rows] == ["degraded", "degraded"]
    assert all(r["state"] in ("degraded", "down") for r in rows)  # never "up" while silent
    assert pair.events_of("bj", SendFailed) == []

    pair.run_for(DEFAULT_PEER_DEAD_S)
    changes = [
        e.state
        for t, e in pair.events["bj"]
        if isinstance(e, PeerStateChanged) and t >= silent_from
    ]
    assert changes == ["degraded", "unreachable"]
    declared_at = next(
        t
        for t, e in pair.events["bj"]
        if isinstance(e, PeerStateChanged) and e.state == "unreachable"
    )
    heard_for_s = declared_at - silent_from
    assert DEFAULT_PEER_DEAD_S - 0.1 <= heard_for_s <= DEFAULT_PEER_DEAD_S
    failed = pair.events_of("bj", SendFailed)
    # every byte of them went out, into the blackhole: sh may have them
    assert [(f.msg_id, f.tag, f.step) for f in failed] == [
        (pending, "grad", 7),
        (waiting, "grad", 8),
    ]
    assert {f.reason for f in failed} == {f"{ALL_SENT} (a trainer there may have taken it)"}
    assert [f.restarted for f in failed] == [False, False]  # the peer may come back with them
    assert bj.status()["messages_in_flight"] == 0 and bj.status()["messages_waiting"] == 0
    assert bj.peer_state(pair.now)[0] == "unreachable"
    assert [bj.path_snapshot(p, pair.now)["state"] for p in PATHS] == ["down", "down"]
    with pytest.raises(PeerUnreachable) as refused:
        submit(pair, "grad", 9)
    assert str(refused.value).startswith("peer sh is unreachable: silent for 6.5 s")
    assert str(refused.value).endswith("(limits.peer_dead_s = 5); it fails until heard again")
    assert bj.last_msg_id == waiting  # nothing was queued

    for name in PATHS:
        pair.set_silent(name, False)
    pair.run_for(1.0)
    assert bj.peer_state(pair.now) == ("up", "2 of 2 paths up")
    assert [e.state for e in pair.events_of("bj", PeerStateChanged)][-1] == "up"
    again = submit(pair, "grad", 10)
    assert pair.run_until(
        lambda: any(e.msg_id == again for e in pair.events_of("bj", MessageDelivered)), 10
    )


def test_a_peer_never_heard_from_is_unreachable_after_peer_dead_s() -> None:
    session = PeerSession(
        "bj",
        "sh",
        max_message_bytes=1 << 20,
        inbox_window_bytes=1 << 20,
        now=0.0,
        peer_dead_s=3,
        configured_paths=2,
    )
    assert session.peer_state(1.0) == ("degraded", "not connected yet")
    now = 1.0
    while not session.unreachable:  # each timer on time, as the driver arms it
        timer = session.get_timer()
        assert timer is not None and timer <= 3.0
        now = max(now + 0.001, timer)
        session.handle_timer(now)
    assert now == 3.0
    assert session.peer_state(3.0) == ("unreachable", "not heard from in 3.0 s since start")
    assert session.next_event() == PeerStateChanged(
        "unreachable", "not heard from in 3.0 s since start"
    )
    with pytest.raises(PeerUnreachable, match=r"^peer sh is unreachable: not heard from in 3\.5 s"):
        session.submit(make_header("t", b"x"), b"x", 3.5)


def test_done_messages_are_held_until_taken_and_fail_when_the_peer_restarts() -> None:
    pair = SimulatedPair(PATHS, auto_consume=False)
    bj = pair.sessions["bj"]
    ids = [submit(pair, "w", step) for step in range(3)]
    assert pair.run_until(lambda: len(pair.events_of("bj", MessageDelivered)) == 3, 10)
    assert [bj.message_state(i) for i in ids] == ["held", "held", "held"]
    assert bj.liveness(pair.now)["messages_held"] == 3

    pair.consume("sh", ids[1])  # a trainer at sh takes the second one
    assert pair.run_until(lambda: bool(pair.events_of("bj", MessageTaken)), 10)
    assert pair.events_of("bj", MessageTaken) == [MessageTaken(ids[1])]
    assert [bj.message_state(i) for i in ids] == ["held", None, "held"]

    pair.restart("sh")
    pair.run_for(0.2)
    failed = pair.events_of("bj", SendFailed)
    assert failed == [
        SendFailed(ids[0], RESTART_REASON, "w", 0, restarted=True),
        SendFailed(ids[2], RESTART_REASON, "w", 2, restarted=True),
    ]
    assert [bj.message_state(i) for i in ids] == [None, None, None]
    assert bj.liveness(pair.now)["messages_held"] == 0
    assert bj.peer_state(pair.now)[0] == "restarted"
    pair.run_for(DEFAULT_PEER_DEAD_S)
    assert bj.peer_state(pair.now)[0] == "up"


def lose_confirmations(pair: SimulatedPair, site: str) -> Callable[[], list[ControlFrame]]:
    """From now on every ``MessagesDone`` and ``MessagesTaken`` ``site`` sends is lost
    (each went on a connection that then died), its acks still arrive; the function
    returned ends that and returns what was lost."""
    lost: list[ControlFrame] = []
    send = pair._send_control

    def send_some(path: SimPath, sender: str, data: bytes) -> None:
        if sender == site:
            frames = ControlStreamDecoder().feed(data)
            lost.extend(f for f in frames if isinstance(f, MessagesDone | MessagesTaken))
            kept = [f for f in frames if not isinstance(f, MessagesDone | MessagesTaken)]
            data = b"".join(encode_control(f) for f in kept)
        if data:
            send(path, sender, data)

    def restore() -> list[ControlFrame]:
        pair._send_control = send  # type: ignore[method-assign]
        return lost

    pair._send_control = send_some  # type: ignore[method-assign]
    return restore


@pytest.mark.parametrize("then", ["heard again", "restarted"])
def test_a_message_the_peer_had_every_byte_of_is_not_failed_by_its_silence(then: str) -> None:
    # sh's trainer takes each message as it arrives; sh grants 8 MiB at first
    pair = SimulatedPair(PATHS, inbox_window_bytes=1 << 20)
    bj = pair.sessions["bj"]
    pair.run_for(0.5)
    restore = lose_confirmations(pair, "sh")
    whole = submit(pair, "grad", 1)
    assert pair.run_until(lambda: whole in pair.received["sh"], 10)
    pair.run_for(0.1)  # every ack is in; the done and taken were lost
    for name in PATHS:
        pair.set_silent(name, True)
    sent = submit(pair, "grad", 2, size=7 << 20)  # all sent, into the blackhole
    unsent = submit(pair, "grad", 3, size=2 << 20)  # beyond the credit: never sent
    pair.run_for(DEFAULT_PEER_DEAD_S + 0.5)
    assert bj.peer_state(pair.now)[0] == "unreachable"
    # sh may have delivered the first (it did): silence does not fail it; bj cannot tell
    # whether the second arrived, and knows the third did not
    assert pair.events_of("bj", SendFailed) == [
        SendFailed(sent, f"{ALL_SENT} (a trainer there may have taken it)", "grad", 2),
        SendFailed(unsent, "peer sh unreachable: silent for 5.0 s", "grad", 3),
    ]
    assert bj.message_state(whole) == "sending"
    assert bj.status()["messages_in_flight"] == 1
    lost = restore()
    assert MessagesDone((whole,)) in lost and MessagesTaken((whole,)) in lost
    for name in PATHS:
        pair.set_silent(name, False)
    if then == "heard again":
        # bj asks again (one byte of it); sh, which remembers delivering it and its
        # trainer taking it, says both again
        assert pair.run_until(lambda: bool(pair.events_of("bj", MessageTaken)), 10)
        assert [e.msg_id for e in pair.events_of("bj", MessageDelivered)] == [whole]
        assert pair.events_of("bj", MessageTaken) == [MessageTaken(whole)]
        assert pair.received_count["sh"][whole] == 1
    else:
        pair.restart("sh")
        pair.run_for(0.2)
        assert pair.events_of("bj", SendFailed)[2:] == [
            SendFailed(whole, "peer sh restarted mid-message", "grad", 1, restarted=True)
        ]
        assert pair.events_of("bj", MessageDelivered) == []
    assert bj.message_state(whole) is None


def test_taken_overtaking_done_counts_as_both() -> None:
    pair = SimulatedPair(PATHS, auto_consume=False)
    bj = pair.sessions["bj"]
    msg_id = submit(pair, "w", 1, size=2 << 20)
    pair.run_for(0.05)  # credit came, sending started, far from done
    assert bj.message_state(msg_id) == "sending" and bj.status()["messages_in_flight"] == 1
    bj.handle_control("a", MessagesTaken((msg_id, 999)), pair.now)  # 999: unknown, ignored
    events = [bj.next_event() for _ in range(2)]
    assert isinstance(events[0], MessageDelivered) and events[0].msg_id == msg_id
    assert events[1] == MessageTaken(msg_id)
    assert bj.message_state(msg_id) is None
    assert bj.liveness(pair.now)["messages_held"] == 0


def test_taken_reports_are_sent_once_in_order_after_done() -> None:
    pair = SimulatedPair(PATHS, auto_consume=False)
    ids = [submit(pair, "w", step, size=1000) for step in range(5)]
    assert pair.run_until(lambda: len(pair.events_of("bj", MessageDelivered)) == 5, 10)
    for msg_id in reversed(ids):
        pair.consume("sh", msg_id)
    assert pair.run_until(lambda: len(pair.events_of("bj", MessageTaken)) == 5, 10)
    assert [e.msg_id for e in pair.events_of("bj", MessageTaken)] == list(reversed(ids))
    pair.run_for(2.0)
    assert len(pair.events_of("bj", MessageTaken)) == 5


def test_the_state_machine_alone() -> None:
    live = PeerLiveness(peer_dead_s=5.0, now=100.0)
    assert live.classify(101.0, 0, 2) == "degraded"
    assert live.reason(101.0, 0, 2) == "not connected yet"
    assert live.next_change_at() == 105.0
    assert live.heard(102.0) is False
    live.state = live.classify(102.5, 2, 2)
    assert (live.state, live.reason(102.5, 2, 2)) == ("up", "2 of 2 paths up")
    assert live.next_change_at() == 102.0 + PEER_QUIET_S
    assert live.classify(102.5, 1, 2) == "degraded"
    assert live.reason(102.5, 1, 2) == "1 of 2 paths up, the others degraded or down"
    live.state = live.classify(103.5, 2, 2)
    assert (live.state, live.reason(103.5, 2, 2)) == ("degraded", "silent for 1.5 s")
    assert live.next_change_at() == 107.0
    assert live.classify(107.0, 2, 2) == "unreachable"
    live.state, live.unreachable = "unreachable", True
    assert live.next_change_at() == float("inf")
    assert live.silence_reason(107.25) == "silent for 5.2 s"
    assert live.heard(108.0) is True and not live.unreachable
    live.restarted(109.0)
    assert live.classify(109.5, 2, 2) == "restarted"
    live.state = "restarted"
    assert live.reason(109.5, 2, 2) == "a new instance of the peer since 0.5 s"
    assert live.next_change_at() == 114.0
    assert live.classify(114.0, 2, 2) == "unreachable"  # nothing heard since the restart
    assert live.heard(113.5) is False and live.classify(114.0, 2, 2) == "up"
