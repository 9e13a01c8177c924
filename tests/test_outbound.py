"""OutboundQueue.take when the head message has nothing a path can carry."""

from __future__ import annotations

from wangate.core.outbound import CodingPolicy, OutboundMessage, OutboundQueue, Piece


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
