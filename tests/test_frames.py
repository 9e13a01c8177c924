"""Wire frames: golden vectors, exact bytes, round trips and every rejection."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.core.frames import (
    CONTROL_HEADER_BYTES,
    MAX_ACK_RANGES,
    MAX_CONTROL_BODY_BYTES,
    MAX_DONE_IDS,
    MAX_FEC_SYMBOLS,
    MAX_MESSAGE_BYTES,
    MAX_MISSING_RANGES,
    MAX_REPAIR_BLOCKS,
    MSG_ID_BITS,
    PROBE_BYTES,
    SEQ_BITS,
    STAMP_BITS,
    STAMP_MASK,
    STAMP_UNIT_S,
    WIRE_VERSION,
    Ack,
    ControlFrame,
    ControlStreamDecoder,
    Credit,
    Hello,
    MessageRejected,
    MessagesDone,
    MessagesTaken,
    ProbeDatagram,
    RangesMissing,
    RepairDatagram,
    RepairRequested,
    RouteChosen,
    ShardDatagram,
    decode_control_body,
    decode_datagram,
    encode_control,
    encode_probe,
    encode_repair,
    encode_shard,
    expand,
    message_header_bytes,
    shard_header_bytes,
    stamp,
    stamp_age_s,
    varint_bytes,
)
from wangate.core.message import MessageHeader, verify_body
from wangate.errors import LocalProtocolError, RemoteProtocolError

VECTORS = Path(__file__).resolve().parent.parent / "proto" / "vectors"


def u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def u16(value: int) -> bytes:
    return value.to_bytes(2, "big")


def repair_datagram(
    *,
    msg_id: int = 9,
    msg_len: int = 100,
    block: int = 1,
    index: int = 3,
    k: int = 4,
    size: int = 16,
    data: bytes | None = None,
    flags: int = 0,
) -> bytes:
    """A repair datagram built by hand; by default valid: 100 bytes in 16-byte symbols
    and k 4 make 7 symbols in blocks of 4 and 3, and index 3 is block 1's first repair.
    ``msg_len`` and ``block`` go as 8-byte varints, ``index`` and ``k`` as u8 (mod 256)."""
    head = bytes([0x80 | flags]) + u32(1) + b"\0\0\x02" + u32(msg_id)
    head += varint8(msg_len) + varint8(block) + bytes([index & 0xFF, k & 0xFF])
    return head + (bytes(size) if data is None else data)


def varint8(value: int) -> bytes:
    """``value`` (< 2^62) as an 8-byte QUIC varint (RFC 9000 §16)."""
    return (value | 3 << 62).to_bytes(8, "big")


def decode_one_control(raw: bytes) -> ControlFrame:
    (frame,) = ControlStreamDecoder().feed(raw)
    return frame


# ------------------------------------------------------------------ golden vectors


def load_vector(path: Path) -> tuple[dict[str, Any], bytes]:
    lines = path.read_text().splitlines()
    (fields_line,) = [line for line in lines if line.startswith("# fields: ")]
    fields = json.loads(fields_line.removeprefix("# fields: "))
    raw = bytes.fromhex(" ".join(line for line in lines if not line.startswith("#")))
    return fields, raw


def frame_from_fields(f: dict[str, Any]) -> object:
    kind = f["type"]
    if kind == "shard":
        data = bytes.fromhex(f["data"])
        return ShardDatagram(
            f["path_seq"],
            f["sent_stamp"],
            f["msg_id"],
            f["msg_len"],
            f["offset"],
            data,
            f["critical"],
        )
    if kind == "probe":
        return ProbeDatagram(f["path_seq"], f["sent_stamp"])
    if kind == "repair":
        data = bytes.fromhex(f["data"])
        return RepairDatagram(
            f["path_seq"],
            f["sent_stamp"],
            f["msg_id"],
            f["msg_len"],
            f["block"],
            f["index"],
            f["k"],
            f["symbol_bytes"],
            data,
            f["critical"],
        )
    if kind == "hello":
        return Hello(f["site"], f["path"], f["instance_id"], f["max_message_bytes"], f["version"])
    if kind == "ack":
        ranges = tuple((first, last) for first, last in f["ranges"])
        return Ack(f["echo_stamp"], f["ack_delay_us"], ranges)
    if kind == "credit":
        return Credit(f["granted_bytes"])
    if kind == "rejected":
        return MessageRejected(f["msg_id"], f["code"], f["reason"])
    if kind == "route":
        return RouteChosen(f["path"])
    if kind == "done":
        return MessagesDone(tuple(f["msg_ids"]))
    if kind == "taken":
        return MessagesTaken(tuple(f["msg_ids"]))
    if kind == "repair_request":
        return RepairRequested(f["msg_id"], tuple(f["blocks"]))
    if kind == "ranges_missing":
        return RangesMissing(f["msg_id"], tuple((start, end) for start, end in f["ranges"]))
    raise AssertionError(f"vector of unknown type {kind}")


VECTOR_FILES = sorted(VECTORS.glob("wire_*.hex"))
CONTROL_TYPES = (
    Hello,
    Ack,
    Credit,
    MessageRejected,
    RouteChosen,
    MessagesDone,
    RepairRequested,
    MessagesTaken,
    RangesMissing,
)


def test_vectors_cover_every_frame_type() -> None:
    kinds = {load_vector(path)[0]["type"] for path in VECTOR_FILES}
    assert kinds == {
        "shard",
        "probe",
        "hello",
        "ack",
        "credit",
        "rejected",
        "route",
        "done",
        "taken",
        "repair_request",
        "ranges_missing",
        "repair",
        "message_body",
    }


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vector_decodes_and_reencodes_exactly(path: Path) -> None:
    fields, raw = load_vector(path)
    if fields["type"] == "message_body":
        header, payload = verify_body(raw)
        expected_header = MessageHeader(
            fields["tag"],
            fields["step"],
            fields["critical"],
            fields["checksum"],
            bytes.fromhex(fields["meta"]),
            fields["job"],
        )
        assert header == expected_header
        assert bytes(payload) == bytes.fromhex(fields["payload"])
        assert raw[0] == fields["version"]
        assert expected_header.encode() + bytes(payload) == raw
        return
    expected = frame_from_fields(fields)
    largest = (fields.get("largest_seq", 0), fields.get("largest_msg_id", 0))
    if isinstance(expected, RepairDatagram):
        decoded = decode_datagram(raw, *largest)
        assert isinstance(decoded, RepairDatagram)
        assert decoded == replace(expected, data=decoded.data)
        assert bytes(decoded.data) == expected.data
        assert len(expected.data) == expected.symbol_bytes
        assert (
            encode_repair(
                expected.path_seq,
                expected.sent_stamp,
                expected.msg_id,
                expected.msg_len,
                expected.block,
                expected.index,
                expected.k,
                expected.data,
                expected.critical,
            )
            == raw
        )
        return
    if isinstance(expected, ShardDatagram | ProbeDatagram):
        decoded = decode_datagram(raw, *largest)
        if isinstance(expected, ShardDatagram):
            assert isinstance(decoded, ShardDatagram)
            assert decoded == ShardDatagram(
                expected.path_seq,
                expected.sent_stamp,
                expected.msg_id,
                expected.msg_len,
                expected.offset,
                decoded.data,
                expected.critical,
            )
            assert bytes(decoded.data) == expected.data
            assert (
                encode_shard(
                    expected.path_seq,
                    expected.sent_stamp,
                    expected.msg_id,
                    expected.msg_len,
                    expected.offset,
                    expected.data,
                    expected.critical,
                )
                == raw
            )
        else:
            assert decoded == expected
            assert encode_probe(expected.path_seq, expected.sent_stamp) == raw
        return
    assert isinstance(expected, CONTROL_TYPES)
    assert decode_one_control(raw) == expected
    assert encode_control(expected) == raw


# ----------------------------------------------------------------- exact bytes


def test_shard_layout() -> None:
    raw = encode_shard(0x0102, 0x0A0B0C, 0x77, 100, 90, b"0123456789", critical=True)
    # type 0x40 | critical, path_seq u32, stamp u24, msg_id u32, msg_len and offset as
    # varints of msg_len's size (100: two bytes, 0x40 prefix)
    head = b"\x41" + u32(0x0102) + b"\x0a\x0b\x0c" + u32(0x77) + b"\x40\x64" + b"\x40\x5a"
    assert raw == head + b"0123456789"
    assert shard_header_bytes(100) == len(head) == 16
    plain = encode_shard(1, 2, 3, 4, 0, b"abcd")
    assert plain == b"\x40" + u32(1) + b"\0\0\x02" + u32(3) + b"\x04\x00" + b"abcd"
    # 4 MiB: 20 bytes (4-byte varints); 2 GiB: 28; the high bits of path_seq and
    # msg_id do not travel
    big = encode_shard(2**40 + 5, 0, 2**33 + 6, 4 << 20, 3 << 20, b"x")
    assert big == b"\x40" + u32(5) + bytes(3) + u32(6) + u32(0x80400000) + u32(0x80300000) + b"x"
    assert shard_header_bytes(4 << 20) == 20 and shard_header_bytes(2 << 30) == 28
    assert shard_header_bytes(16383) == 16 and shard_header_bytes(16384) == 20


def test_probe_layout() -> None:
    assert encode_probe(5, 6) == b"\xc0" + u32(5) + b"\0\0\x06"
    assert encode_probe(2**32 + 5, STAMP_MASK) == b"\xc0" + u32(5) + b"\xff\xff\xff"
    assert PROBE_BYTES == 8


def test_hello_layout() -> None:
    raw = encode_control(Hello("sh", "p1", 9, 1 << 20))
    body = b"\x05" + u64(9) + u64(1 << 20) + b"\x02sh" + b"\x02p1"
    assert raw == b"\x01" + u32(len(body)) + body
    assert CONTROL_HEADER_BYTES == 5 and WIRE_VERSION == 5


def test_ack_layout_and_delay_clamp() -> None:
    raw = encode_control(Ack(123, 456, ((1, 3), (7, 7))))
    body = u32(123) + u32(456) + b"\x00\x02" + u64(1) + u64(3) + u64(7) + u64(7)
    assert raw == b"\x02" + u32(len(body)) + body
    clamped = encode_control(Ack(1, 1 << 40, ((1, 1),)))
    assert clamped[9:13] == b"\xff\xff\xff\xff"
    assert decode_one_control(clamped) == Ack(1, 0xFFFFFFFF, ((1, 1),))
    with pytest.raises(LocalProtocolError, match="not a u24"):
        encode_control(Ack(STAMP_MASK + 1, 0, ((1, 1),)))
    with pytest.raises(RemoteProtocolError, match="ack echoes stamp 16777216, not a u24"):
        decode_one_control(b"\x02" + u32(len(body)) + u32(STAMP_MASK + 1) + body[4:])


def test_credit_and_rejected_layout() -> None:
    assert encode_control(Credit(1 << 33)) == b"\x03" + u32(8) + u64(1 << 33)
    raw = encode_control(MessageRejected(5, 3, "bad"))
    assert raw == b"\x04" + u32(13) + u64(5) + b"\x00\x03" + b"bad"


def test_route_layout() -> None:
    assert encode_control(RouteChosen("fiber-b")) == b"\x05" + u32(8) + b"\x07fiber-b"


def test_repair_layout() -> None:
    raw = encode_repair(0x0102, 0x0A0B0C, 0x77, 100, 1, 3, 4, b"S" * 16, critical=True)
    # type 0x80 | critical, path_seq, stamp, msg_id, msg_len and block varints, index
    # u8, k u8, then the symbol: its size is what is left of the datagram
    head = b"\x81" + u32(0x0102) + b"\x0a\x0b\x0c" + u32(0x77) + b"\x40\x64" + b"\x01"
    assert raw == head + b"\x03\x04" + b"S" * 16
    assert MAX_FEC_SYMBOLS == 256
    assert encode_repair(1, 2, 3, 100, 0, 4, 4, b"S" * 16)[:1] == b"\x80"


def test_header_room_of_a_message() -> None:
    """A message's datagrams are sized by the largest header any of them takes."""
    assert message_header_bytes(4 << 20) == shard_header_bytes(4 << 20) == 20
    # coded: 4 MiB in 1380-byte symbols, k 64: blocks 0..47, one-byte block varint,
    # so a repair header (12 + 4 + 1 + 2 = 19) fits the shards' 20
    assert message_header_bytes(4 << 20, 64, 1400) == 20
    # k 1 makes a block per symbol: block numbers above 16383 take 4 bytes (22)
    assert message_header_bytes(100 << 20, 1, 1400) == 22
    # 100 bytes in 1200-byte datagrams: one block 0 (repair 17 > shard 16)
    assert message_header_bytes(100, 4, 1200) == 17
    for msg_len in (1, 100, 4 << 20, 1 << 33):
        for k in (1, 16, 64, 255):
            head = message_header_bytes(msg_len, k, 1400)
            symbol = 1400 - head
            last_block = (-(-msg_len // symbol) - 1) // k
            repair = len(encode_repair(1, 2, 3, msg_len, last_block, 255, k, bytes(symbol)))
            shard = len(encode_shard(1, 2, 3, msg_len, msg_len - 1, b"x")) - 1 + symbol
            assert max(repair, shard) <= 1400


def test_done_layout() -> None:
    raw = encode_control(MessagesDone((1, 2**64 - 1)))
    assert raw == b"\x06" + u32(16) + u64(1) + u64(2**64 - 1)


def test_repair_request_layout() -> None:
    raw = encode_control(RepairRequested(0x0102, (0, 2**32 - 1)))
    assert raw == b"\x07" + u32(18) + u64(0x0102) + u16(2) + u32(0) + u32(2**32 - 1)


def test_ranges_missing_layout() -> None:
    raw = encode_control(RangesMissing(0x0102, ((0, 1), (7, 2**64 - 1))))
    body = u64(0x0102) + u16(2) + u64(0) + u64(1) + u64(7) + u64(2**64 - 1)
    assert raw == b"\x09" + u32(42) + body


def test_rejected_reason_is_cut_at_1024_bytes() -> None:
    raw = encode_control(MessageRejected(1, 1, "x" * 5000))
    assert len(raw) == CONTROL_HEADER_BYTES + 10 + 1024
    frame = decode_one_control(raw)
    assert frame == MessageRejected(1, 1, "x" * 1024)


def test_rejected_reason_that_is_not_utf8_is_replaced_not_refused() -> None:
    raw = b"\x04" + u32(11) + u64(5) + b"\x00\x01" + b"\xff"
    assert decode_one_control(raw) == MessageRejected(5, 1, "\ufffd")


def test_reserved_flag_bits_are_ignored() -> None:
    shard = bytearray(encode_shard(1, 2, 3, 4, 0, b"abcd"))
    shard[0] |= 0x3E
    decoded = decode_datagram(bytes(shard))
    assert isinstance(decoded, ShardDatagram) and not decoded.critical
    probe = bytearray(encode_probe(1, 2))
    probe[0] |= 0x3F
    assert decode_datagram(bytes(probe)) == ProbeDatagram(1, 2)
    repair = decode_datagram(repair_datagram(flags=0x3E))
    assert isinstance(repair, RepairDatagram) and not repair.critical
    repair = decode_datagram(repair_datagram(flags=0x3F))
    assert isinstance(repair, RepairDatagram) and repair.critical


def test_shard_payload_is_a_view_of_the_datagram() -> None:
    raw = encode_shard(1, 2, 3, 10, 4, b"abcdef")
    decoded = decode_datagram(raw)
    assert isinstance(decoded, ShardDatagram)
    assert isinstance(decoded.data, memoryview) and bytes(decoded.data) == b"abcdef"
    repair = decode_datagram(repair_datagram(data=b"0123456789abcdef"))
    assert isinstance(repair, RepairDatagram)
    assert isinstance(repair.data, memoryview) and bytes(repair.data) == b"0123456789abcdef"


# ------------------------------------------------------------------ round trips

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", fullmatch=True)
u64s = st.integers(0, 2**64 - 1)


stamps = st.integers(0, STAMP_MASK)


@st.composite
def near(draw: st.DrawFn, bits: int, low: int = 0) -> tuple[int, int]:
    """(value, largest seen) with the value within the decoder's window of the largest
    seen + 1: what a sender that never has 2^(bits-1) outstanding produces."""
    value = draw(st.integers(low, 2**62))
    half = 1 << (bits - 1)
    largest = draw(st.integers(max(0, value - half), value + half - 2))
    return value, largest


@given(
    near(SEQ_BITS),
    stamps,
    near(MSG_ID_BITS, low=1),
    st.binary(min_size=1, max_size=64),
    st.one_of(st.integers(0, 1000), st.integers(0, MAX_MESSAGE_BYTES - 64)),
    st.booleans(),
)
def test_shard_round_trip(
    seq: tuple[int, int],
    sent: int,
    msg_id: tuple[int, int],
    data: bytes,
    extra: int,
    critical: bool,
) -> None:
    offset = extra // 2
    msg_len = offset + len(data) + extra - extra // 2
    raw = encode_shard(seq[0], sent, msg_id[0], msg_len, offset, data, critical)
    assert len(raw) == shard_header_bytes(msg_len) + len(data)
    decoded = decode_datagram(raw, seq[1], msg_id[1])
    assert decoded == ShardDatagram(seq[0], sent, msg_id[0], msg_len, offset, data, critical)


@given(near(SEQ_BITS), stamps)
def test_probe_round_trip(seq: tuple[int, int], sent: int) -> None:
    assert decode_datagram(encode_probe(seq[0], sent), seq[1]) == ProbeDatagram(seq[0], sent)


@given(st.integers(0, 2**62), st.integers(1, 62), st.integers(0, 2**62))
def test_expand_finds_the_value_nearest_the_expected(value: int, bits: int, expected: int) -> None:
    """RFC 9000 Appendix A.3: of the values with these low bits, the nearest."""
    window = 1 << bits
    got = expand(value % window, bits, expected)
    assert got % window == value % window
    assert abs(got - expected) <= window // 2 or got < window  # nothing nearer exists
    if abs(value - expected) < window // 2:
        assert got == value


def test_expand_examples() -> None:
    # RFC 9000 Appendix A.3: largest 0xa82f30ea, 16-bit 0x9b32 -> 0xa82f9b32
    assert expand(0x9B32, 16, 0xA82F30EA + 1) == 0xA82F9B32
    assert expand(5, 32, 2**32 - 16 + 1) == 2**32 + 5  # past a wrap
    assert expand(2**32 - 3, 32, 2**32 + 10) == 2**32 - 3  # reordered from before it
    assert expand(0, 32, 1) == 0  # no wrap below zero


@given(st.floats(0, 1e6), st.floats(0, 60))
def test_stamp_age_is_exact_to_a_unit(start_s: float, age_s: float) -> None:
    assert abs(stamp_age_s(start_s + age_s, stamp(start_s)) - age_s) <= 2 * STAMP_UNIT_S
    assert STAMP_BITS == 24 and (STAMP_MASK + 1) * STAMP_UNIT_S > 67


@given(st.integers(0, 2**62 - 1))
def test_varint_sizes(value: int) -> None:
    size = varint_bytes(value)
    assert size == (1 if value < 64 else 2 if value < 16384 else 4 if value < 2**30 else 8)


@st.composite
def repair_symbols(draw: st.DrawFn) -> RepairDatagram:
    """Any valid repair symbol: a message cut into ``size``-byte symbols, blocks of k."""
    size = draw(st.integers(1, 64))
    symbols = draw(st.integers(1, 2000))
    msg_len = (symbols - 1) * size + draw(st.integers(1, size))
    k = draw(st.integers(1, MAX_FEC_SYMBOLS - 1))
    block = draw(st.integers(0, (symbols - 1) // k))
    block_k = min(k, symbols - block * k)
    index = draw(st.integers(block_k, MAX_FEC_SYMBOLS - 1))
    data = draw(st.binary(min_size=size, max_size=size))
    seq, sent = draw(st.integers(0, 2**32 - 1)), draw(stamps)
    msg_id = draw(st.integers(1, 2**31))
    critical = draw(st.booleans())
    return RepairDatagram(seq, sent, msg_id, msg_len, block, index, k, size, data, critical)


def encode_repair_datagram(r: RepairDatagram) -> bytes:
    return encode_repair(
        r.path_seq, r.sent_stamp, r.msg_id, r.msg_len, r.block, r.index, r.k, r.data, r.critical
    )


@given(repair_symbols())
def test_repair_round_trip(repair: RepairDatagram) -> None:
    raw = encode_repair_datagram(repair)
    head = 14 + varint_bytes(repair.msg_len) + varint_bytes(repair.block)
    assert len(raw) == head + repair.symbol_bytes
    decoded = decode_datagram(raw)
    assert isinstance(decoded, RepairDatagram)
    assert decoded == replace(repair, data=decoded.data)
    assert bytes(decoded.data) == repair.data


# mostly values near the limits that matter, now and then anywhere in the field
def mostly(usual: st.SearchStrategy[int], rare: st.SearchStrategy[int]) -> st.SearchStrategy[int]:
    return st.sampled_from((False, False, False, True)).flatmap(lambda r: rare if r else usual)


limits = [MAX_MESSAGE_BYTES - 1, MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 1, 2**62 - 1]


@settings(max_examples=500)
@given(
    mostly(st.sampled_from(range(1, 10)), st.sampled_from([0, 2**31])),
    mostly(st.sampled_from(range(2000)), st.sampled_from(limits)),
    mostly(st.sampled_from(range(20)), st.integers(0, 2**62 - 1)),
    st.integers(0, 255),
    st.integers(0, 255),
    mostly(st.sampled_from(range(1, 41)), st.just(0)),
)
def test_repair_encoder_refuses_exactly_what_the_decoder_refuses(
    msg_id: int, msg_len: int, block: int, index: int, k: int, size: int
) -> None:
    raw = repair_datagram(msg_id=msg_id, msg_len=msg_len, block=block, index=index, k=k, size=size)
    try:
        decoded = decode_datagram(raw)
    except RemoteProtocolError as exc:
        with pytest.raises(LocalProtocolError, match=re.escape(str(exc))):
            encode_repair(1, 2, msg_id, msg_len, block, index, k, bytes(size))
        return
    assert isinstance(decoded, RepairDatagram)
    assert decoded == RepairDatagram(1, 2, msg_id, msg_len, block, index, k, size, decoded.data)
    # the encoder writes the shortest varints; the decoder takes any length (RFC 9000 §16)
    again = decode_datagram(encode_repair(1, 2, msg_id, msg_len, block, index, k, bytes(size)))
    assert again == decoded


control_frames = st.one_of(
    st.builds(Hello, names, names, u64s, u64s),
    st.builds(
        Ack,
        st.integers(0, STAMP_MASK),
        st.integers(0, 2**32 - 1),
        st.lists(
            st.tuples(u64s, st.integers(0, 1000)).map(
                lambda t: (t[0], min(t[0] + t[1], 2**64 - 1))
            ),
            min_size=1,
            max_size=20,
        ).map(tuple),
    ),
    st.builds(Credit, u64s),
    st.builds(MessageRejected, u64s, st.integers(0, 65535), st.text(max_size=100)),
    st.builds(RouteChosen, names),
    st.builds(MessagesDone, st.lists(u64s, min_size=1, max_size=20).map(tuple)),
    st.builds(
        RepairRequested,
        u64s,
        st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20).map(tuple),
    ),
    st.builds(
        RangesMissing,
        u64s,
        st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=40, unique=True)
        .map(lambda ends: sorted(ends)[: len(ends) // 2 * 2])
        .map(lambda ends: tuple(zip(ends[::2], ends[1::2], strict=True))),
    ),
)


@settings(max_examples=300)
@given(st.lists(control_frames, min_size=1, max_size=6), st.lists(st.integers(0, 200)))
def test_control_stream_round_trip_in_any_pieces(
    frames: list[ControlFrame], cuts: list[int]
) -> None:
    stream = b"".join(encode_control(frame) for frame in frames)
    decoder = ControlStreamDecoder()
    decoded: list[ControlFrame] = []
    positions = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    for start, end in pairwise(positions):
        decoded.extend(decoder.feed(stream[start:end]))
    assert decoded == frames


def test_decoder_waits_for_a_whole_frame() -> None:
    raw = encode_control(Credit(77))
    decoder = ControlStreamDecoder()
    for i in range(len(raw) - 1):
        assert decoder.feed(raw[i : i + 1]) == []
    assert decoder.feed(raw[-1:]) == [Credit(77)]
    assert decoder.feed(b"") == []


# ------------------------------------------------------------------- rejections

SHARD_HEAD = b"\x40" + u32(1) + b"\0\0\x02" + u32(3)  # type, path_seq, stamp, msg_id


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "empty datagram"),
        (b"\x13" + bytes(60), "unknown datagram type 0x13"),
        (b"\x00", "unknown datagram type 0x00"),
        (b"\x10" + bytes(41), "unknown datagram type 0x10"),  # a version 1 shard
        (SHARD_HEAD[:11], "shard datagram of 11 bytes is truncated"),
        (SHARD_HEAD, "shard datagram truncated before msg_len"),
        (SHARD_HEAD + b"\x40", "shard datagram truncated inside msg_len"),
        (SHARD_HEAD + b"\x0a", "shard datagram truncated before offset"),
        (SHARD_HEAD + b"\x0a\x80\x00", "shard datagram truncated inside offset"),
        (SHARD_HEAD + varint8(MAX_MESSAGE_BYTES + 1) + b"\0x", "declares a 1099511627777"),
        (SHARD_HEAD + b"\x0a\x08xyz", r"shard \[8, 11\) outside message of 10 bytes"),
        (SHARD_HEAD + b"\x0a" + varint8(2**62 - 1) + b"x", "outside message"),
        (SHARD_HEAD + b"\x0a\x00", r"shard \[0, 0\) outside"),
        (b"\x40" + u32(1) + bytes(3) + u32(0) + b"\x0a\x00x", "shard with message id 0"),
        (encode_probe(1, 2)[:-1], "probe datagram of 7 bytes, expected 8"),
        (encode_probe(1, 2) + b"\x00", "probe datagram of 9 bytes"),
        (b"\x80", "repair datagram of 1 bytes is truncated"),
        (repair_datagram()[:27], "repair datagram truncated inside block"),
        (repair_datagram()[:29], "repair datagram truncated before index and k"),
        (repair_datagram()[:30], "empty repair symbol"),
        (repair_datagram(size=0), "empty repair symbol"),
        (repair_datagram(msg_id=0), "repair symbol for an impossible message"),
        (repair_datagram(msg_len=MAX_MESSAGE_BYTES + 1), "repair symbol for an impossible"),
        (repair_datagram(msg_len=0, block=0, index=4), "repair block 0 past the end"),
        (repair_datagram(k=0), "repair symbol with k=0"),
        (repair_datagram(k=256), "repair symbol with k=0"),  # k is a u8
        (repair_datagram(block=2), "repair block 2 past the end of the message"),
        (repair_datagram(block=2**32 - 1), "repair block 4294967295 past the end"),
        # 64 bytes are exactly 4 symbols: one block, no short one after it
        (repair_datagram(msg_len=64, block=1, index=4), "repair block 1 past the end"),
        # the last block has k_b = 3 sources: its repair indices start at 3, not at k
        (repair_datagram(block=1, index=2), "repair symbol index 2 in a block of 3"),
        (repair_datagram(block=0, index=3), "repair symbol index 3 in a block of 4"),
        (repair_datagram(index=0), "repair symbol index 0 in a block of 3"),
        # a message shorter than one block: its only block has 2 sources
        (repair_datagram(msg_len=20, k=16, block=0, index=1), "index 1 in a block of 2"),
        # the symbol size is the datagram's rest: 15 bytes make 100 bytes 7 symbols too
        (repair_datagram(data=bytes(9)), "repair symbol index 3 in a block of 4"),
    ],
)
def test_datagram_rejections(raw: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        decode_datagram(raw)


@pytest.mark.parametrize(
    ("msg_len", "k", "block", "index", "block_k"),
    [
        (100, 4, 1, 3, 3),  # first repair of the short last block
        (100, 4, 0, 4, 4),  # first repair of a full block
        (100, 4, 1, 255, 3),  # last repair index
        (20, 16, 0, 2, 2),  # a message shorter than one block
        (64, 4, 0, 4, 4),  # a message of whole blocks
        (16, 1, 0, 1, 1),  # one symbol
        (255 * 16, 255, 0, 255, 255),  # k 255 leaves one repair index
        (256 * 16, 255, 1, 1, 1),
    ],
)
def test_repair_bounds_accepted(msg_len: int, k: int, block: int, index: int, block_k: int) -> None:
    decoded = decode_datagram(repair_datagram(msg_len=msg_len, k=k, block=block, index=index))
    assert isinstance(decoded, RepairDatagram)
    assert (decoded.msg_len, decoded.block, decoded.index, decoded.k) == (msg_len, block, index, k)
    below = repair_datagram(msg_len=msg_len, k=k, block=block, index=block_k - 1)
    with pytest.raises(RemoteProtocolError, match=f"index {block_k - 1} in a block of {block_k}$"):
        decode_datagram(below)


def test_repair_bounds_of_the_largest_message() -> None:
    # 2^40 bytes in 2^16-byte symbols: 2^24 symbols, 65793 full blocks of 255 and one of 1
    size = 2**16
    last = repair_datagram(msg_len=MAX_MESSAGE_BYTES, size=size, k=255, block=65793, index=1)
    decoded = decode_datagram(last)
    assert isinstance(decoded, RepairDatagram) and decoded.block == 65793
    cases = [(65793, 0, "repair symbol index 0 in a block of 1"), (65794, 1, "block 65794 past")]
    for block, index, message in cases:
        raw = repair_datagram(msg_len=MAX_MESSAGE_BYTES, size=size, k=255, block=block, index=index)
        with pytest.raises(RemoteProtocolError, match=message):
            decode_datagram(raw)


def test_largest_message_is_accepted() -> None:
    raw = SHARD_HEAD + varint8(MAX_MESSAGE_BYTES) + varint8(MAX_MESSAGE_BYTES - 1) + b"x"
    decoded = decode_datagram(raw)
    assert isinstance(decoded, ShardDatagram) and decoded.msg_len == 1 << 40


HELLO_BODY = b"\x05" + u64(1) + u64(2) + b"\x02bj" + b"\x01a"


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        (0x00, b"", "unknown control frame type 0x00"),
        (0x0A, b"", "unknown control frame type 0x0a"),
        (0xFF, b"", "unknown control frame type 0xff"),
        (0x01, HELLO_BODY[:16], "hello truncated"),
        (0x01, b"\x04" + HELLO_BODY[1:], "peer speaks wire version 4, this gateway speaks 5"),
        (0x01, b"\x00" + HELLO_BODY[1:], "wire version 0"),
        (0x01, HELLO_BODY[:17], "hello truncated before site"),
        (0x01, HELLO_BODY[:18], "hello truncated inside site"),
        (0x01, HELLO_BODY[:20], "hello truncated before path"),
        (0x01, HELLO_BODY[:21], "hello truncated inside path"),
        (0x01, HELLO_BODY + b"\x00", "hello has trailing bytes"),
        (0x01, HELLO_BODY[:17] + b"\x02\xff\xfe" + b"\x01a", "hello site is not UTF-8"),
        (0x01, HELLO_BODY[:17] + b"\x00" + b"\x01a", "hello site '' is not a valid name"),
        (0x01, HELLO_BODY[:17] + b"\x02-x" + b"\x01a", "hello site '-x' is not a valid name"),
        (0x01, HELLO_BODY[:20] + b"\x03a b", "hello path 'a b' is not a valid name"),
        (0x01, HELLO_BODY[:17] + b"\x40" + b"a" * 64 + b"\x01a", "not a valid name"),
        (0x02, u32(1) + u32(0), "ack truncated"),
        (0x02, u32(1) + u32(0) + b"\x00\x00", "ack with 0 ranges"),
        (0x02, u32(1) + u32(0) + b"\x04\x01", "ack with 1025 ranges"),
        (0x02, u32(1) + u32(0) + b"\x00\x01" + u64(1), "does not match its range count"),
        (0x02, u32(1) + u32(0) + b"\x00\x01" + u64(1) + u64(1) + b"\x00", "does not match"),
        (0x02, u32(1) + u32(0) + b"\x00\x01" + u64(5) + u64(4), "ack range 5..4 is reversed"),
        (0x03, u64(1)[:7], "credit frame has the wrong length"),
        (0x03, u64(1) + b"\x00", "credit frame has the wrong length"),
        (0x04, u64(1) + b"\x00", "rejected frame truncated"),
        (0x05, b"", "route truncated before path"),
        (0x05, b"\x03ab", "route truncated inside path"),
        (0x05, b"\x02ab!", "route frame has trailing bytes"),
        (0x05, b"\x02a/", "route path 'a/' is not a valid name"),
        (0x06, b"", "done frame of 0 bytes"),
        (0x06, u64(1)[:7], "done frame of 7 bytes"),
        (0x06, u64(1) + b"\x00", "done frame of 9 bytes"),
        (0x08, b"", "taken frame of 0 bytes"),
        (0x08, u64(1)[:7], "taken frame of 7 bytes"),
        pytest.param(
            0x06, u64(1) * (MAX_DONE_IDS + 1), "done frame of 8200 bytes", id="done-1025-ids"
        ),
        (0x07, b"", "repair request truncated"),
        (0x07, u64(9) + b"\x00", "repair request truncated"),
        (0x07, u64(9) + u16(0), "repair request with 0 blocks"),
        (0x07, u64(9) + u16(0) + u32(1), "repair request with 0 blocks"),
        (0x07, u64(9) + u16(1), "repair request length does not match its block count"),
        (0x07, u64(9) + u16(2) + u32(1), "does not match its block count"),
        (0x07, u64(9) + u16(1) + u32(1) + b"\x00", "does not match its block count"),
        pytest.param(
            0x07,
            u64(9) + u16(MAX_REPAIR_BLOCKS + 1) + u32(0) * (MAX_REPAIR_BLOCKS + 1),
            "repair request with 1025 blocks",
            id="repair-request-1025-blocks",
        ),
        (0x09, u64(9)[:7], "missing-ranges frame truncated"),
        (0x09, u64(9) + u16(0), "names 1..256 ranges"),
        (0x09, u64(9) + u16(1) + u64(0), "does not match its count"),
        (0x09, u64(9) + u16(1) + u64(0) + u64(1) + b"\x00", "does not match its count"),
        (0x09, u64(9) + u16(1) + u64(5) + u64(5), "missing range 5..5 is empty"),
        (0x09, u64(9) + u16(1) + u64(6) + u64(5), "missing range 6..5 is empty, reversed"),
        (0x09, u64(9) + u16(2) + u64(0) + u64(4) + u64(3) + u64(9), "range 3..9 .* out of"),
        (0x09, u64(9) + u16(2) + u64(5) + u64(9) + u64(0) + u64(2), "range 0..2 .* out of"),
        pytest.param(
            0x09,
            u64(9) + u16(257) + b"".join(u64(2 * i) + u64(2 * i + 1) for i in range(257)),
            "names 1..256 ranges",
            id="ranges-missing-257-ranges",
        ),
    ],
)
def test_control_rejections(kind: int, body: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        decode_control_body(kind, body)
    with pytest.raises(RemoteProtocolError, match=message):
        ControlStreamDecoder().feed(bytes([kind]) + u32(len(body)) + body)


def test_longest_names_and_most_ranges_are_accepted() -> None:
    hello = Hello("a" * 63, "b" * 63, 2**64 - 1, 2**64 - 1)
    assert decode_one_control(encode_control(hello)) == hello
    ack = Ack(0, 0, tuple((2 * i, 2 * i) for i in range(MAX_ACK_RANGES)))
    assert decode_one_control(encode_control(ack)) == ack
    done = MessagesDone(tuple(range(MAX_DONE_IDS)))  # id 0 too: unknown ids are ignored
    assert decode_one_control(encode_control(done)) == done
    request = RepairRequested(0, tuple(range(MAX_REPAIR_BLOCKS)))
    assert decode_one_control(encode_control(request)) == request
    missing = RangesMissing(0, tuple((2 * i, 2 * i + 1) for i in range(MAX_MISSING_RANGES)))
    assert decode_one_control(encode_control(missing)) == missing


def test_oversized_control_frame_is_refused_from_its_header() -> None:
    decoder = ControlStreamDecoder()
    assert decoder.feed(b"\x03" + u32(MAX_CONTROL_BODY_BYTES)) == []  # may still come
    with pytest.raises(RemoteProtocolError, match="control frame of 65537 bytes is too large"):
        ControlStreamDecoder().feed(b"\x03" + u32(MAX_CONTROL_BODY_BYTES + 1))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: encode_shard(1, 2, 3, 10, 8, b"xyz"), "past the end of its message"),
        (lambda: encode_control(Hello("b j", "a", 1, 1)), "site 'b j' is not a valid name"),
        (lambda: encode_control(Hello("bj", "", 1, 1)), "path '' is not a valid name"),
        (lambda: encode_control(Hello("bj", "a" * 64, 1, 1)), "not a valid name"),
        (lambda: encode_control(RouteChosen("")), "path '' is not a valid name"),
        (lambda: encode_control(Ack(1, 0, ())), "1..1024 ranges"),
        (lambda: encode_control(Ack(1, 0, ((1, 1),) * 1025)), "1..1024 ranges"),
        (lambda: encode_control(Ack(1, 0, ((5, 4),))), "reversed"),
        (lambda: encode_shard(-1, 2, 3, 10, 0, b"x"), "cannot be encoded"),
        (lambda: encode_probe(2**64, 0), "cannot be encoded"),
        (lambda: encode_probe(1, STAMP_MASK + 1), "cannot be encoded"),
        (lambda: encode_shard(1, -1, 3, 10, 0, b"x"), "cannot be encoded"),
        (lambda: encode_shard(1, 2, 2**64, 10, 0, b"x"), "cannot be encoded"),
        (lambda: encode_control(Credit(-1)), "cannot be encoded"),
        (lambda: encode_control(Credit(2**64)), "cannot be encoded"),
        (lambda: encode_control(Hello("bj", "a", 2**64, 1)), "cannot be encoded"),
        (lambda: encode_control(Ack(1, 0, ((-1, 4),))), "cannot be encoded"),
        (lambda: encode_control(MessageRejected(1, 65536, "x")), "cannot be encoded"),
        (lambda: encode_repair(1, 2, 3, 100, 1, 2, 4, bytes(16)), "index 2 in a block of 3"),
        (lambda: encode_repair(1, 2, 3, 100, 0, 256, 4, bytes(16)), "index 256 in a block of 4"),
        (lambda: encode_repair(1, 2, 3, 100, 2, 4, 4, bytes(16)), "block 2 past the end"),
        (lambda: encode_repair(1, 2, 3, 100, 0, 4, 0, bytes(16)), "repair symbol with k=0"),
        (lambda: encode_repair(1, 2, 3, 100, 0, 255, 256, bytes(16)), "with k=256"),
        (lambda: encode_repair(1, 2, 3, 100, 0, 4, 4, b""), "empty repair symbol"),
        (lambda: encode_repair(1, 2, 0, 100, 0, 4, 4, bytes(16)), "impossible message"),
        (
            lambda: encode_repair(1, 2, 3, MAX_MESSAGE_BYTES + 1, 0, 4, 4, bytes(16)),
            "impossible message",
        ),
        (lambda: encode_repair(-1, 2, 3, 100, 0, 4, 4, bytes(16)), "cannot be encoded"),
        (lambda: encode_repair(1, 2, 3, 2**64, 0, 4, 4, bytes(16)), "impossible message"),
        (lambda: encode_repair(1, 2, 3, 100, -1, 4, 4, bytes(16)), "repair block -1"),
        (lambda: encode_repair(1, 2, 3, 100, 2**32, 4, 4, bytes(16)), "block 4294967296 past"),
        (lambda: encode_repair(1, 2, 3, 100, 0, 65536, 4, bytes(16)), "index 65536 in a block"),
        (lambda: encode_repair(1, 2, 3, 100, 0, 4, 65536, bytes(16)), "with k=65536"),
        (lambda: encode_control(MessagesDone(())), "1..1024 message ids"),
        (lambda: encode_control(MessagesTaken(())), "a taken frame carries 1..1024"),
        (lambda: encode_control(MessagesDone((1,) * 1025)), "1..1024 message ids"),
        (lambda: encode_control(MessagesDone((2**64,))), "cannot be encoded"),
        (lambda: encode_control(MessagesDone((1, -1))), "cannot be encoded"),
        (lambda: encode_control(RepairRequested(1, ())), "1..1024 blocks"),
        (lambda: encode_control(RepairRequested(1, (0,) * 1025)), "1..1024 blocks"),
        (lambda: encode_control(RepairRequested(2**64, (0,))), "cannot be encoded"),
        (lambda: encode_control(RepairRequested(1, (2**32,))), "cannot be encoded"),
        (lambda: encode_control(RepairRequested(1, (0, -1))), "cannot be encoded"),
        (lambda: encode_control(RangesMissing(1, ())), "names 1..256 ranges"),
        (lambda: encode_control(RangesMissing(1, ((0, 1),) * 257)), "names 1..256 ranges"),
        (lambda: encode_control(RangesMissing(1, ((4, 2),))), "range 4..2 is empty, reversed"),
        (lambda: encode_control(RangesMissing(1, ((0, 4), (2, 6)))), "range 2..6 .* out of"),
        (lambda: encode_control(RangesMissing(1, ((0, 2**64),))), "cannot be encoded"),
        (lambda: encode_control(RangesMissing(2**64, ((0, 1),))), "cannot be encoded"),
    ],
)
def test_encoder_rejections(make: Any, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        make()


# ---------------------------------------------------------------------- fuzzing


def mutated(raw: bytes, changes: list[tuple[int, int]], length_change: int) -> bytes:
    """``raw`` with some bytes overwritten and then cut short or extended."""
    out = bytearray(raw)
    for position, value in changes:
        out[position % len(out)] = value
    if length_change < 0:
        return bytes(out[:length_change])
    return bytes(out) + bytes(length_change)


@settings(max_examples=1000)
@given(
    st.one_of(
        st.binary(max_size=100),
        st.binary(max_size=100).map(lambda b: b"\x40" + b),
        st.binary(max_size=100).map(lambda b: b"\x80" + b),
        st.binary(max_size=100).map(lambda b: b"\xc0" + b),
        st.builds(
            mutated,
            repair_symbols().map(encode_repair_datagram),
            st.lists(st.tuples(st.integers(1, 20), st.integers(0, 255))),
            st.integers(-3, 3),
        ),
    )
)
def test_decode_datagram_only_raises_remote_protocol_error(data: bytes) -> None:
    try:
        decoded = decode_datagram(data)
    except RemoteProtocolError:
        return
    assert isinstance(decoded, ShardDatagram | ProbeDatagram | RepairDatagram)


frame_kinds = st.sampled_from([0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08])


@settings(max_examples=1000)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=60),
            st.tuples(frame_kinds, st.binary(max_size=60)).map(
                lambda t: bytes([t[0]]) + u32(len(t[1])) + t[1]
            ),
            st.tuples(frame_kinds, st.integers(0, 2**32 - 1)).map(
                lambda t: bytes([t[0]]) + u32(t[1])
            ),
            st.builds(lambda f: encode_control(f), control_frames),
        ),
        max_size=6,
    )
)
def test_control_decoder_only_raises_remote_protocol_error(chunks: list[bytes]) -> None:
    decoder = ControlStreamDecoder()
    try:
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                assert isinstance(frame, CONTROL_TYPES)
    except RemoteProtocolError:
        pass
