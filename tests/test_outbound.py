"""OutboundQueue.take when the head message has nothing a path can carry."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_a_message_begun_uncut_keeps_its_backlog_exact_once_cut() -> None:
    queue = OutboundQueue(CodingPolicy(k=2, min_repair=0, max_repair=16))
    queue.symbol_bytes = 0  # no path's datagram size known yet: the message starts uncut
    queue.add(OutboundMessage(1, b"h", bytes(39), False))  # 40 bytes
    assert queue.bulk_backlog_bytes == 40
    assert fields(queue.take(7, critical=False)) == (1, 0, 7, -1, -1, False)
    assert queue.bulk_backlog_bytes == 33
    queue.symbol_bytes = queue.largest_datagram_bytes = 10
    pieces, backlog = [], []
    while (piece := queue.take(10, critical=False)) is not None:
        pieces.append(fields(piece))
        backlog.append(queue.bulk_backlog_bytes)
    # the first symbol repeats bytes [0, 7); only its 3 new bytes leave the backlog
    assert pieces == [
        (1, 0, 10, 0, 0, False),
        (1, 10, 20, 0, 1, False),
        (1, 20, 30, 1, 0, False),
        (1, 30, 40, 1, 1, False),
    ]
    assert backlog == [30, 20, 10, 0]
    queue.drop(1)
    assert queue.bulk_backlog_bytes == 0


def backlog_of(queue: OutboundQueue) -> int:
    """Bulk bytes still to send, counted afresh: new bytes and ranges queued again."""
    return sum(
        message.body_len - message.next_offset + sum(end - start for start, end in message.repairs)
        for message in queue.messages.values()
        if not message.critical
    )


OPS = st.lists(
    st.tuples(
        st.sampled_from(["take", "size", "lose", "ack", "poke", "resend", "drop", "add"]),
        st.integers(0, 63),
        st.integers(0, 63),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_bulk_backlog_is_what_is_left_to_send_whatever_happens(
    ops: list[tuple[str, int, int]],
) -> None:
    """Takes at changing sizes (a message begun uncut, then cut), losses, acks, pokes,
    resent ranges and drops in any order: ``bulk_backlog_bytes`` stays exact."""
    queue = OutboundQueue(CodingPolicy(k=2, min_repair=0, max_repair=16))
    queue.symbol_bytes = 0
    queue.largest_datagram_bytes = 24
    sent: list[Piece] = []
    next_id = 1
    queue.add(OutboundMessage(next_id, b"h", bytes(50), False))
    for op, a, b in ops:
        if op == "add":
            next_id += 1
            queue.add(OutboundMessage(next_id, b"h", bytes(a + 1), b % 5 == 0))
        elif op == "size":
            queue.symbol_bytes = 0 if a % 3 == 0 else 8 + a % 16
            queue.largest_datagram_bytes = max(24, queue.symbol_bytes)
        elif op == "take":
            piece = queue.take(8 + a % 24, critical=bool(b % 2))
            if piece is not None:
                sent.append(piece)
        elif sent and op in ("lose", "ack"):
            piece = sent.pop(a % len(sent))
            msg_id = piece.message.msg_id
            if op == "lose":
                queue.mark_lost(msg_id, piece.start, piece.end, piece.block, piece.symbol)
            else:
                queue.mark_acked(msg_id, piece.start, piece.end, piece.block, piece.symbol, now=1.0)
        elif queue.messages:
            message = list(queue.messages.values())[a % len(queue.messages)]
            if op == "poke":
                queue.poke(message.msg_id)
            elif op == "resend":
                queue.resend_ranges(message.msg_id, ((b % message.body_len, message.body_len),))
            elif op == "drop":
                queue.drop(message.msg_id)
        assert queue.bulk_backlog_bytes == backlog_of(queue), (op, a, b)
