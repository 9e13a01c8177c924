"""Asking again for a confirmation (proto/wire.md, "Completion"): the receiver answers a
poke for a message it is still assembling with the ranges it lacks (``Reassembly``),
and the sender sends exactly those again (``OutboundQueue.resend_ranges``)."""

from __future__ import annotations

from collections import deque

from tests.test_inbound import make_body, shard
from wangate.core.events import Event
from wangate.core.frames import MAX_MISSING_RANGES, RangesMissing
from wangate.core.inbound import Reassembly
from wangate.core.outbound import CodingPolicy, OutboundQueue
from wangate.core.outbound_message import OutboundMessage

NOW = 100.0


def receiver() -> Reassembly:
    events: deque[Event] = deque()
    return Reassembly(1 << 20, 1 << 22, events)


def test_a_poke_for_an_incomplete_message_is_answered_with_every_missing_range() -> None:
    inbound = receiver()
    body = make_body(5000, seed=1)
    for start, end in ((0, 1000), (1500, 2000), (2500, 4000)):
        assert inbound.accept_shard(shard(7, body, start, end), NOW)
    assert list(inbound.repair_requests) == []
    assert inbound.accept_shard(shard(7, body, 0, 1), NOW + 2.0)  # acknowledged, as before
    missing = RangesMissing(7, ((1000, 1500), (2000, 2500), (4000, 5000)))
    assert list(inbound.repair_requests) == [missing]
    assert inbound.ranges_missing_sent == 1
    # the duplicate byte is no progress: the idle clock still runs from the last new byte
    assert inbound.next_expiry() == NOW + 60.0


def test_a_poke_that_brings_byte_0_still_names_the_rest() -> None:
    inbound = receiver()
    body = make_body(3000, seed=2)
    assert inbound.accept_shard(shard(3, body, 1, 2000), NOW)
    assert inbound.accept_shard(shard(3, body, 0, 1), NOW + 1.0)
    assert list(inbound.repair_requests) == [RangesMissing(3, ((2000, 3000),))]


def test_a_poke_for_a_message_never_seen_asks_for_all_of_it_but_byte_0() -> None:
    inbound = receiver()
    body = make_body(4000, seed=3)
    assert inbound.accept_shard(shard(9, body, 0, 1), NOW)
    assert list(inbound.repair_requests) == [RangesMissing(9, ((1, 4000),))]


def test_only_a_one_byte_shard_at_offset_0_asks() -> None:
    inbound = receiver()
    body = make_body(4000, seed=4)
    assert inbound.accept_shard(shard(5, body, 0, 1000), NOW)
    assert inbound.accept_shard(shard(5, body, 0, 1000), NOW + 1.0)  # a duplicate
    assert inbound.accept_shard(shard(5, body, 2000, 2001), NOW + 1.0)  # one byte elsewhere
    assert inbound.accept_shard(shard(5, body, 0, 2), NOW + 1.0)
    assert list(inbound.repair_requests) == []
    assert inbound.ranges_missing_sent == 0


def test_a_poke_for_a_delivered_or_rejected_message_is_no_missing_ranges() -> None:
    inbound = receiver()
    body = make_body(2000, seed=5)
    assert inbound.accept_shard(shard(1, body, 0, 2000), NOW)
    assert 1 in inbound.completed
    inbound.take_done(10)
    assert inbound.accept_shard(shard(1, body, 0, 1), NOW + 1.0)
    assert list(inbound.done_pending) == [1]  # "done" again, nothing missing
    assert inbound.accept_shard(shard(2, body, 5, 100), NOW)
    inbound.expire(NOW + 61.0)
    assert 2 in inbound.rejected
    assert inbound.accept_shard(shard(2, body, 0, 1), NOW + 62.0)
    assert list(inbound.repair_requests) == []


def test_a_one_byte_message_is_whole_with_its_only_byte() -> None:
    inbound = receiver()
    assert inbound.accept_shard(shard(4, b"\x00", 0, 1), NOW) is True
    assert list(inbound.repair_requests) == []


def test_the_answer_names_the_first_256_gaps() -> None:
    inbound = receiver()
    body = make_body(4 * 400, seed=6)
    for i in range(400):  # every other pair of bytes: 399 gaps after byte 0's range
        assert inbound.accept_shard(shard(8, body, 4 * i, 4 * i + 2), NOW)
    assert inbound.accept_shard(shard(8, body, 0, 1), NOW + 1.0)
    (answer,) = inbound.repair_requests
    assert isinstance(answer, RangesMissing)
    assert len(answer.ranges) == MAX_MISSING_RANGES
    assert answer.ranges == tuple((4 * i + 2, 4 * i + 4) for i in range(MAX_MISSING_RANGES))


# ---------------------------------------------------------------- the sender


def sent_and_acked(queue: OutboundQueue, message: OutboundMessage, piece_bytes: int) -> None:
    """Take every piece of ``message`` and acknowledge it."""
    while (piece := queue.take(piece_bytes, critical=False)) is not None:
        queue.mark_acked(message.msg_id, piece.start, piece.end, piece.block, piece.symbol, now=NOW)
    assert message.complete and message.acked_at == NOW and message.had_every_byte


def pieces(queue: OutboundQueue, piece_bytes: int) -> list[tuple[int, int, bool]]:
    taken = []
    while (piece := queue.take(piece_bytes, critical=False)) is not None:
        taken.append((piece.start, piece.end, piece.repair))
    return taken


def test_the_sender_sends_exactly_the_missing_ranges_again_by_range() -> None:
    queue = OutboundQueue(CodingPolicy(k=0))
    message = OutboundMessage(1, b"head", bytes(996), False)  # 1000 bytes
    queue.add(message)
    sent_and_acked(queue, message, 100)
    assert queue.resend_ranges(1, ((150, 220), (900, 1000)))
    assert message.acked_at is None and not message.had_every_byte
    assert list(message.acked.ranges()) == [(0, 150), (220, 900)]
    assert pieces(queue, 100) == [(150, 220, True), (900, 1000, True)]
    assert queue.repair_bytes == 170 and queue.ranges_resent == 1


def test_a_coded_block_counted_whole_is_repaired_by_range_from_then_on() -> None:
    queue = OutboundQueue(CodingPolicy(k=4, min_repair=0, max_repair=4))
    queue.symbol_bytes = queue.largest_datagram_bytes = 100
    message = OutboundMessage(2, b"h", bytes(799), False)  # 800 bytes: blocks [0, 400), [400, 800)
    queue.add(message)
    sent_and_acked(queue, message, 100)
    assert message.blocks == {}  # both blocks counted decodable at the receiver
    assert queue.resend_ranges(2, ((450, 550),))
    ledger = message.blocks[1]
    assert not ledger.coded
    assert pieces(queue, 100) == [(450, 550, True)]
    queue.mark_lost(2, 450, 550, -1, -1)  # lost again: the range, not a repair symbol
    assert pieces(queue, 100) == [(450, 550, True)]
    queue.mark_acked(2, 450, 550, -1, -1, now=NOW + 1.0)
    assert message.complete and message.acked_at == NOW + 1.0


def test_bytes_never_sent_and_unknown_messages_are_left_alone() -> None:
    queue = OutboundQueue(CodingPolicy(k=0))
    message = OutboundMessage(3, b"h", bytes(999), False)
    queue.add(message)
    first = queue.take(300, critical=False)
    assert first is not None and (first.start, first.end) == (0, 300)
    queue.mark_acked(3, 0, 300, -1, -1, now=NOW)
    assert queue.resend_ranges(3, ((200, 500), (2000, 3000)))
    assert pieces(queue, 300) == [
        (200, 300, True),
        (300, 600, False),
        (600, 900, False),
        (900, 1000, False),
    ]
    assert queue.resend_ranges(99, ((0, 10),)) is False
