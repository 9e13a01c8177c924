"""OutboundQueue.take when the head message has nothing a path can carry."""

from __future__ import annotations

from wangate.core.outbound import CodingPolicy, OutboundQueue
from wangate.core.outbound_message import OutboundMessage, Piece


def fields(piece: Piece | None) -> tuple[int, int, int, int, int, bool]:
    assert piece is not None
    return (
        piece.message.msg_id,
        piece.start,
        piece.end,
        piece.block,
        piece.symbol,
        piece.is_repair_symbol,
    )


def test_repair_symbols_too_big_for_a_path_do_not_block_later_messages() -> None:
    queue = OutboundQueue(CodingPolicy(k=2, min_repair=0, max_repair=16))
    queue.symbol_bytes = 10
    queue.repair_count = 1
    queue.add(OutboundMessage(1, b"h", bytes(19), False))
    assert fields(queue.take(10, critical=False)) == (1, 0, 10, 0, 0, False)
    assert fields(queue.take(10, critical=False)) == (1, 10, 20, 0, 1, False)
    assert queue.take(5, critical=False) is None  # only a 10-byte repair symbol is left
    queue.symbol_bytes = 5  # a path with smaller datagrams: new messages use smaller symbols
    queue.add(OutboundMessage(2, b"h", bytes(9), False))
    assert fields(queue.take(5, critical=False)) == (2, 0, 5, 0, 0, False)
    # a path that fits it takes the first message's repair symbol, still first in line
    assert fields(queue.take(10, critical=False)) == (1, 0, 0, 0, 2, True)
    assert fields(queue.take(10, critical=False)) == (2, 5, 10, 0, 1, False)


def test_repair_symbols_no_open_path_carries_go_as_byte_ranges() -> None:
    queue = OutboundQueue(CodingPolicy(k=2, min_repair=0, max_repair=16))
    queue.symbol_bytes = queue.largest_datagram_bytes = 10
    message = OutboundMessage(1, b"h", bytes(39), False)  # 40 bytes: blocks [0, 20), [20, 40)
    queue.add(message)
    pieces = [fields(queue.take(10, critical=False)) for _ in range(4)]
    assert pieces == [
        (1, 0, 10, 0, 0, False),
        (1, 10, 20, 0, 1, False),
        (1, 20, 30, 1, 0, False),
        (1, 30, 40, 1, 1, False),
    ]
    queue.mark_acked(1, 0, 10, 0, 0, now=1.0)
    queue.mark_acked(1, 20, 30, 1, 0, now=1.0)
    queue.mark_lost(1, 10, 20, 0, 1)  # block 0 needs one repair symbol of 10 bytes
    queue.largest_datagram_bytes = 8  # the path reconnected with less room
    assert fields(queue.take(8, critical=False)) == (1, 10, 18, -1, -1, False)
    assert fields(queue.take(8, critical=False)) == (1, 18, 20, -1, -1, False)
    assert queue.take(8, critical=False) is None  # [30, 40) is still in flight
    assert not message.repair_work and not message.blocks[0].coded
    queue.mark_acked(1, 10, 18, -1, -1, now=1.1)
    queue.mark_acked(1, 18, 20, -1, -1, now=1.1)
    queue.mark_acked(1, 30, 40, 1, 1, now=1.1)
    assert message.complete


def test_repair_symbols_meant_to_go_with_their_block_are_dropped_when_none_fit() -> None:
    queue = OutboundQueue(CodingPolicy(k=2, min_repair=0, max_repair=16))
    queue.symbol_bytes = queue.largest_datagram_bytes = 10
    queue.repair_count = 1
    message = OutboundMessage(1, b"h", bytes(19), False)
    queue.add(message)
    assert fields(queue.take(10, critical=False)) == (1, 0, 10, 0, 0, False)
    assert fields(queue.take(10, critical=False)) == (1, 10, 20, 0, 1, False)
    assert len(message.repair_work) == 1  # the tail's repair symbol, up front
    queue.largest_datagram_bytes = 8
    assert queue.take(8, critical=False) is None
    assert not message.has_work and not queue.has_work()
    assert message.blocks[0].coded and message.blocks[0].queued == 0
