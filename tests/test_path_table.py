"""PathTable: a path's record from up to down and back, which paths count as up, the
events a change of state makes, and a path's row."""

from __future__ import annotations

from collections import deque

import pytest

from wangate.core.events import Event, PathStateChanged
from wangate.core.liveness import PEER_QUIET_S
from wangate.core.path_table import MIN_DATAGRAM_BYTES, PathTable
from wangate.core.paths import SentDatagram
from wangate.core.states import PathStateKind, PeerStateKind
from wangate.errors import LocalProtocolError

UP, DEGRADED, DOWN = PathStateKind.UP, PathStateKind.DEGRADED, PathStateKind.DOWN


def table(configured: int = 0) -> tuple[PathTable, deque[Event]]:
    events: deque[Event] = deque()
    return PathTable(events, configured), events


def test_a_path_that_connects_gets_a_record_heard_now() -> None:
    paths, events = table()
    record = paths.connect("a", 1200, 10.0)
    assert paths.get("a") is record and paths.records == {"a": record}
    assert record.connected and record.state == UP
    assert record.sender.datagram_bytes == 1200 and record.sender.last_sent_at == 10.0
    assert record.sender.estimator.last_heard_at == 10.0
    assert paths.paths_up() == (1, 1) and paths.hearing_peer()
    assert list(events) == []  # the session moves its state, once it heard the peer


def test_datagrams_too_small_for_a_header_are_refused() -> None:
    paths, _ = table()
    with pytest.raises(LocalProtocolError, match="too small"):
        paths.connect("a", MIN_DATAGRAM_BYTES - 1, 0.0)
    assert paths.get("a") is None
    paths.connect("a", MIN_DATAGRAM_BYTES, 0.0)


def test_up_down_bookkeeping_counts_configured_paths_that_never_came_up() -> None:
    paths, events = table(configured=3)
    a = paths.connect("a", 1200, 1.0)
    b = paths.connect("b", 1200, 1.0)
    assert paths.paths_up() == (2, 3)
    a.sender.record(SentDatagram(1, 0, 100, 1.0, 100))
    a.receiver.on_datagram(7, 70, 1.0, ack_within_s=0.0)
    a.receiver.received_bytes = 500
    assert paths.outage(a) == [SentDatagram(1, 0, 100, 1.0, 100)]
    paths.disconnect("a", a, "closed")
    assert list(events) == [PathStateChanged("a", DOWN, "closed")]
    assert not a.connected and a.state == DOWN and paths.paths_up() == (1, 3)
    # acks owed on the old connection die with it; counts and references carry on
    assert a.receiver.ack_deadline() is None
    assert (a.receiver.newest_seq, a.receiver.received_bytes) == (7, 500)
    assert paths.hearing_peer()  # b
    paths.move("b", b, DEGRADED, "loss")
    assert paths.paths_up() == (0, 3) and paths.hearing_peer()
    paths.move("b", b, DOWN, "silent")
    assert not paths.hearing_peer()
    # the same record comes back, quietly when asked
    assert paths.connect("a", 1400, 2.0) is a and a.sender.datagram_bytes == 1400
    events.clear()
    assert paths.move("a", a, UP, "connected", quiet=True)
    assert list(events) == [] and paths.paths_up() == (1, 3)
    assert not paths.move("a", a, UP, "connected")  # no change, no event
    assert list(events) == []


def test_a_path_declared_down_is_up_again_when_heard_but_not_once_closed() -> None:
    paths, events = table()
    a = paths.connect("a", 1200, 1.0)
    paths.move("a", a, DOWN, "silent for 2 s")
    events.clear()
    paths.heard("a", a, 5.0)
    assert a.state == UP and a.sender.back_at == 5.0
    assert list(events) == [PathStateChanged("a", UP, "heard again")]
    paths.disconnect("a", a, "closed")
    events.clear()
    paths.heard("a", a, 6.0)  # a closed path is not back until it connects
    assert a.state == DOWN and list(events) == []
    assert a.sender.estimator.last_heard_at == 6.0


def test_judge_moves_a_path_to_its_estimators_state() -> None:
    paths, events = table()
    a = paths.connect("a", 1200, 1.0)
    assert paths.judge("a", a, 1.001) == (False, False)
    timeout_s = a.sender.estimator.silence_timeout_s()
    changed, went_down = paths.judge("a", a, 1.0 + timeout_s + 1.0)
    assert (changed, went_down) == (True, True) and a.state == DOWN
    assert [e.state for e in events if isinstance(e, PathStateChanged)] == [DOWN]
    assert paths.judge("a", a, 1.0 + timeout_s + 2.0) == (False, False)  # already down


def test_a_restarted_peer_leaves_nothing_in_flight_and_fresh_receivers() -> None:
    paths, _ = table()
    a = paths.connect("a", 1200, 1.0)
    a.sender.record(SentDatagram(1, 0, 100, 1.0, 100))
    a.receiver.on_datagram(9, 90, 1.0, ack_within_s=0.0)
    a.receiver.received_bytes = 64
    paths.peer_restarted()
    assert a.sender.inflight == {}
    assert (a.receiver.newest_seq, a.receiver.received_bytes) == (0, 64)
    assert a.receiver.ack_deadline() is None
    # nor in the estimator's count (before, it stayed there for good: bulk planning and
    # the FEC tails saw the path fuller than it was)
    assert a.sender.estimator.bytes_in_flight == 0


def test_the_best_srtt_is_of_connected_paths() -> None:
    paths, _ = table()
    assert paths.best_srtt_s() == 0.0
    a = paths.connect("a", 1200, 0.0)
    b = paths.connect("b", 1200, 0.0)
    a.sender.estimator.on_rtt_sample(0.050, 1.0)
    b.sender.estimator.on_rtt_sample(0.020, 1.0)
    assert paths.best_srtt_s() == pytest.approx(0.020)
    paths.disconnect("b", b, "closed")
    assert paths.best_srtt_s() == pytest.approx(0.050)


def test_a_row_follows_the_peers_state() -> None:
    paths, _ = table()
    a = paths.connect("a", 1200, 10.0)
    a.receiver.received_bytes = 123
    routing = {"role": "critical", "peer_role": "bulk"}
    row = paths.snapshot("a", 10.1, routing, PeerStateKind.UP, "silent for 0.1 s")
    keys = list(row)
    assert keys[-7:] == [
        "recv_bytes", "usable", "spurious_losses", "rto_ms", "role", "peer_role", "peer_state"
    ]  # fmt: skip
    assert (row["recv_bytes"], row["usable"], row["role"]) == (123, True, "critical")
    assert (row["state"], row["peer_state"]) == (UP, PeerStateKind.UP)
    # quiet past PEER_QUIET_S, within the path's own timeout (a slow path's): degraded
    a.sender.estimator.on_rtt_sample(0.5, 10.0)
    quiet_at = 10.0 + PEER_QUIET_S + 0.25
    assert a.sender.estimator.silence_timeout_s() > quiet_at - 10.0
    quiet = paths.snapshot("a", quiet_at, routing, PeerStateKind.DEGRADED, "")
    assert (quiet["state"], quiet["state_reason"]) == (DEGRADED, "silent for 1.2 s")
    gone = paths.snapshot("a", 16.0, routing, PeerStateKind.UNREACHABLE, "silent for 6.0 s")
    assert gone["state"] == DOWN
    assert gone["state_reason"] == "peer unreachable: silent for 6.0 s"
    with pytest.raises(KeyError):
        paths.snapshot("b", 10.0, routing, PeerStateKind.UP, "")
