"""Reading a session changes nothing: whatever ``now`` a question is asked at, the
session queues no event and its state stays as it was. Only inputs and the timer
commit a judgement (the peer unreachable, its messages failed)."""

from __future__ import annotations

import contextlib
import enum
import math
import types
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from tests.fakelink import LinkProfile, SimulatedPair, make_header
from wangate.core.events import PeerStateChanged, SendFailed
from wangate.core.liveness import DEFAULT_PEER_DEAD_S, PEER_QUIET_S
from wangate.core.session import LATE_TIMER_S, PeerSession
from wangate.errors import PeerUnreachable

PATHS = {"a": LinkProfile(delay_s=0.01, rate_bps=20e6), "b": LinkProfile(delay_s=0.02)}
# memoised answers, not state: a sorted copy kept for the next percentile
CACHES = frozenset({"_rtt_sorted"})
# from the moment of the question to long after any deadline
LATER_S = (0.0, 0.001, LATE_TIMER_S * 2, PEER_QUIET_S + 0.1, DEFAULT_PEER_DEAD_S + 0.5, 1e4)


def fingerprint(value: Any, seen: dict[int, int] | None = None) -> Any:
    """Everything reachable from ``value``, as plain nested tuples that compare equal
    exactly when the state they were taken from is the same."""
    seen = {} if seen is None else seen
    if value is None or isinstance(value, bool | int | str | bytes | enum.Enum):
        return value
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, types.FunctionType | types.MethodType | types.BuiltinFunctionType):
        return ("callable", getattr(value, "__qualname__", repr(value)))
    if id(value) in seen:
        return ("seen", seen[id(value)])  # shared or cyclic: once is enough
    seen[id(value)] = len(seen)
    if isinstance(value, dict):
        return (
            "dict",
            tuple((fingerprint(k, seen), fingerprint(v, seen)) for k, v in value.items()),
        )
    if isinstance(value, list | tuple | deque):
        return (type(value).__name__, tuple(fingerprint(v, seen) for v in value))
    if isinstance(value, set | frozenset):
        return ("set", tuple(sorted(repr(v) for v in value)))
    fields: dict[str, Any] = {}
    if hasattr(value, "__dict__"):
        fields.update(vars(value))
    for cls in type(value).__mro__:
        # a class compiled by mypyc (setup.py) names its attributes in __mypyc_attrs__
        for slot in (*getattr(cls, "__slots__", ()), *getattr(cls, "__mypyc_attrs__", ())):
            if hasattr(value, slot):
                fields[slot] = getattr(value, slot)
    if not fields:
        return (type(value).__name__, repr(value))
    return (
        type(value).__name__,
        tuple((k, fingerprint(v, seen)) for k, v in sorted(fields.items()) if k not in CACHES),
    )


def ask_everything(session: PeerSession, now: float, msg_ids: range) -> None:
    """Every question the shell and the views ask of a session."""
    session.status()
    session.liveness(now)
    session.peer_state(now)
    session.silent_s(now)
    session.pending_bytes()
    for path in session.path_names:
        session.path_snapshot(path, now)
        session.has_critical_for(path)
    for msg_id in msg_ids:
        session.message_state(msg_id)
    _ = (session.unreachable, session.last_msg_id, session.granted_bytes)
    _ = (session.messages_received, session.path_names)
    with contextlib.suppress(PeerUnreachable):
        session.check_reachable(now)


def assert_reads_change_nothing(session: PeerSession, now: float) -> None:
    assert session.next_event() is None, "drain the events first"
    before = fingerprint(session)
    msg_ids = range(1, session.last_msg_id + 2)
    for later_s in LATER_S:
        ask_everything(session, now + later_s, msg_ids)
        assert session.next_event() is None, f"a read at now + {later_s} s queued an event"
        assert fingerprint(session) == before, f"a read at now + {later_s} s changed the session"


def drained(session: PeerSession) -> list[object]:
    events = []
    while (event := session.next_event()) is not None:
        events.append(event)
    return events


def test_the_fingerprint_sees_a_change() -> None:
    session = PeerSession("bj", "sh", max_message_bytes=1 << 20, inbox_window_bytes=1 << 20, now=0)
    before = fingerprint(session)
    assert fingerprint(session) == before
    session.path_up("a", datagram_bytes=1200, now=0.5)
    assert fingerprint(session) != before


Stage = Callable[[SimulatedPair], None]


def _quiet(pair: SimulatedPair) -> None:
    pair.run_for(0.5)


def _sending(pair: SimulatedPair) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: still on its way after 0.1 s
    pair.submit("bj", make_header("grad", payload, step=1), payload)
    pair.submit("bj", make_header("tiny", b"x", step=2, critical=True), b"x")
    pair.run_for(0.1)


def _silent(pair: SimulatedPair) -> None:
    _sending(pair)
    for name in PATHS:
        pair.set_silent(name, True)
    pair.run_for(PEER_QUIET_S + 0.5)


def _closed(pair: SimulatedPair) -> None:
    _sending(pair)
    pair.close_path("b")
    pair.run_for(0.05)


def _restarted(pair: SimulatedPair) -> None:
    _sending(pair)
    pair.restart("sh")
    pair.run_for(0.05)


@pytest.mark.parametrize("stage", [_quiet, _sending, _silent, _closed, _restarted])
def test_reading_a_session_at_any_time_changes_nothing(stage: Stage) -> None:
    pair = SimulatedPair(PATHS, seed=5, auto_consume=False)
    stage(pair)
    for site in ("bj", "sh"):
        assert_reads_change_nothing(pair.sessions[site], pair.now)


def test_a_read_past_peer_dead_s_answers_unreachable_and_the_timer_commits_it() -> None:
    session = PeerSession("bj", "sh", max_message_bytes=1 << 20, inbox_window_bytes=1 << 20, now=0)
    session.path_up("a", datagram_bytes=1200, now=0.0)  # the peer heard at 0, never again
    msg_id = session.submit(make_header("t", b"x"), b"x", 0.0)
    now = 0.0
    while (timer := session.get_timer()) is not None and timer < DEFAULT_PEER_DEAD_S:
        now = max(now + 0.001, timer)  # every timer on time, as the driver arms them
        session.handle_timer(now)
        while session.datagram_to_send("a", now) is not None:
            pass
    drained(session)
    assert timer == DEFAULT_PEER_DEAD_S
    assert session.peer_state(timer)[0] == "unreachable"
    assert session.path_snapshot("a", timer)["state"] == "down"
    with pytest.raises(PeerUnreachable):
        session.check_reachable(timer)
    assert_reads_change_nothing(session, timer)
    # the questions committed nothing: the message still waits, and the timer fails it
    assert not session.unreachable and session.message_state(msg_id) == "sending"
    session.handle_timer(timer)
    assert session.unreachable and session.message_state(msg_id) is None
    events = drained(session)
    assert [type(e) for e in events] == [SendFailed, PeerStateChanged]
    assert events[1] == PeerStateChanged("unreachable", "silent for 5.0 s")


def test_reading_a_held_up_session_changes_nothing() -> None:
    session = PeerSession("bj", "sh", max_message_bytes=1 << 20, inbox_window_bytes=1 << 20, now=0)
    session.path_up("a", datagram_bytes=1200, now=0.0)
    session.submit(make_header("t", b"x"), b"x", 0.0)
    session.get_timer()
    drained(session)
    assert_reads_change_nothing(session, 6.0)  # its timer long overdue
    session.handle_timer(6.0)  # late: its work waits for a read
    assert_reads_change_nothing(session, 6.0)
