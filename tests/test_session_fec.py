"""FEC in the session: blocks of source symbols plus repair symbols over the fake link.

Losses are answered with fresh repair symbols for the block that lacks them, never with
the whole message; a block rebuilt wrongly is caught by the message checksum and
resent by range, never delivered.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakelink import LinkProfile, SimulatedPair
from tests.test_session import all_done, assert_exactly_once_intact, body_bytes, send_many
from wangate.core.frames import (
    DGRAM_REPAIR,
    DGRAM_TYPE_MASK,
    ProbeDatagram,
    decode_datagram,
    message_header_bytes,
)
from wangate.core.outbound import CodingPolicy

FEC = CodingPolicy(k=16, min_repair=1, max_repair=16)


def lossy(drop: float, **kw: float) -> LinkProfile:
    return LinkProfile(delay_s=0.020, jitter_s=0.001, drop_rate=drop, rate_bps=40e6, **kw)


def fec_bytes(pair: SimulatedPair, site: str) -> int:
    return pair.sessions[site].status()["fec_bytes"]


def test_clean_link_sends_the_minimum_repair_per_block_and_nothing_else() -> None:
    pair = SimulatedPair({"a": lossy(0.0), "b": lossy(0.0)}, seed=1, coding=FEC)
    sent = send_many(pair, "bj", [300_000], seed=1)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=20)
    assert_exactly_once_intact(pair, "bj", sent)
    status = pair.sessions["bj"].status()
    size = body_bytes(*next(iter(sent.values())))
    symbol = 1200 - message_header_bytes(size, FEC.k, 1200)
    symbols = (size + symbol - 1) // symbol
    blocks = (symbols + 15) // 16
    assert status["fec_bytes"] == blocks * symbol  # one repair symbol per block (the floor)
    assert status["repair_bytes"] == 0
    assert status["source_bytes"] == size


def test_critical_blocks_get_at_least_the_critical_minimum() -> None:
    # k=16, min 1, critical min 3: a bulk and a critical message of 40 symbols (3 blocks)
    coding = CodingPolicy(k=16, min_repair=1, max_repair=16, critical_min_repair=3)
    pair = SimulatedPair({"a": lossy(0.0)}, seed=2, coding=coding)
    repairs: dict[int, int] = {}

    def count_repairs(data: bytes) -> bytes:
        if data[0] & DGRAM_TYPE_MASK == DGRAM_REPAIR:
            msg_id = decode_datagram(data).msg_id
            repairs[msg_id] = repairs.get(msg_id, 0) + 1
        return data

    pair.tamper = count_repairs
    symbol = 1200 - 20  # 40 symbols are under 1 GiB and 16384 blocks: a 20-byte header
    sent = send_many(pair, "bj", [40 * symbol - 200] * 2, seed=3, critical_every=2)
    assert all(message_header_bytes(body_bytes(*m), 16, 1200) == 20 for m in sent.values())
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=20)
    assert_exactly_once_intact(pair, "bj", sent)
    bulk_id, critical_id = sent
    assert not sent[bulk_id][0].critical and sent[critical_id][0].critical
    assert repairs == {bulk_id: 3 * 1, critical_id: 3 * 3}


def test_random_loss_is_repaired_by_fec_without_resending_source_bytes() -> None:
    pair = SimulatedPair({"a": lossy(0.10), "b": lossy(0.10)}, seed=2, coding=FEC)
    sent = send_many(pair, "bj", [1_000_000, 200_000, 7, 50_000], seed=2)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=60)
    assert_exactly_once_intact(pair, "bj", sent)
    status = pair.sessions["bj"].status()
    total = sum(body_bytes(*m) for m in sent.values())
    assert status["repair_bytes"] == 0  # every loss was covered by repair symbols
    assert status["source_bytes"] == total  # nothing sent twice
    assert status["fec_bytes"] < 0.5 * total
    # bounded: one repair symbol per datagram lost, plus each block's up-front budget
    symbols = {
        msg_id: 1200 - message_header_bytes(body_bytes(*m), FEC.k, 1200)
        for msg_id, m in sent.items()
    }
    blocks = sum(-(-body_bytes(*m) // (FEC.k * symbols[msg_id])) for msg_id, m in sent.items())
    budget = blocks * FEC.max_repair
    symbol = min(symbols.values())
    assert status["fec_bytes"] // symbol <= pair.wire["bj"].datagrams_dropped + budget
    assert pair.sessions["sh"].status()["blocks_decoded"] > 0


def test_a_silent_path_with_fec_loses_nothing() -> None:
    pair = SimulatedPair({"a": lossy(0.02), "b": lossy(0.02)}, seed=3, coding=FEC)
    sent = send_many(pair, "bj", [2_000_000], seed=3)
    pair.run_for(0.05)
    pair.set_silent("a", True)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=60)
    assert_exactly_once_intact(pair, "bj", sent)


def test_a_corrupt_rebuilt_block_is_caught_and_resent_not_delivered() -> None:
    pair = SimulatedPair({"a": lossy(0.05), "b": lossy(0.05)}, seed=4, coding=FEC)
    flipped: list[int] = []

    def flip_first_repair_symbol(data: bytes) -> bytes:
        if data[0] & DGRAM_TYPE_MASK == DGRAM_REPAIR and not flipped:
            flipped.append(decode_datagram(data).msg_id)
            return data[:-1] + bytes([data[-1] ^ 0x40])
        return data

    pair.tamper = flip_first_repair_symbol
    sent = send_many(pair, "bj", [400_000, 400_000], seed=4)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=60)
    assert flipped  # the corruption happened...
    assert_exactly_once_intact(pair, "bj", sent)  # ...and nothing corrupt was delivered


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    drop=st.floats(0.0, 0.30),
    reorder=st.floats(0.0, 0.2),
    duplicate=st.floats(0.0, 0.1),
    k=st.sampled_from([1, 4, 16, 32]),
    bursts=st.sampled_from([(0.0, 1.0), (0.01, 4.0), (0.005, 10.0)]),
)
def test_any_loss_pattern_delivers_each_message_once_intact(
    seed: int, drop: float, reorder: float, duplicate: float, k: int, bursts: tuple[float, float]
) -> None:
    profile = LinkProfile(
        delay_s=0.010,
        jitter_s=0.002,
        drop_rate=drop,
        reorder_rate=reorder,
        reorder_delay_s=0.008,
        duplicate_rate=duplicate,
        rate_bps=30e6,
        burst_start_rate=bursts[0],
        mean_burst=bursts[1],
    )
    coding = CodingPolicy(k=k, min_repair=0, max_repair=8)
    pair = SimulatedPair({"a": profile, "b": profile}, seed=seed, coding=coding)
    sizes = [random.Random(seed).randrange(1, 120_000) for _ in range(3)]
    sent = send_many(pair, "bj", sizes, seed=seed)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=120)
    assert_exactly_once_intact(pair, "bj", sent)
    status = pair.sessions["bj"].status()
    total = sum(body_bytes(*m) for m in sent.values())
    assert status["source_bytes"] == total  # never a whole message (or symbol) twice


def test_loss_bursts_are_recovered_without_resending_source_bytes() -> None:
    # bursts of 8 datagrams on average, about 3% of datagrams lost in all
    bursty = LinkProfile(delay_s=0.020, rate_bps=40e6, burst_start_rate=0.004, mean_burst=8.0)
    pair = SimulatedPair({"a": bursty, "b": bursty}, seed=5, coding=FEC)
    sent = send_many(pair, "bj", [3_000_000, 500_000], seed=5)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=60)
    assert_exactly_once_intact(pair, "bj", sent)
    wire = pair.wire["bj"]
    assert wire.datagrams_dropped > 0
    status = pair.sessions["bj"].status()
    assert status["source_bytes"] == sum(body_bytes(*m) for m in sent.values())
    assert status["repair_bytes"] == 0


def test_every_datagram_fills_the_path_and_none_is_larger() -> None:
    """Datagrams are sized by the larger of the message's own shard and repair headers:
    the datagrams with that header are exactly the path's datagram size (every source
    shard of a 300 kB message but its last); nothing is larger (it would never leave)."""
    pair = SimulatedPair({"a": lossy(0.02)}, seed=6, coding=FEC, datagram_bytes=1200)
    sizes: dict[tuple[int, bool], list[int]] = {}

    def record(data: bytes) -> bytes:
        datagram = decode_datagram(data)
        if not isinstance(datagram, ProbeDatagram):
            repair = data[0] & DGRAM_TYPE_MASK == DGRAM_REPAIR
            sizes.setdefault((datagram.msg_id, repair), []).append(len(data))
        return data

    pair.tamper = record
    sent = send_many(pair, "bj", [300_000, 5_000], seed=6)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=20)
    assert_exactly_once_intact(pair, "bj", sent)
    big, small = sent
    assert message_header_bytes(body_bytes(*sent[big]), FEC.k, 1200) == 20
    shards = sizes[(big, False)]
    assert max(shards) == 1200 and shards.count(1200) >= len(shards) - 2
    # its repair header is one byte shorter (block numbers under 64: a 1-byte varint)
    assert set(sizes[(big, True)]) == {1199}
    # a message under 16 KiB: 2-byte varints, a 16-byte shard header, 1184-byte symbols
    assert message_header_bytes(body_bytes(*sent[small]), FEC.k, 1200) == 17
    assert max(sizes[(small, False)]) == 1200 - 1  # 1183-byte symbols + 16
    assert set(sizes[(small, True)]) == {1200}  # + 17
