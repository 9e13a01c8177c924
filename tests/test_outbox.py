"""Outbox: credit admission (critical first, with the receiver's slack) and deadlines."""

from __future__ import annotations

from wangate.core.events import SendFailed
from wangate.core.outbound_message import OutboundMessage
from wangate.core.outbox import Outbox


def message(msg_id: int, size: int, *, critical: bool = False, at: float = 0.0) -> OutboundMessage:
    m = OutboundMessage(msg_id, b"", bytes(size), critical)
    m.started_at = at
    return m


def test_critical_goes_first_and_may_use_one_message_of_slack() -> None:
    box = Outbox("sh")
    box.peer_max_message = 1000
    bulk1, bulk2, critical = message(1, 600), message(2, 600), message(3, 900, critical=True)
    for m in (bulk1, bulk2, critical):
        box.add(m, None)
    # no credit yet: the critical message fits in the slack alone (900 <= 0 + 1000)
    started, failed = box.admit()
    assert [m.msg_id for m in started] == [3] and failed == []
    assert box.grant(1000) and not box.grant(900)  # a smaller grant is ignored
    assert box.admit() == ([], [])  # bulk1 needs 900 + 600 <= 1000: not yet
    assert box.started_bytes == 900 and [m.msg_id for m in box.waiting] == [1, 2]
    box.grant(2100)
    started, _ = box.admit()
    assert [m.msg_id for m in started] == [1, 2] and box.waiting_bytes() == 0
    box.reset()
    assert (box.granted_bytes, box.started_bytes) == (0, 0)


def test_a_message_over_the_peers_limit_fails_at_once() -> None:
    box = Outbox("sh")
    box.peer_max_message = 500
    box.add(message(1, 501), None)
    box.add(message(2, 100), None)
    box.grant(10_000)
    started, failed = box.admit()
    assert [m.msg_id for m in started] == [2]
    assert failed == [SendFailed(1, "message of 501 bytes exceeds peer sh's limit of 500")]


def test_deadlines_fail_waiting_and_started_messages_but_not_finished_ones() -> None:
    box = Outbox("sh")
    waiting, sending, finished = message(1, 100, at=10.0), message(2, 100, at=10.0), message(3, 100)
    sending.acked.add(0, 40)
    box.add(waiting, 10.5)
    box.add(sending, 10.2)
    box.add(finished, 10.1)
    box.waiting.remove(sending)
    box.waiting.remove(finished)  # as if admitted; then ``finished`` was confirmed
    in_flight = {2: sending}
    assert box.next_deadline(in_flight) == 10.2  # 10.1 belonged to a finished message
    given_up: list[int] = []
    assert box.expire(10.19, in_flight, given_up.append) == []
    (failure,) = box.expire(10.2, in_flight, given_up.append)
    assert given_up == [2]
    assert failure == SendFailed(
        2, "deadline of 0.2 s passed before sh confirmed it (40 of 100 bytes acknowledged)"
    )
    del in_flight[2]
    (failure,) = box.expire(11.0, in_flight, given_up.append)
    assert failure.msg_id == 1 and "(0 of 100 bytes" in failure.reason
    assert given_up == [2] and not box.waiting and box.next_deadline(in_flight) is None


def test_a_deadline_after_every_byte_was_sent_says_it_may_have_been_taken() -> None:
    box = Outbox("sh")
    sent = message(4, 100, at=10.0)
    sent.next_offset = 100  # all of it went out once, none acknowledged yet
    box.add(sent, 10.3)
    box.waiting.remove(sent)
    (failure,) = box.expire(10.3, {4: sent}, lambda msg_id: None)
    assert failure == SendFailed(
        4,
        "deadline of 0.3 s passed before sh confirmed it (0 of 100 bytes acknowledged), "
        "after all of it was sent (a trainer there may have taken it)",
    )
