"""Shards written into their messages in C (``place_shards``), then handled as runs.

The C half is checked field by field; the session's batched path is checked against
the same datagrams handled one at a time (the per-datagram path is the reference):
after every batch both receivers hold the same state, queued the same events and owe
the same control frames, over seeded reordering, duplicates, drops, garbage and FEC.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.targets import handle_both, receiving_sessions
from tests.test_session_reads import fingerprint
from wangate.core.datagrams import encode_probe, encode_repair, encode_shard
from wangate.core.message import MessageHeader
from wangate.core.outbound import CodingPolicy
from wangate.core.session import PeerSession
from wangate.engine._engine import place_shards

MSG = 1 << 16  # a usual shard's message: 16 KiB .. 1 GiB


def shard(seq: int, stamp: int, offset: int, data: bytes, *, msg_id: int = 7, **kw: Any) -> bytes:
    return encode_shard(seq, stamp, msg_id, kw.pop("msg_len", MSG), offset, data, **kw)


def test_a_run_of_shards_is_written_in_and_summarised() -> None:
    body = bytearray(MSG)
    batch = [shard(5 + i, 100 + 3 * i, 1000 + 1000 * i, bytes([i + 1]) * 1000) for i in range(4)]
    assert place_shards(batch, {7: body}, 4, 6) == [
        # 3 stamp units (12 us) between transit times: the filter from 0, three times
        (7, MSG, 1000, 5000, 5, 8, 4, 4080, False, 100, 109, pytest.approx(2.1123046875e-06))
    ]
    assert body[:1000] == bytes(1000) and body[5000:] == bytes(MSG - 5000)
    assert body[1000:5000] == b"".join(bytes([i + 1]) * 1000 for i in range(4))


def test_what_is_not_a_usual_shard_of_a_placeable_message_comes_back_as_it_came() -> None:
    body = bytearray(MSG)
    others = [
        shard(1, 0, 0, b"a" * 100),  # the first: says where the payload starts
        shard(2, 0, 100, b"b" * 100, msg_id=8),  # no body for it
        shard(3, 0, 100, b"c" * 100, msg_len=MSG * 2),  # a size not its body's
        shard(4, 0, 100, b"d" * 10, msg_len=1000, msg_id=9),  # short varints
        encode_probe(5, 0),
        encode_repair(6, 0, 7, MSG, 0, 16, 16, b"e" * 100),
        b"\x40" + bytes(30),  # msg_id 0
        b"\x40" + bytes(19),  # the header alone
        memoryview(shard(7, 0, 200, b"f" * 10)),  # not bytes
    ]
    placed = place_shards(others, {7: body, 9: bytearray(1000)}, 0, 0)
    assert len(placed) == len(others) and all(a is b for a, b in zip(placed, others, strict=True))
    assert body == bytes(MSG)


def test_a_shard_past_its_message_end_is_left_to_the_session() -> None:
    # 10 bytes at MSG - 5: the session names the error
    bad = shard(1, 0, 100, b"x" * 10)
    bad = bad[:16] + (0x80000000 | (MSG - 5)).to_bytes(4, "big") + bad[20:]
    assert place_shards([bad], {7: bytearray(MSG)}, 0, 0) == [bad]


def test_runs_break_at_gaps_in_offsets_or_sequence_numbers_messages_and_criticality() -> None:
    bodies = {7: bytearray(MSG), 8: bytearray(MSG)}
    batch = [
        shard(1, 0, 100, b"a" * 10),
        shard(2, 0, 110, b"b" * 10),
        shard(3, 0, 130, b"c" * 10),  # offset gap
        shard(5, 0, 140, b"d" * 10),  # sequence gap
        shard(6, 0, 150, b"e" * 10, critical=True),
        shard(7, 0, 160, b"f" * 10, msg_id=8),
        encode_probe(8, 0),
        shard(9, 0, 170, b"g" * 10, msg_id=8),
    ]
    runs = [r[:9] for r in place_shards(batch, bodies, 0, 0) if isinstance(r, tuple)]
    assert runs == [
        (7, MSG, 100, 120, 1, 2, 2, 60, False),
        (7, MSG, 130, 140, 3, 3, 1, 30, False),
        (7, MSG, 140, 150, 5, 5, 1, 30, False),
        (7, MSG, 150, 160, 6, 6, 1, 30, True),
        (8, MSG, 160, 170, 7, 7, 1, 30, False),
        (8, MSG, 170, 180, 9, 9, 1, 30, False),
    ]


def test_a_batch_writes_into_at_most_32_bodies_and_leaves_the_rest_to_the_session() -> None:
    bodies = {msg_id: bytearray(MSG) for msg_id in range(1, 41)}
    # interleaved: each body is looked up once, however often the batch comes back to it
    batch = [shard(i + 1, 0, 100, b"i" * 10, msg_id=1 + i % 2) for i in range(6)]
    batch += [shard(7 + i, 0, 100, b"m" * 10, msg_id=3 + i) for i in range(38)]
    placed = place_shards(batch, bodies, 0, 0)
    runs = [p for p in placed if isinstance(p, tuple)]
    assert [r[0] for r in runs] == [1, 2, 1, 2, 1, 2, *range(3, 33)]
    assert placed[len(runs) :] == batch[len(runs) :]  # messages 33 to 40
    assert all(bodies[m][100:110] == b"m" * 10 for m in range(3, 33))
    assert all(bodies[m] == bytes(MSG) for m in range(33, 41))


def test_truncated_fields_expand_against_the_newest_seen() -> None:
    # sequence numbers and message ids past 2^32, sent as their low 32 bits
    seq, msg_id = (1 << 32) + 5, (1 << 32) + 3
    data = shard(seq, 0, 100, b"z" * 10, msg_id=msg_id)
    [run] = place_shards([data], {msg_id: bytearray(MSG)}, seq - 1, msg_id - 1)
    assert run[:6] == (msg_id, MSG, 100, 110, seq, seq)
    # beyond what the fast path expands: left to the session
    assert place_shards([data], {msg_id: bytearray(MSG)}, 1 << 62, 0) == [data]


def test_jitter_follows_the_stamps_across_their_wrap() -> None:
    stamps = [(1 << 24) - 2, 1, 4]  # +3, +3 units across the wrap
    batch = [shard(1 + i, s, 100 + 10 * i, b"q" * 10) for i, s in enumerate(stamps)]
    [run] = place_shards(batch, {7: bytearray(MSG)}, 0, 0)
    step_s = 3 * 4e-6
    assert run[9:11] == (stamps[0], stamps[-1])
    assert run[11] == pytest.approx(step_s / 16 + (step_s - step_s / 16) / 16)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError):
        place_shards((b"",), {}, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="newest_seq must be an int"):
        place_shards([b""], {1: bytearray(1)}, 0.0, 0)  # type: ignore[arg-type]
    with pytest.raises(BufferError):  # a read-only body
        place_shards([shard(1, 0, 100, b"r" * 10)], {7: bytes(MSG)}, 0, 0)
    empty: list[bytes] = [shard(1, 0, 100, b"r" * 10)]
    assert place_shards(empty, {}, 0, 0) is empty  # nothing placeable: the batch as it is


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=64), max_size=24), st.integers(0, 40))
def test_any_bytes_write_only_inside_the_bodies(datagrams: list[bytes], size: int) -> None:
    # a body shorter than any usual message's: nothing fits, nothing is written
    body = bytearray(size)
    bodies = {i: body for i in range(4)}
    placed = place_shards(datagrams, bodies, 0, 0)
    assert body == bytes(size)
    assert placed == datagrams


# ------------------------------------------------------------ against the reference


def _state(session: PeerSession) -> Any:
    """Everything but the jitter, which the two paths round differently."""
    estimator = session._paths["a"].sender.estimator
    jitter = estimator._jitter_s
    estimator._jitter_s = 0.0
    try:
        return jitter, fingerprint(session)
    finally:
        estimator._jitter_s = jitter


@pytest.mark.parametrize("seed", range(8))
def test_batches_leave_the_state_that_one_datagram_at_a_time_leaves(seed: int) -> None:
    rng = random.Random(seed)
    coding = CodingPolicy(k=8, min_repair=1, max_repair=8) if seed % 2 else None
    bj, one, batched = receiving_sessions(coding)
    sizes = [rng.choice([300, 20_000, 70_000, 250_000]) for _ in range(6)]
    for step, size in enumerate(sizes):
        payload = rng.randbytes(size)
        header = MessageHeader("t", step, step == 2, zlib.crc32(payload), b"")
        bj.submit(header, payload, 0.0)
    stream: list[bytes] = []
    now = 0.001
    while batch := bj.datagrams_to_send("a", now, 64):
        stream += batch
        now += 0.0005
    # the link: drops, duplicates, garbage, and reordering within a few places
    link: list[bytes] = []
    drop = 0.02 if coding else 0.0  # FEC repairs most of what is dropped
    wild = seed == 5
    for data in stream:
        roll = rng.random()
        if roll < drop:
            continue
        link.append(data)
        if roll > 0.97:
            link.append(data)
        if roll < 0.04:  # malformed: cut short, or of no known type
            link.append(data[: rng.randrange(1, 20)] if roll < 0.02 else b"\x00" + data[1:])
        if wild and roll > 0.99:  # any shard header at all: ids from anywhere
            link.append(bytes([0x40]) + rng.randbytes(rng.randrange(30)))
    for i in range(len(link) - 1):
        if rng.random() < 0.1:
            j = min(len(link) - 1, i + rng.randrange(1, 5))
            link[i], link[j] = link[j], link[i]
    now, pos, runs = 0.01, 0, 0
    while pos < len(link):
        batch = link[pos : pos + rng.randrange(1, 80)]
        pos += len(batch)
        now += 0.002
        copies = {k: bytearray(v) for k, v in batched._inbound.placeable.items()}
        runs += sum(isinstance(x, tuple) for x in place_shards(batch, copies, 0, 0))
        handle_both(one, batched, batch, now)
        (jitter_batched, state_batched), (jitter_one, state_one) = _state(batched), _state(one)
        assert state_batched == state_one
        assert jitter_batched == pytest.approx(jitter_one, rel=1e-9, abs=1e-15)
    if not coding:  # (a message a repair symbol reached leaves the fast path)
        assert runs > 5  # the batches did take it
    delivered = batched._inbound.messages_received
    assert delivered == one._inbound.messages_received
    if not wild:
        assert delivered >= 3 if coding else delivered == len(sizes)
