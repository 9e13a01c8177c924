"""FEC bookkeeping: the sender's per-block count of acked symbols, and the moment the
receiver rebuilds a block.

Both are kept incrementally (they run on every datagram); these tests hold them to the
plain definitions: a block has a source when every byte of it is acked, and a block
decodes as soon as it holds k_b distinct symbols, not one shard earlier.
"""

from __future__ import annotations

import random
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.core.coding import BlockLedger, CodingShape
from wangate.core.events import Event
from wangate.core.fec import BlockEncoder
from wangate.core.frames import RepairDatagram, ShardDatagram
from wangate.core.inbound import Reassembly
from wangate.core.message import MessageHeader, message_checksum
from wangate.core.outbound import CodingPolicy, OutboundQueue
from wangate.core.outbound_message import OutboundMessage, Piece
from wangate.core.rangeset import RangeSet

MSG = 7

# ------------------------------------------------------------------ sender


def have_by_scan(ledger: BlockLedger, shape: CodingShape, block: int, acked: RangeSet) -> int:
    """The definition: sources whose bytes are all acked, plus acked repair symbols."""
    sources = sum(acked.covers(*shape.symbol_range(block, i)) for i in range(shape.block_k(block)))
    return sources + len(ledger.acked_repairs)


def assert_counts_exact(message: OutboundMessage) -> None:
    shape = message.shape
    if shape is None:
        return
    for block, ledger in message.blocks.items():
        expected = have_by_scan(ledger, shape, block, message.acked)
        assert ledger.have(shape, block, message.acked) == expected
        assert ledger.shortfall(shape, block, message.acked) == (
            shape.block_k(block) - expected - ledger.inflight - ledger.queued
        )


def coded_queue(
    symbol_bytes: int, k: int, body_len: int, repair_count: int = 1
) -> tuple[OutboundQueue, OutboundMessage]:
    queue = OutboundQueue(CodingPolicy(k=k, min_repair=0, max_repair=16))
    queue.symbol_bytes = symbol_bytes
    queue.repair_count = repair_count
    payload = bytes(range(256)) * (body_len // 256 + 1)
    message = OutboundMessage(MSG, b"h", payload[: body_len - 1], False)
    queue.add(message)
    return queue, message


def take(queue: OutboundQueue, max_bytes: int) -> Piece:
    piece = queue.take(max_bytes, critical=False)
    assert piece is not None
    return piece


def ack(queue: OutboundQueue, piece: Piece) -> None:
    queue.mark_acked(MSG, piece.start, piece.end, piece.block, piece.symbol, 0.0)


def lose(queue: OutboundQueue, piece: Piece) -> None:
    queue.mark_lost(MSG, piece.start, piece.end, piece.block, piece.symbol)


def test_a_split_symbol_counts_once_all_its_ranges_are_acked() -> None:
    queue, message = coded_queue(symbol_bytes=10, k=4, body_len=40)
    first = take(queue, 10)
    part = take(queue, 4)  # the path fits 4 bytes: symbol 1 goes as [10, 14) + [14, 20)
    rest = take(queue, 10)
    third, fourth = take(queue, 10), take(queue, 10)
    assert [(p.start, p.end, p.block, p.symbol) for p in (first, part, rest, third, fourth)] == [
        (0, 10, 0, 0),
        (10, 14, -1, -1),
        (14, 20, -1, -1),
        (20, 30, 0, 2),
        (30, 40, 0, 3),
    ]
    shape = message.shape
    assert shape is not None
    ledger = message.blocks[0]
    counts = []
    for piece in (first, part, third, rest):
        ack(queue, piece)
        counts.append(ledger.have(shape, 0, message.acked))
        assert_counts_exact(message)
    assert counts == [1, 1, 2, 3]
    assert (ledger.acked_sources, ledger.by_range) == ({0, 2}, {1})
    ack(queue, fourth)  # the fourth symbol: k of k, the block is closed
    assert message.blocks == {}
    assert message.complete


def test_a_symbol_split_before_its_block_had_a_ledger_is_counted() -> None:
    queue, message = coded_queue(symbol_bytes=10, k=2, body_len=20)
    part = take(queue, 3)  # symbol 0 split: the block has no ledger yet
    ack(queue, part)
    rest = take(queue, 10)
    assert (rest.start, rest.end, rest.block) == (3, 10, -1)
    ack(queue, rest)
    second = take(queue, 10)  # the block's ledger is made now, after symbol 0 was acked
    shape = message.shape
    assert shape is not None
    ledger = message.blocks[0]
    assert ledger.by_range == {0}
    assert ledger.have(shape, 0, message.acked) == 1
    lose(queue, second)  # one symbol short: exactly one repair symbol is queued
    assert ledger.queued == 1
    repair = take(queue, 10)
    assert (repair.block, repair.symbol, repair.is_repair_symbol) == (0, 2, True)
    ack(queue, repair)
    assert message.blocks == {}
    assert message.complete


def test_poke_takes_a_counted_source_back_until_its_byte_is_acked_again() -> None:
    queue, message = coded_queue(symbol_bytes=10, k=2, body_len=20)
    first, second = take(queue, 10), take(queue, 10)
    ack(queue, first)
    lose(queue, second)
    shape = message.shape
    assert shape is not None
    ledger = message.blocks[0]
    assert ledger.have(shape, 0, message.acked) == 1
    queue.poke(MSG)
    assert ledger.have(shape, 0, message.acked) == 0
    assert_counts_exact(message)
    # the repair symbol queued for the loss waits behind the poked byte
    poked = take(queue, 10)
    assert (poked.start, poked.end, poked.block) == (0, 1, -1)
    ack(queue, poked)
    assert ledger.have(shape, 0, message.acked) == 1
    assert_counts_exact(message)


def test_a_requested_block_is_counted_from_its_ranges() -> None:
    queue, message = coded_queue(symbol_bytes=10, k=2, body_len=40, repair_count=0)
    pieces = [take(queue, 10) for _ in range(4)]
    for piece in pieces:
        ack(queue, piece)
    assert message.blocks == {} and message.complete
    assert queue.repair_blocks(MSG, (1,))
    shape = message.shape
    assert shape is not None
    ledger = message.blocks[1]
    assert not ledger.coded
    assert ledger.have(shape, 1, message.acked) == 0
    resent = take(queue, 15)
    assert (resent.start, resent.end) == (20, 35)
    ack(queue, resent)
    assert ledger.have(shape, 1, message.acked) == 1  # [20, 30) whole, [30, 40) half
    assert_counts_exact(message)


operation = st.one_of(
    st.tuples(st.just("take"), st.integers(1, 12)),
    st.tuples(st.just("ack"), st.integers(0, 1000)),
    st.tuples(st.just("lose"), st.integers(0, 1000)),
    st.tuples(st.just("late_ack"), st.integers(0, 1000)),
    st.tuples(st.just("dup_ack"), st.integers(0, 1000)),
    st.tuples(st.just("repair_data"), st.integers(0, 1000)),
    st.tuples(st.just("poke"), st.just(0)),
    st.tuples(st.just("repair_blocks"), st.integers(0, 15)),
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 8),
    st.integers(1, 5),
    st.integers(1, 70),
    st.integers(0, 3),
    st.lists(operation, max_size=120),
)
def test_the_kept_count_equals_the_scan_over_any_acks_losses_and_splits(
    symbol_bytes: int,
    k: int,
    body_len: int,
    repair_count: int,
    operations: list[tuple[str, int]],
) -> None:
    queue, message = coded_queue(symbol_bytes, k, body_len, repair_count)
    inflight: list[Piece] = []
    lost: list[Piece] = []
    acked: list[Piece] = []
    repairs: list[Piece] = []
    for op, n in operations:
        if op == "take":
            piece = queue.take(n, critical=False)
            if piece is not None:
                inflight.append(piece)
                if piece.is_repair_symbol:
                    repairs.append(piece)
        elif op in ("ack", "lose") and inflight:
            piece = inflight.pop(n % len(inflight))
            (ack if op == "ack" else lose)(queue, piece)
            (acked if op == "ack" else lost).append(piece)
        elif op == "late_ack" and lost:
            piece = lost.pop(n % len(lost))
            ack(queue, piece)
            acked.append(piece)
        elif op == "dup_ack" and acked:
            ack(queue, acked[n % len(acked)])
        elif op == "repair_data" and repairs:
            # a block closed meanwhile gets its ledger back through the encoder
            data = queue.repair_symbol_data(repairs[n % len(repairs)])
            assert len(data) == symbol_bytes
        elif op == "poke":
            queue.poke(MSG)
        elif op == "repair_blocks":
            queue.repair_blocks(MSG, (n,))
        assert_counts_exact(message)
    # everything still out arrives: the message ends acknowledged
    for _ in range(10_000):
        piece = queue.take(symbol_bytes, critical=False)
        if piece is None:
            break
        ack(queue, piece)
        assert_counts_exact(message)
    for piece in inflight:
        ack(queue, piece)
        assert_counts_exact(message)
    assert not queue.has_work()


def ledger_state(message: OutboundMessage) -> object:
    return (
        list(message.acked.ranges()),
        message.acked_at,
        {
            b: (ledger.acked_sources, ledger.acked_repairs, ledger.by_range, ledger.inflight)
            for b, ledger in message.blocks.items()
        },
    )


@given(
    st.integers(1, 8),
    st.integers(1, 40),
    st.integers(0, 3),
    st.randoms(use_true_random=False),
)
def test_a_run_of_symbols_marked_at_once_is_each_marked_alone(
    k: int, symbols: int, repair_count: int, rng: random.Random
) -> None:
    """``mark_acked(..., symbols=n)`` for n consecutive symbols of one block (an ack's
    run, ``SentOutcomes._mark_acked``) leaves the queue as n calls of one would."""
    together, message = coded_queue(10, k, 10 * symbols, repair_count)
    alone, twin = coded_queue(10, k, 10 * symbols, repair_count)
    pieces: list[Piece] = []
    for _ in range(10_000):
        piece, copy = together.take(10, critical=False), alone.take(10, critical=False)
        assert (piece is None) == (copy is None)
        if piece is None:
            break
        pieces.append(piece)
    # cut into runs the ack walk would join: one block, symbols and bytes that follow on
    runs: list[list[Piece]] = []
    for piece in pieces:
        last = runs[-1][-1] if runs else None
        follows = (
            last is not None
            and piece.block == last.block >= 0
            and piece.symbol == last.symbol + 1
            and piece.start == last.end
            and rng.random() < 0.8
        )
        if follows:
            runs[-1].append(piece)
        else:
            runs.append([piece])
    rng.shuffle(runs)
    for run in runs[: rng.randint(0, len(runs))]:
        first, last = run[0], run[-1]
        if first.block >= 0:
            together.mark_acked(
                MSG, first.start, last.end, first.block, first.symbol, 1.0, symbols=len(run)
            )
        else:
            together.mark_acked(MSG, first.start, last.end, -1, -1, 1.0)
        for piece in run:
            alone.mark_acked(MSG, piece.start, piece.end, piece.block, piece.symbol, 1.0)
        assert ledger_state(message) == ledger_state(twin)
        assert_counts_exact(message)


# ---------------------------------------------------------------- receiver


def coded_body(size_bytes: int, seed: int) -> bytes:
    payload = random.Random(seed).randbytes(size_bytes - 30)
    head = MessageHeader("t", 1, False, message_checksum(b"", payload), b"").encode()
    body = head + payload
    assert len(body) > size_bytes - 30
    return body


def repair_datagram(body: bytes, shape: CodingShape, block: int, index: int) -> RepairDatagram:
    encoder = BlockEncoder(shape.block_k(block), shape.symbol_bytes)
    for i in range(shape.block_k(block)):
        lo, hi = shape.symbol_range(block, i)
        encoder.add_source(i, body[lo:hi])
    data = encoder.repair(index)
    return RepairDatagram(0, 0, MSG, len(body), block, index, shape.k, shape.symbol_bytes, data)


def shard(body: bytes, start: int, end: int) -> ShardDatagram:
    return ShardDatagram(0, 0, MSG, len(body), start, body[start:end])


def test_a_block_decodes_at_its_kth_symbol_and_not_one_earlier() -> None:
    body = coded_body(1000, seed=1)
    shape = CodingShape(len(body), 100, 4)
    inbound = Reassembly(1 << 20, 1 << 20, deque())
    # block 0 loses sources 2 and 3; its two repairs come first, a partial shard between
    arrivals: list[ShardDatagram | RepairDatagram] = [
        repair_datagram(body, shape, 0, 4),
        repair_datagram(body, shape, 0, 5),
        shard(body, 0, 100),
        shard(body, 100, 150),  # half of source 1: 3 symbols and a half so far
        shard(body, 300, 340),  # bytes of a lost source do not make it complete either
        shard(body, 150, 200),  # source 1 complete: the fourth symbol
    ]
    decoded_after = []
    for datagram in arrivals:
        if isinstance(datagram, RepairDatagram):
            assert inbound.accept_repair(datagram, 0.0)
        else:
            assert inbound.accept_shard(datagram, 0.0)
        decoded_after.append(inbound.blocks_decoded)
    assert decoded_after == [0, 0, 0, 0, 0, 1]
    message = inbound.inbound[MSG]
    assert list(message.received.ranges()) == [(0, 400)]
    assert bytes(message.body[:400]) == body[:400]
    assert message.coding is not None and message.coding.decoders == {}


@settings(max_examples=150, deadline=None)
@given(
    st.integers(3, 40),
    st.integers(1, 5),
    st.integers(60, 300),
    st.randoms(use_true_random=False),
)
def test_decode_moments_follow_k_distinct_symbols_in_any_arrival_order(
    symbol_bytes: int, k: int, size_bytes: int, rng: random.Random
) -> None:
    body = coded_body(size_bytes, seed=rng.randrange(1 << 30))
    shape = CodingShape(len(body), symbol_bytes, k)
    arrivals: list[tuple[int, ShardDatagram | RepairDatagram]] = []
    for block in range(shape.blocks):
        for i in range(shape.block_k(block)):
            lo, hi = shape.symbol_range(block, i)
            cut = rng.randrange(lo, hi + 1) if rng.random() < 0.3 else hi
            for a, b in ((lo, cut), (cut, hi)):
                if b > a and rng.random() < 0.8:
                    arrivals.append((block, shard(body, a, b)))
        for index in range(shape.block_k(block), shape.block_k(block) + rng.randrange(4)):
            if rng.random() < 0.8:
                arrivals.append((block, repair_datagram(body, shape, block, index)))
    for _ in range(rng.randrange(4)):  # byte ranges across symbols and blocks (range repairs)
        start = rng.randrange(len(body))
        end = min(len(body), start + rng.randrange(1, 3 * symbol_bytes + 2))
        arrivals.append((shape.block_of(start), shard(body, start, end)))
    rng.shuffle(arrivals)
    arrivals += [arrivals[i] for i in range(0, len(arrivals), 5)]  # some duplicates

    inbound = Reassembly(1 << 20, 1 << 20, deque[Event]())
    got = [0] * len(body)  # the model: which bytes are here, which repairs held
    repairs_held: list[set[int]] = [set() for _ in range(shape.blocks)]
    decoded: set[int] = set()

    def complete_sources(block: int) -> int:
        return sum(
            all(got[lo:hi])
            for lo, hi in (shape.symbol_range(block, i) for i in range(shape.block_k(block)))
        )

    for block, datagram in arrivals:
        whole = complete_sources(block) == shape.block_k(block)
        if isinstance(datagram, RepairDatagram):
            inbound.accept_repair(datagram, 0.0)
            if not whole:
                repairs_held[block].add(datagram.index)
            asks = True
        else:
            inbound.accept_shard(datagram, 0.0)
            lo, hi = datagram.offset, datagram.offset + len(datagram.data)
            asks = not all(got[lo:hi])  # a shard with nothing new changes nothing
            got[lo:hi] = [1] * (hi - lo)
        # only the block a datagram starts in is asked whether it decodes now
        count = complete_sources(block) + len(repairs_held[block])
        if asks and not whole and count >= shape.block_k(block) and block not in decoded:
            if complete_sources(block) < shape.block_k(block):
                decoded.add(block)
            lo, hi = shape.block_range(block)
            got[lo:hi] = [1] * (hi - lo)
        assert inbound.blocks_decoded == len(decoded)
        if all(got):
            assert MSG not in inbound.inbound  # verified and delivered
            assert inbound.messages_received == 1
            return
        message = inbound.inbound[MSG]
        assert [message.received.covers(i, i + 1) for i in range(len(body))] == [
            bool(g) for g in got
        ]
        assert [
            bytes(message.body[lo:hi]) == body[lo:hi] for lo, hi in message.received.ranges()
        ] == [True] * len(message.received)
