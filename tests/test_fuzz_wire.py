"""Fuzzing the wire decoders in CI: datagrams, control frames, message bodies, FEC blocks,
reassembly, probe packets, and the metrics endpoint's request parser.

Every input either decodes or raises a ``WangateError``; whatever decodes re-encodes to
itself (``tests/fuzz/targets.py`` holds the checks, shared with the atheris harnesses).
"""

from __future__ import annotations

from collections import deque
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import targets
from tests.fuzz.strategies import mutated, seeds
from wangate.core import frames
from wangate.core.coding import CodingShape
from wangate.core.events import Event, MessageReceived
from wangate.core.fec import MAX_SYMBOLS, BlockDecoder, BlockEncoder
from wangate.core.inbound import Reassembly
from wangate.core.message import MessageHeader, message_checksum
from wangate.errors import LocalProtocolError, RemoteProtocolError
from wangate.probe import packets

WIRE = ["datagram", "control_stream", "message_body", "fec_block", "reassembly", "probe_packet"]
WIRE += ["metrics_request_head"]
FAST = settings(max_examples=100, deadline=None)
u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", fullmatch=True)


@pytest.mark.parametrize("target", WIRE)
@FAST
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_wangate_errors(target: str, data: bytes) -> None:
    targets.run(target, data)


@pytest.mark.parametrize("target", WIRE)
@FAST
@given(data=st.data())
def test_mutated_golden_vectors_decode_or_raise_wangate_errors(
    target: str, data: st.DataObject
) -> None:
    targets.run(target, data.draw(mutated(seeds(target))))


@pytest.mark.parametrize("target", WIRE)
def test_every_seed_decodes(target: str) -> None:
    for seed in seeds(target):
        targets.TARGETS[target](seed)  # valid inputs: no error at all


@FAST
@given(
    st.integers(0, 2**31),
    st.integers(0, frames.STAMP_MASK),
    st.integers(1, 2**31),
    st.binary(min_size=1, max_size=64),
    u64,
    st.booleans(),
)
def test_shard_round_trip(
    seq: int, sent: int, msg_id: int, data: bytes, extra: int, critical: bool
) -> None:
    msg_len = min(frames.MAX_MESSAGE_BYTES, len(data) + extra)
    offset = msg_len - len(data)
    encoded = frames.encode_shard(seq, sent, msg_id, msg_len, offset, data, critical)
    assert frames.decode_datagram(encoded) == frames.ShardDatagram(
        seq, sent, msg_id, msg_len, offset, data, critical
    )
    targets.datagram(encoded)


control_frames = st.one_of(
    st.builds(frames.Hello, names, names, u64, u64),
    st.builds(
        frames.Ack,
        st.integers(0, frames.STAMP_MASK),
        u32,
        st.lists(st.tuples(u64, u64).map(sorted).map(tuple), min_size=1, max_size=20).map(tuple),
    ),
    st.builds(frames.Credit, u64),
    st.builds(frames.MessagesDone, st.lists(u64, min_size=1, max_size=30).map(tuple)),
    st.builds(frames.RepairRequested, u64, st.lists(u32, min_size=1, max_size=30).map(tuple)),
    st.builds(frames.RouteChosen, names),
    st.builds(frames.MessageRejected, u64, st.integers(0, 65535), st.text(max_size=40)),
    st.builds(frames.MessagesTaken, st.lists(u64, min_size=1, max_size=30).map(tuple)),
    st.builds(
        frames.RangesMissing,
        u64,
        st.lists(u64, min_size=2, max_size=30, unique=True)
        .map(lambda ends: sorted(ends)[: len(ends) // 2 * 2])
        .map(lambda ends: tuple(zip(ends[::2], ends[1::2], strict=True))),
    ),
)


@FAST
@given(st.lists(control_frames, min_size=1, max_size=5), st.binary(max_size=8))
def test_control_frames_round_trip_in_any_cut(
    sent: list[frames.ControlFrame], sizes: bytes
) -> None:
    stream = b"".join(frames.encode_control(frame) for frame in sent)
    assert frames.ControlStreamDecoder().feed(stream) == sent
    targets.control_stream(bytes([len(sizes)]) + sizes + stream)


@FAST
@given(
    st.text(min_size=1, max_size=40).filter(lambda tag: len(tag.encode()) <= 1024),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.binary(max_size=64),
    st.binary(max_size=64),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True),
)
def test_message_body_round_trip(
    tag: str, step: int, critical: bool, meta: bytes, payload: bytes, job: str
) -> None:
    header = MessageHeader(tag, step, critical, message_checksum(meta, payload), meta, job)
    body = header.encode() + payload
    targets.message_body(b"\x00" + body)


@FAST
@given(st.sampled_from(list(packets.PacketKind)), u64, u32, u64, u64, st.integers(0, 200))
def test_probe_packet_round_trip(
    kind: packets.PacketKind, test_id: int, seq: int, sent_ns: int, echo_ns: int, pad: int
) -> None:
    report = kind in (packets.PacketKind.RATE_QUERY, packets.PacketKind.RATE_REPORT)
    if kind in (packets.PacketKind.ECHO_REQUEST, packets.PacketKind.RATE_DATA):
        echo_ns = 0
    if kind == packets.PacketKind.RATE_QUERY:
        echo_ns = 0
    counts = (
        packets.RateCounts(seq, sent_ns, test_id, echo_ns, seq)
        if kind == packets.PacketKind.RATE_REPORT
        else None
    )
    size = packets.REPORT_BYTES if report else packets.HEAD_BYTES + pad
    packet = packets.ProbePacket(kind, test_id, seq, sent_ns, echo_ns, size, counts)
    encoded = packets.encode(packet)
    assert packets.decode(encoded) == packet
    targets.probe_packet(encoded)


@FAST
@given(st.integers(1, 40), st.integers(1, 24), st.randoms(use_true_random=False))
def test_any_k_symbols_rebuild_the_block(k: int, symbol_bytes: int, rng: Random) -> None:
    sources = [rng.randbytes(symbol_bytes) for _ in range(k)]
    encoder = BlockEncoder(k, symbol_bytes)
    for index, source in enumerate(sources):
        encoder.add_source(index, source)
    chosen = rng.sample(range(MAX_SYMBOLS), k)
    symbols = {i: sources[i] if i < k else encoder.repair(i) for i in chosen}
    decoder = BlockDecoder(k, symbol_bytes)
    for index, symbol in symbols.items():
        decoder.add(index, symbol)
    assert decoder.recover() == {i: sources[i] for i in range(k) if i not in symbols}
    targets.fec_block(targets.fec_input(k, symbol_bytes, symbols))


@FAST
@given(
    st.binary(max_size=200),
    st.integers(8, 32),
    st.integers(1, 8),
    st.randoms(use_true_random=False),
)
def test_a_message_with_lost_shards_is_rebuilt_from_repair_symbols(
    payload: bytes, symbol_bytes: int, k: int, rng: Random
) -> None:
    meta = b"\x01"
    header = MessageHeader("t", 3, False, message_checksum(meta, payload), meta)
    body = header.encode() + payload
    shape = CodingShape(len(body), symbol_bytes, k)
    datagrams = []
    for block in range(shape.blocks):
        block_k = shape.block_k(block)
        encoder = BlockEncoder(block_k, symbol_bytes)
        lost = set(rng.sample(range(block_k), rng.randint(0, block_k)))
        for index in range(block_k):
            start, end = shape.symbol_range(block, index)
            encoder.add_source(index, body[start:end])
            if index not in lost:
                datagrams.append(frames.encode_shard(0, 0, 9, len(body), start, body[start:end]))
        for index in rng.sample(range(block_k, MAX_SYMBOLS), len(lost)):
            symbol = encoder.repair(index)
            datagrams.append(frames.encode_repair(0, 0, 9, len(body), block, index, k, symbol))
    rng.shuffle(datagrams)
    events: deque[Event] = deque()
    inbound = Reassembly(4096, 16384, events)
    for datagram in datagrams:
        decoded = frames.decode_datagram(datagram)
        if isinstance(decoded, frames.ShardDatagram):
            assert inbound.accept_shard(decoded, 1.0)
        else:
            assert isinstance(decoded, frames.RepairDatagram)
            assert inbound.accept_repair(decoded, 1.0)
    assert len(events) == 1
    received = events[0]
    assert isinstance(received, MessageReceived)
    assert (received.msg_id, received.header, bytes(received.payload)) == (9, header, payload)
    targets.reassembly(targets.reassembly_input(datagrams))


# ------------------------------------------------------------------ findings


def test_a_name_with_a_trailing_newline_is_refused() -> None:
    # "$" matches before a final newline: route and hello names "bj\n" were accepted.
    with pytest.raises(RemoteProtocolError, match=r"route path 'bj\\n' is not a valid name"):
        frames.ControlStreamDecoder().feed(bytes.fromhex("050000000403626a0a"))
    with pytest.raises(LocalProtocolError, match="is not a valid name"):
        frames.encode_control(frames.RouteChosen("bj\n"))
