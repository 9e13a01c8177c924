"""Where repair symbols are spent: up front only where a round trip would cost time.

A loss in the middle of a long bulk transfer is repaired after it is seen, while the
rest of the message travels (it costs the bytes lost and no time); a block near the end
of its message, near the end of all queued bulk work, or of a critical message gets
its repair symbols with it (a loss there would cost a round trip).
"""

from __future__ import annotations

from tests.fakelink import LinkProfile, SimulatedPair
from tests.test_session import all_done, assert_exactly_once_intact, body_bytes, send_many
from wangate.core.events import MessageDelivered
from wangate.core.frames import DGRAM_REPAIR, DGRAM_TYPE_MASK, decode_datagram, message_header_bytes
from wangate.core.outbound import CodingPolicy, OutboundQueue
from wangate.core.outbound_message import OutboundMessage, Piece

SYMBOL = 100
K = 4  # 400-byte blocks


def queue_with(
    *messages: OutboundMessage, repair_count: int = 2, tail_bytes: int = 450, loss: float = 0.0
) -> OutboundQueue:
    queue = OutboundQueue(CodingPolicy(k=K, min_repair=0, max_repair=16, critical_min_repair=3))
    queue.symbol_bytes = SYMBOL
    queue.repair_count = repair_count
    queue.tail_bytes = tail_bytes
    queue.loss_rate = loss
    for message in messages:
        queue.add(message)
    return queue


def message(msg_id: int, body_len: int, *, critical: bool = False) -> OutboundMessage:
    return OutboundMessage(msg_id, b"h", bytes(body_len - 1), critical)


def drain(queue: OutboundQueue) -> list[Piece]:
    pieces = []
    for critical in (True, False):
        while (piece := queue.take(1200, critical=critical)) is not None:
            pieces.append(piece)
    return pieces


def upfront_repairs(pieces: list[Piece]) -> dict[tuple[int, int], int]:
    """Repair symbols per (message, block), when no loss was reported at all."""
    counts: dict[tuple[int, int], int] = {}
    for piece in pieces:
        if piece.is_repair_symbol:
            key = (piece.message.msg_id, piece.block)
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_only_the_tail_of_a_bulk_message_gets_repair_symbols_up_front() -> None:
    # 2000 bytes = 5 blocks; after them 1600, 1200, 800, 400, 0 bytes of the message
    # remain: with a 450-byte tail, blocks 3 and 4 are its tail
    queue = queue_with(message(1, 2000))
    pieces = drain(queue)
    assert upfront_repairs(pieces) == {(1, 3): 2, (1, 4): 2}
    assert sum(not p.is_repair_symbol for p in pieces) == 20  # every source symbol once
    assert queue.fec_bytes == queue.fec_upfront_bytes == 4 * SYMBOL
    assert (queue.fec_upfront_blocks, queue.fec_mid_blocks) == (2, 3)


# A 450-byte tail is 4 datagrams of 100 bytes; at 20 % loss one of them is lost with
# p = 1 - 0.8**4 = 0.5904. With k = 4 and r repair symbols a block, a message's tail
# gets them up front while the messages that would wait for them, itself included, are
# fewer than p * k / r: 2.36 for r = 1, 1.18 for r = 2.


def test_a_message_tail_gets_repair_symbols_when_the_round_trip_outweighs_the_wait() -> None:
    # message 1's tail: 2 messages wait (itself and message 2) < 2.36
    queue = queue_with(message(1, 2000), message(2, 1200), repair_count=1, loss=0.2)
    assert upfront_repairs(drain(queue)) == {(1, 3): 1, (1, 4): 1, (2, 1): 1, (2, 2): 1}


def test_a_message_tail_goes_without_when_the_messages_behind_would_wait_longer() -> None:
    # r = 2: 2 messages >= 1.18; message 2's tail ends the backlog and gets them anyway
    queue = queue_with(message(1, 2000), message(2, 1200), repair_count=2, loss=0.2)
    assert upfront_repairs(drain(queue)) == {(2, 1): 2, (2, 2): 2}


def test_messages_not_yet_started_count_among_those_that_wait() -> None:
    # r = 1, but a third message waits for credit: 3 messages >= 2.36
    queue = queue_with(message(1, 2000), message(2, 1200), repair_count=1, loss=0.2)
    queue.waiting = [message(3, 400)]
    assert upfront_repairs(drain(queue)) == {(2, 1): 1, (2, 2): 1}


def test_a_message_tail_is_protected_whole_or_not_at_all() -> None:
    # the decision is taken at the tail's first block: a message arriving behind
    # message 1 between its blocks 3 and 4 leaves block 4 as protected as block 3
    queue = queue_with(message(1, 2000), message(2, 1200), repair_count=1, loss=0.2)
    pieces = []
    while len([p for p in pieces if p.block == 3 and p.message.msg_id == 1]) < K + 1:
        piece = queue.take(1200, critical=False)
        assert piece is not None
        pieces.append(piece)
    queue.waiting = [message(3, 400)]
    pieces += drain(queue)
    assert upfront_repairs(pieces) == {(1, 3): 1, (1, 4): 1, (2, 1): 1, (2, 2): 1}


def test_the_end_of_the_backlog_is_a_tail_even_mid_message() -> None:
    # a tail wider than the message's own end: what remains queued decides
    queue = queue_with(message(1, 2000), tail_bytes=900)
    # blocks 2, 3, 4 end with 800, 400 and 0 bytes after them (< 900)
    assert upfront_repairs(drain(queue)) == {(1, 2): 2, (1, 3): 2, (1, 4): 2}


def test_critical_blocks_all_get_repair_symbols_and_at_least_the_critical_minimum() -> None:
    queue = queue_with(message(1, 1600, critical=True), message(2, 1600), repair_count=2)
    counts = upfront_repairs(drain(queue))
    assert {b: n for (m, b), n in counts.items() if m == 1} == {0: 3, 1: 3, 2: 3, 3: 3}
    assert {b: n for (m, b), n in counts.items() if m == 2} == {2: 2, 3: 2}


def test_with_no_loss_measured_no_block_gets_repair_symbols_but_critical_ones() -> None:
    queue = queue_with(message(1, 1600), message(2, 800, critical=True), repair_count=0)
    assert upfront_repairs(drain(queue)) == {(2, 0): 3, (2, 1): 3}


def test_a_lost_mid_transfer_symbol_is_answered_by_exactly_one_repair_symbol() -> None:
    queue = queue_with(message(1, 2000))
    pieces = [queue.take(1200, critical=False) for _ in range(4)]  # block 0's sources
    assert all(p is not None and p.block == 0 and not p.is_repair_symbol for p in pieces)
    lost = pieces[1]
    assert lost is not None
    queue.mark_lost(1, lost.start, lost.end, lost.block, lost.symbol)
    repair = queue.take(1200, critical=False)
    assert repair is not None and repair.is_repair_symbol and repair.block == 0
    assert queue.fec_bytes == SYMBOL and queue.fec_upfront_bytes == 0


def test_a_repair_symbol_a_late_ack_made_unneeded_is_not_sent() -> None:
    queue = queue_with(message(1, 2000))
    pieces = [queue.take(1200, critical=False) for _ in range(4)]  # block 0's sources
    late = pieces[1]
    assert late is not None
    queue.mark_lost(1, late.start, late.end, late.block, late.symbol)
    queue.mark_acked(1, late.start, late.end, late.block, late.symbol, 1.0, declared_lost=True)
    following = queue.take(1200, critical=False)  # block 1's first source, no repair
    assert following is not None and (following.block, following.symbol) == (1, 0)
    assert not following.is_repair_symbol
    assert (queue.fec_bytes, queue.repairs_unneeded) == (0, 1)


# ------------------------------------------------------------ over the fake link

FEC = CodingPolicy(k=32, min_repair=0, max_repair=16)


def lossy(drop: float) -> LinkProfile:
    # no jitter: nothing is reordered, so every loss the sender sees is a real one
    return LinkProfile(delay_s=0.020, drop_rate=drop, rate_bps=40e6)


def repair_symbols_by_block(pair: SimulatedPair) -> dict[tuple[int, int], list[int]]:
    """Every repair symbol that arrived: (message, block) -> symbol indices."""
    seen: dict[tuple[int, int], list[int]] = {}

    def record(data: bytes) -> bytes:
        if data[0] & DGRAM_TYPE_MASK == DGRAM_REPAIR:
            repair = decode_datagram(data)
            seen.setdefault((repair.msg_id, repair.block), []).append(repair.index)
        return data

    pair.tamper = record
    return seen


def test_a_2_percent_lossy_link_costs_the_losses_plus_the_tails_budget() -> None:
    pair = SimulatedPair({"a": lossy(0.02)}, seed=5, coding=FEC)
    repairs = repair_symbols_by_block(pair)
    sizes = [2 << 20, 2 << 20, 2 << 20, 2 << 20]
    sent = send_many(pair, "bj", sizes, seed=5, critical_every=100)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=60)
    assert_exactly_once_intact(pair, "bj", sent)
    status = pair.sessions["bj"].status()
    total = sum(body_bytes(*m) for m in sent.values())
    symbol = 1200 - message_header_bytes(2 << 20, FEC.k, 1200)  # 20: every message's
    assert status["source_bytes"] == total  # no source byte is sent twice
    assert status["repair_bytes"] == 0
    wire = pair.wire["bj"]
    # Each repair symbol sent after the fact answers one lost datagram of its block;
    # the up-front ones are the stated budget: repair_count (at most max_repair) per
    # tail block, and the tail is what the path carries in about one round trip.
    reactive = status["fec_bytes"] - status["fec_upfront_bytes"]
    assert reactive <= wire.datagrams_dropped * symbol
    assert status["fec_upfront_blocks"] * FEC.max_repair * symbol >= status["fec_upfront_bytes"]
    blocks = sum(-(-body_bytes(*m) // (FEC.k * symbol)) for m in sent.values())
    assert status["fec_upfront_blocks"] + status["fec_mid_blocks"] == blocks
    # a 40 Mbit/s, 40 ms round trip path: about 200 kB in flight, 6-8 blocks of a 2 MiB
    # message (55 blocks) are its tail; the rest waits for losses
    assert status["fec_mid_blocks"] >= 0.8 * blocks
    budget = 0.2 * blocks * FEC.max_repair * symbol
    assert status["fec_bytes"] <= wire.datagrams_dropped * symbol + budget
    # In all: the 2 % lost plus the tails' 2 % (four 2 MiB messages, each with its own
    # tail); the same repair count on every block would have cost 15 % (5 per 32).
    assert status["fec_bytes"] < 0.04 * total
    assert status["fec_repair_per_block"] * blocks * symbol > 0.15 * total
    # every block's repair symbols are fresh: none sent twice
    assert all(len(set(s)) == len(s) for s in repairs.values())


def test_the_tail_of_a_message_costs_no_round_trip_on_a_lossy_link() -> None:
    # a lone 1 MiB message: its last blocks carry repair symbols, so the message is done
    # within one round trip and a bit of its last byte leaving, however the tail fares
    pair = SimulatedPair({"a": lossy(0.02)}, seed=9, coding=FEC)
    repairs = repair_symbols_by_block(pair)
    sent = send_many(pair, "bj", [1 << 20], seed=9, critical_every=100)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)
    status = pair.sessions["bj"].status()
    (msg_id,) = sent
    size = body_bytes(*sent[msg_id])
    blocks = -(-size // (FEC.k * (1200 - message_header_bytes(size, FEC.k, 1200))))
    last = blocks - 1
    # the last block got its repair symbols before anything could have been reported lost
    assert len(repairs[(msg_id, last)]) >= status["fec_repair_per_block"] >= 1
    assert status["fec_upfront_blocks"] >= 1
    assert status["fec_mid_blocks"] >= 1


# ------------------------------------------------------------------------ gaps


def test_consecutive_messages_leave_the_paths_no_gap() -> None:
    pair = SimulatedPair({"a": lossy(0.02), "b": lossy(0.0)}, seed=3, coding=FEC)
    sent = send_many(pair, "bj", [1 << 20] * 6, seed=3, critical_every=100)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)
    status = pair.sessions["bj"].status()
    assert (status["send_gaps"], status["send_gap_us"]) == (0, 0)


def test_a_message_handed_over_after_the_paths_ran_dry_counts_as_a_gap() -> None:
    pair = SimulatedPair({"a": lossy(0.0)}, seed=4, coding=FEC)
    first = send_many(pair, "bj", [200_000], seed=4, critical_every=100)
    # run until every byte is out but the receiver has not confirmed it yet
    session = pair.sessions["bj"]
    size = body_bytes(*first[next(iter(first))])
    queue = session._queue
    assert pair.run_until(lambda: queue.source_bytes == size and not queue.has_work(), max_time_s=5)
    pair.run_for(0.015)  # less than the 40 ms round trip: the message is still open
    assert session.status()["messages_in_flight"] == 1
    second = send_many(pair, "bj", [1000], seed=5, critical_every=100)
    status = session.status()
    assert status["send_gaps"] == 1
    # the gap starts when the link, free again after the last datagram (240 µs on the
    # wire), finds nothing to send
    assert 15_000 - 240 <= status["send_gap_us"] <= 15_000
    assert pair.run_until(lambda: all_done(pair, "bj", {**first, **second}), max_time_s=5)


# ------------------------------------------------------- repairs before new bytes


def test_an_older_message_back_for_repair_goes_before_newer_new_bytes() -> None:
    first, second = message(1, 800), message(2, 2000)
    queue = queue_with(first, second, repair_count=0, tail_bytes=0)
    pieces = [queue.take(1200, critical=False) for _ in range(8)]  # all of message 1
    assert all(p is not None and p.message is first for p in pieces)
    assert queue.take(1200, critical=False).message is second  # type: ignore[union-attr]
    lost = pieces[2]
    assert lost is not None
    queue.mark_lost(1, lost.start, lost.end, lost.block, lost.symbol)
    repair = queue.take(1200, critical=False)
    assert repair is not None and repair.message is first and repair.is_repair_symbol


def test_a_late_ack_of_a_piece_declared_lost_counts_it_out_of_flight_once() -> None:
    queue = queue_with(message(1, 2000), repair_count=0, tail_bytes=0)
    pieces = [queue.take(1200, critical=False) for _ in range(4)]  # block 0's sources
    assert all(p is not None for p in pieces)
    late = pieces[0]
    assert late is not None
    queue.mark_lost(1, late.start, late.end, late.block, late.symbol)
    repair = queue.take(1200, critical=False)
    assert repair is not None and repair.is_repair_symbol
    # the "lost" source arrives after all: it and the repair make up for nothing lost
    queue.mark_acked(1, late.start, late.end, late.block, late.symbol, 0.0, declared_lost=True)
    ledger = late.message.blocks[0]
    assert ledger.inflight == 4  # three sources and the repair symbol, still unacked
    # so a loss among them asks for no more than the block then lacks
    other = pieces[1]
    assert other is not None
    queue.mark_lost(1, other.start, other.end, other.block, other.symbol)
    assert ledger.queued == 0  # 1 acked + 3 in flight: the block can still decode


def test_reordering_and_5_percent_loss_deliver_messages_in_order() -> None:
    link = LinkProfile(
        delay_s=0.020, drop_rate=0.05, rate_bps=40e6, jitter_s=0.003, reorder_rate=0.01
    )
    pair = SimulatedPair({"a": link}, seed=6, coding=FEC)
    sent = send_many(pair, "bj", [2 << 20] * 8, seed=6, critical_every=100)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)
    done = [e.msg_id for e in pair.events_of("bj", MessageDelivered)]
    # each message is confirmed before the next: none waits for the later ones to be sent
    assert done == sorted(sent)
