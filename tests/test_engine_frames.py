"""The engine's frames: varints (RFC 9000 §16, §A.1), ACK (§19.3) byte for byte and every
malformed one refused, DATAGRAM (RFC 9221), PADDING, PING, and nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.engine import _engine
from wangate.errors import RemoteProtocolError

FAST = settings(max_examples=300, deadline=None)
VARINT_MAX = 2**62 - 1


def h(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


def parse(data: bytes) -> dict:
    return _engine.parse_frames(data)


def refused(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        _engine.parse_frames(data)


# ------------------------------------------------------------------ varints


@pytest.mark.parametrize(
    ("encoded", "value"),
    [
        # RFC 9000 §A.1
        ("c2197c5eff14e88c", 151288809941952652),
        ("9d7f3e7d", 494878333),
        ("7bbd", 15293),
        ("25", 37),
        ("4025", 37),  # not the shortest, still 37
    ],
)
def test_rfc9000_varint_vectors(encoded: str, value: int) -> None:
    assert _engine.decode_varint(h(encoded) + b"\xff") == (value, len(h(encoded)))
    if encoded != "4025":
        assert _engine.encode_varint(value) == h(encoded)


@pytest.mark.parametrize(
    ("value", "size"),
    [(0, 1), (63, 1), (64, 2), (16383, 2), (16384, 4), (2**30 - 1, 4), (2**30, 8), (VARINT_MAX, 8)],
)
def test_varint_sizes_at_every_boundary(value: int, size: int) -> None:
    encoded = _engine.encode_varint(value)
    assert len(encoded) == size
    assert _engine.decode_varint(encoded) == (value, size)
    for n in range(size):
        with pytest.raises(RemoteProtocolError, match="truncated"):
            _engine.decode_varint(encoded[:n])


def test_varint_range_is_checked() -> None:
    for bad in (2**62, -1, 2**64):
        with pytest.raises(ValueError, match="2\\*\\*62"):
            _engine.encode_varint(bad)
    with pytest.raises(TypeError):
        _engine.encode_varint(1.0)


# ------------------------------------------------------------------ ACK


@pytest.mark.parametrize(
    ("ranges", "delay", "encoded"),
    [
        ([(0, 0)], 0, "02 00 00 00 00"),
        # largest 10, delay 25, one more range, first range 2, gap 1, length 4
        ([(8, 10), (1, 5)], 25, "02 0a 19 01 02 01 04"),
        ([(100, 100), (50, 98), (0, 0)], 64, "02 4064 4040 02 00 00 30 30 00"),
        (
            [(VARINT_MAX - 5, VARINT_MAX)],
            VARINT_MAX,
            "02 ffffffffffffffff ffffffffffffffff 00 05",
        ),
    ],
)
def test_ack_exact_bytes_and_back(ranges: list, delay: int, encoded: str) -> None:
    assert _engine.encode_ack(ranges, delay) == h(encoded)
    assert parse(h(encoded)) == {
        "ack_eliciting": False,
        "ack": {"ack_delay": delay, "ranges": ranges},
        "datagrams": [],
    }


def test_ack_of_32_ranges_round_trips() -> None:
    ranges = [(1000 - 10 * i - 3, 1000 - 10 * i) for i in range(32)]
    encoded = _engine.encode_ack(ranges, 7)
    assert parse(encoded)["ack"] == {"ack_delay": 7, "ranges": ranges}


def test_ack_leaves_the_lowest_ranges_off_when_short_of_room() -> None:
    ranges = [(90, 100), (70, 80), (50, 60), (30, 40)]
    full = _engine.encode_ack(ranges, 3)
    assert len(full) == 1 + 2 + 1 + 1 + 1 + 3 * 2  # largest 100 takes 2 bytes
    assert _engine.encode_ack(ranges, 3, cap=len(full)) == full
    assert _engine.encode_ack(ranges, 3, cap=len(full) - 1) == _engine.encode_ack(ranges[:3], 3)
    assert _engine.encode_ack(ranges, 3, cap=6) == _engine.encode_ack(ranges[:1], 3)
    with pytest.raises(ValueError, match="fits"):
        _engine.encode_ack(ranges, 3, cap=5)


def test_more_ranges_than_kept_are_checked_then_left_off() -> None:
    # 40 ranges of one packet number each, one apart: 200, 198, ..., 122
    frame = h("02 40c8 00 27 00") + h("00 00") * 39
    ack = parse(frame)["ack"]
    assert ack["ranges"] == [(200 - 2 * i, 200 - 2 * i) for i in range(32)]
    # the 40th range goes below zero: refused even though it is not kept
    refused(h("02 40c8 00 27 00") + h("00 00") * 38 + h("4080 00"))


@pytest.mark.parametrize(
    "bad",
    [
        [],
        [(5, 4)],
        [(1, 5), (8, 10)],  # lowest first
        [(5, 6), (3, 4)],  # adjacent: one range, not two
        [(5, 6), (4, 7)],  # overlapping
        [(0, VARINT_MAX + 1)],
        [(i * 3, i * 3 + 1) for i in range(33, 0, -1)],  # 33 ranges
    ],
)
def test_encode_ack_refuses_bad_ranges(bad: list) -> None:
    with pytest.raises((ValueError, TypeError)):
        _engine.encode_ack(bad, 0)


def test_encode_ack_argument_types() -> None:
    with pytest.raises(TypeError):
        _engine.encode_ack([(1, 2, 3)], 0)
    with pytest.raises(TypeError):
        _engine.encode_ack(5, 0)
    with pytest.raises(ValueError):
        _engine.encode_ack([(1, 2)], -1)


@pytest.mark.parametrize(
    "frame",
    [
        "02 05 00 00 06",  # first range below zero
        "02 0a 00 01 02 07 00",  # gap: largest 8 - 7 - 2 < 0
        "02 0a 00 01 02 05 02",  # range length: largest 1, smallest -1
        "02 01 00 01 00 00 00",  # smallest 1: no room for a gap
        "02 00 00 01 00 00 00",  # smallest 0: no room for a gap
        "02 0a 00 ffffffffffffffff 00",  # 2^62 - 1 ranges
        "02 0a 00 03 00 01 00 01 00",  # 3 ranges, room for 2
        "02 0a 00 80000001 00",  # one range, in nothing left
        "02 0a 19 01 02 01 04 02 0a 19 00 00",  # a second ACK
        "03 0a 00 00 00 00 00 00",  # ACK_ECN: not sent here
    ],
)
def test_malformed_acks_are_refused(frame: str) -> None:
    refused(h(frame))


def test_the_smallest_valid_edges_are_accepted() -> None:
    assert parse(h("02 0a 00 01 02 06 00"))["ack"]["ranges"] == [(8, 10), (0, 0)]
    assert parse(h("02 0a 00 01 02 05 01"))["ack"]["ranges"] == [(8, 10), (0, 1)]
    assert parse(h("02 05 00 00 05"))["ack"]["ranges"] == [(0, 5)]


def test_an_ack_truncated_at_every_byte_is_refused() -> None:
    frame = _engine.encode_ack([(2**40, 2**40 + 9), (300, 20000), (0, 5)], 2**20)
    for n in range(1, len(frame)):
        refused(frame[:n])


# ------------------------------------------------------------------ DATAGRAM, PING, PADDING


def test_datagram_frames() -> None:
    assert parse(b"\x30hello") == {"ack_eliciting": True, "ack": None, "datagrams": [b"hello"]}
    assert parse(b"\x30")["datagrams"] == [b""]
    assert parse(b"\x31\x00\x31\x02ab\x01\x30rest") == {
        "ack_eliciting": True,
        "ack": None,
        "datagrams": [b"", b"ab", b"rest"],
    }
    long = bytes(range(256)) * 2
    assert parse(b"\x31" + _engine.encode_varint(len(long)) + long)["datagrams"] == [long]


def test_malformed_datagrams_are_refused() -> None:
    refused(b"\x31\x06hello")  # longer than what is left
    refused(b"\x31")  # no length
    refused(b"\x31\x40")  # a truncated length
    refused(b"\x31" + h("ffffffffffffffff") + b"x")


def test_at_most_16_datagrams() -> None:
    assert len(parse(b"\x31\x01x" * 16)["datagrams"]) == 16
    refused(b"\x31\x01x" * 17)
    refused(b"\x31\x01x" * 16 + b"\x30")


def test_ping_padding_and_what_elicits_an_ack() -> None:
    assert parse(b"\x00") == {"ack_eliciting": False, "ack": None, "datagrams": []}
    assert parse(bytes(1000))["ack_eliciting"] is False
    assert parse(b"\x01")["ack_eliciting"] is True
    assert parse(b"\x00\x01\x00")["ack_eliciting"] is True
    ack = _engine.encode_ack([(1, 3)], 0)
    assert parse(ack + bytes(20))["ack_eliciting"] is False
    assert parse(ack + b"\x01")["ack_eliciting"] is True


@pytest.mark.parametrize(
    "frame_type", [t for t in range(256) if t not in (0x00, 0x01, 0x02, 0x30, 0x31)]
)
def test_every_other_frame_type_is_refused(frame_type: int) -> None:
    refused(bytes([frame_type]) + bytes(30))


def test_no_frames_and_non_minimal_types_are_refused() -> None:
    refused(b"")  # RFC 9000 §12.4: a packet with no frames
    refused(b"\x40\x01")  # PING in two bytes: frame types use the shortest encoding
    refused(b"\x40\x30xyz")


# ------------------------------------------------------------------ fuzzing


@FAST
@given(st.binary(max_size=120))
def test_random_bytes_parse_or_raise_the_documented_error(data: bytes) -> None:
    try:
        out = _engine.parse_frames(data)
    except RemoteProtocolError:
        return
    assert set(out) == {"ack_eliciting", "ack", "datagrams"}
    assert sum(len(d) for d in out["datagrams"]) <= len(data)


@st.composite
def ack_ranges(draw: st.DrawFn) -> list[tuple[int, int]]:
    count = draw(st.integers(1, 32))
    top = draw(st.integers(0, VARINT_MAX))
    ranges: list[tuple[int, int]] = []
    for _ in range(count):
        if top < 0:
            break
        smallest = top - draw(st.integers(0, min(top, 2**40)))
        ranges.append((smallest, top))
        top = smallest - 2 - draw(st.integers(0, 2**40))
    return ranges


@FAST
@given(ack_ranges(), st.integers(0, VARINT_MAX))
def test_any_valid_ack_round_trips(ranges: list[tuple[int, int]], delay: int) -> None:
    encoded = _engine.encode_ack(ranges, delay)
    assert parse(encoded)["ack"] == {"ack_delay": delay, "ranges": ranges}
    for n in range(1, len(encoded)):
        refused(encoded[:n])
