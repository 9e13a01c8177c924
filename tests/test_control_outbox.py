"""ControlOutbox: which path's stream each owed control frame goes on, and when."""

from __future__ import annotations

from collections import deque

from wangate.core.control_outbox import CREDIT_REFRESH_S, ControlOutbox
from wangate.core.events import Event
from wangate.core.frames import (
    MAX_DONE_IDS,
    Ack,
    ControlFrame,
    ControlStreamDecoder,
    Credit,
    MessageRejected,
    MessagesDone,
    MessagesTaken,
    RepairRequested,
    RouteChosen,
)
from wangate.core.inbound import MAX_DONE_PENDING, Reassembly
from wangate.core.path_table import PathTable
from wangate.core.states import PathStateKind

GRANT = 1 << 20


def setup(*names: str) -> tuple[PathTable, Reassembly, ControlOutbox]:
    events: deque[Event] = deque()
    paths = PathTable(events)
    for name in names:
        paths.connect(name, 1200, 0.0)
    inbound = Reassembly(1 << 20, 1 << 20, events)
    return paths, inbound, ControlOutbox(paths.records, inbound)


def frames(data: bytes) -> list[ControlFrame]:
    return list(ControlStreamDecoder().feed(data))


def send(outbox: ControlOutbox, path: str, now: float, route: str | None = None) -> list[object]:
    return list(frames(outbox.to_send(path, now, granted_bytes=GRANT, route=route)))


def test_nothing_owed_sends_nothing() -> None:
    _, _, outbox = setup("a", "b")
    assert outbox.to_send("a", 1.0, granted_bytes=GRANT, route="a") == b""
    assert outbox.to_send("zz", 1.0, granted_bytes=GRANT, route=None) == b""


def test_credit_is_owed_per_path_and_goes_once_on_each() -> None:
    _, _, outbox = setup("a", "b")
    outbox.owe_credit("a")
    assert send(outbox, "b", 1.0) == []
    assert send(outbox, "a", 1.0) == [Credit(GRANT)]
    assert send(outbox, "a", 1.1) == []
    outbox.owe_credit_everywhere()
    assert outbox.credit_owed == {"a", "b"}
    assert send(outbox, "b", 1.2) == [Credit(GRANT)]
    assert send(outbox, "a", 1.2) == [Credit(GRANT)]


def test_a_paths_acks_go_on_its_own_stream_with_credit_refreshed_along() -> None:
    paths, _, outbox = setup("a", "b")
    outbox.owe_credit("a")
    send(outbox, "a", 1.0)  # credit sent on a at 1.0
    paths.records["a"].receiver.on_datagram(5, 500, 1.5, ack_within_s=0.0)
    assert send(outbox, "b", 1.5) == []  # b owes no ack, a's is not b's
    assert send(outbox, "a", 1.5) == [Ack(500, 0, ((5, 5),))]
    paths.records["a"].receiver.on_datagram(6, 600, 1.0 + CREDIT_REFRESH_S, ack_within_s=0.0)
    assert send(outbox, "a", 1.0 + CREDIT_REFRESH_S) == [Ack(600, 0, ((6, 6),)), Credit(GRANT)]
    # a path that never sent credit refreshes it with its first frame
    paths.records["b"].receiver.on_datagram(1, 100, 2.0, ack_within_s=0.0)
    assert send(outbox, "b", 2.0) == [Ack(100, 0, ((1, 1),)), Credit(GRANT)]


def test_the_route_goes_on_the_route_only() -> None:
    _, _, outbox = setup("a", "b")
    outbox.owe_route()
    assert send(outbox, "a", 1.0, route=None) == []
    assert send(outbox, "a", 1.0, route="b") == []
    assert outbox.route_owed
    assert send(outbox, "b", 1.0, route="b") == [RouteChosen("b"), Credit(GRANT)]
    assert not outbox.route_owed
    assert send(outbox, "b", 1.1, route="b") == []


def test_end_to_end_frames_go_on_the_route_in_order_rejected_repair_done_taken() -> None:
    _, inbound, outbox = setup("a", "b")
    inbound.rejections.append(MessageRejected(4, 2, "no"))
    inbound.repair_requests.append(RepairRequested(5, (0, 1)))
    inbound.done_pending.update(dict.fromkeys((6, 7)))
    outbox.owe_taken(3)
    outbox.owe_taken(8)
    assert send(outbox, "a", 1.0, route="b") == []  # not the end-to-end path
    assert send(outbox, "b", 1.0, route="b") == [
        MessageRejected(4, 2, "no"),
        RepairRequested(5, (0, 1)),
        MessagesDone((6, 7)),
        MessagesTaken((3, 8)),
        Credit(GRANT),
    ]
    assert send(outbox, "b", 1.1, route="b") == []


def test_without_a_route_end_to_end_frames_take_the_fastest_open_path() -> None:
    paths, _, outbox = setup("a", "b", "c")
    paths.records["a"].sender.estimator.on_rtt_sample(0.050, 1.0)
    paths.records["b"].sender.estimator.on_rtt_sample(0.030, 1.0)
    paths.records["c"].sender.estimator.on_rtt_sample(0.010, 1.0)
    paths.move("c", paths.records["c"], PathStateKind.DOWN, "silent")  # not open
    outbox.owe_taken(1)
    assert send(outbox, "c", 2.0) == [] and send(outbox, "a", 2.0) == []
    assert send(outbox, "b", 2.0) == [MessagesTaken((1,)), Credit(GRANT)]
    # a route that is not open is passed over too
    outbox.owe_taken(2)
    assert send(outbox, "c", 2.1, route="c") == []
    assert send(outbox, "b", 2.1, route="c") == [MessagesTaken((2,))]


def test_with_no_open_path_end_to_end_frames_wait_on_the_first_path() -> None:
    paths, _, outbox = setup("a", "b")
    for name, record in paths.records.items():
        paths.move(name, record, PathStateKind.DOWN, "silent")
    outbox.owe_taken(1)
    assert send(outbox, "b", 1.0) == []
    assert send(outbox, "a", 1.0) == [MessagesTaken((1,)), Credit(GRANT)]


def test_taken_ids_are_bounded_and_sent_in_frames_of_at_most_max_done_ids() -> None:
    _, _, outbox = setup("a")
    for msg_id in range(1, MAX_DONE_PENDING + 10):
        outbox.owe_taken(msg_id)
    assert len(outbox.taken_pending) == MAX_DONE_PENDING
    sent = send(outbox, "a", 1.0)
    taken = [f for f in sent if isinstance(f, MessagesTaken)]
    assert all(len(f.msg_ids) <= MAX_DONE_IDS for f in taken)
    assert [i for f in taken for i in f.msg_ids] == list(range(1, MAX_DONE_PENDING + 1))


def test_end_to_end_frames_a_lost_path_took_go_again_on_another() -> None:
    paths, _, outbox = setup("a", "b")
    outbox.owe_taken(1)
    assert send(outbox, "a", 1.0, route="a") == [MessagesTaken((1,)), Credit(GRANT)]
    outbox.path_lost("b", 1.1)  # b carried none: nothing to send again
    assert outbox.replay == b""
    outbox.path_lost("a", 1.1)
    paths.disconnect("a", paths.records["a"], "closed")
    outbox.owe_taken(2)
    assert send(outbox, "b", 1.2, route="b") == [
        MessagesTaken((1,)),
        MessagesTaken((2,)),
        Credit(GRANT),
    ]
    # sent again, they count as b's now
    outbox.path_lost("b", 1.3)
    assert frames(outbox.replay) == [MessagesTaken((1,)), MessagesTaken((2,))]


def test_a_restarted_peer_forgets_what_to_send_again_and_is_owed_credit_everywhere() -> None:
    _, _, outbox = setup("a", "b")
    outbox.owe_taken(1)
    send(outbox, "a", 1.0, route="a")
    outbox.path_lost("a", 1.1)
    outbox.peer_restarted()
    assert outbox.replay == b"" and outbox.credit_owed == {"a", "b"}
    outbox.path_lost("a", 1.2)
    assert outbox.replay == b""
