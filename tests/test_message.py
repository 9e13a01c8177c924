"""Message body header: exact bytes, round trips, checksum, every rejection."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wangate.core.message import (
    HEAD_BYTES,
    MAX_META_BYTES,
    MAX_TAG_BYTES,
    MessageHeader,
    decode_header,
    head_job,
    message_checksum,
    verify_body,
)
from wangate.errors import ChecksumError, LocalProtocolError, RemoteProtocolError


def header_bytes(
    tag: bytes,
    step: int,
    checksum: int,
    meta: bytes,
    flags: int = 0,
    version: int = 2,
    job: bytes = b"default",
) -> bytes:
    return (
        bytes([version, flags])
        + len(tag).to_bytes(2, "big")
        + step.to_bytes(8, "big", signed=True)
        + checksum.to_bytes(4, "big")
        + len(meta).to_bytes(4, "big")
        + bytes([len(job)])
        + job
        + tag
        + meta
    )


def test_exact_encoding() -> None:
    header = MessageHeader("layer0.w", 7, True, 0xDEADBEEF, b"\x01\x02\x03")
    assert header.encode() == header_bytes(b"layer0.w", 7, 0xDEADBEEF, b"\x01\x02\x03", flags=1)
    assert HEAD_BYTES == 21
    assert len(header.encode()) == 21 + 7 + 8 + 3


def test_the_job_travels_after_the_fixed_head() -> None:
    header = MessageHeader("ddp.b0", 3, False, 1, b"", "llama-run3")
    raw = header.encode()
    assert raw == header_bytes(b"ddp.b0", 3, 1, b"", job=b"llama-run3")
    assert raw[20:31] == b"\x0allama-run3"
    assert decode_header(raw + b"xy") == (header, 21 + 10 + 6)
    with pytest.raises(LocalProtocolError, match="not a job name"):
        MessageHeader("t", 0, False, 0, b"", "bad job").encode()


def test_negative_step_and_utf8_tag_length_in_bytes() -> None:
    header = MessageHeader("grad.é", -2, False, 0, b"")
    raw = header.encode()
    assert raw == header_bytes("grad.é".encode(), -2, 0, b"")
    assert raw[2:4] == b"\x00\x07"  # 7 bytes, 6 characters
    assert raw[4:12] == b"\xff" * 7 + b"\xfe"


def test_decode_returns_header_and_payload_offset() -> None:
    header = MessageHeader("t", 1, False, 5, b"mm")
    body = header.encode() + b"PAYLOAD"
    decoded, offset = decode_header(body)
    assert decoded == header
    assert offset == 21 + 7 + 1 + 2
    assert body[offset:] == b"PAYLOAD"
    assert decode_header(memoryview(body)) == (header, offset)
    assert decode_header(bytearray(body)) == (header, offset)


def test_the_job_a_body_names_is_read_from_its_first_bytes_when_they_hold_it() -> None:
    body = MessageHeader("t", 1, False, 5, b"mm", "llama-run3").encode() + b"PAYLOAD"
    assert head_job(body) == "llama-run3"
    assert head_job(memoryview(body)[: HEAD_BYTES + 10]) == "llama-run3"
    assert head_job(body[: HEAD_BYTES + 9]) is None  # the name is cut
    assert head_job(body[: HEAD_BYTES - 1]) is None
    assert head_job(b"\x01" + body[1:]) is None  # another version
    named = bytearray(body)
    named[HEAD_BYTES] = ord("-")  # not a job name
    assert head_job(named) is None
    named[HEAD_BYTES - 1] = 0  # no name at all
    assert head_job(named) is None


def test_checksum_is_crc32_of_meta_then_payload() -> None:
    assert message_checksum(b"meta", b"payload") == zlib.crc32(b"metapayload")
    assert message_checksum(b"", b"") == 0


def test_verify_body_accepts_a_matching_checksum() -> None:
    meta, payload = b"\x57\x43", bytes(range(100))
    header = MessageHeader("x", 3, False, message_checksum(meta, payload), meta)
    decoded, view = verify_body(header.encode() + payload)
    assert decoded == header
    assert isinstance(view, memoryview) and bytes(view) == payload


def test_verify_body_refuses_a_corrupted_payload() -> None:
    meta, payload = b"m", b"abcdef"
    header = MessageHeader("layer9", 4, False, message_checksum(meta, payload), meta)
    body = bytearray(header.encode() + payload)
    body[-1] ^= 0x01
    with pytest.raises(ChecksumError, match=r"message 'layer9' step 4: checksum [0-9a-f]{8}"):
        verify_body(body)
    assert issubclass(ChecksumError, RemoteProtocolError)


def test_reserved_flag_bits_are_ignored() -> None:
    raw = header_bytes(b"t", 0, 0, b"", flags=0xFE)
    header, _ = decode_header(raw)
    assert header.critical is False


def test_checksum_above_32_bits_is_masked() -> None:
    raw = MessageHeader("t", 0, False, (1 << 32) + 5, b"").encode()
    assert raw[12:16] == b"\x00\x00\x00\x05"


JOBS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True)


@given(
    st.text(min_size=1, max_size=50),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    st.binary(max_size=200),
    st.binary(max_size=50),
    JOBS,
)
def test_round_trip(
    tag: str, step: int, critical: bool, checksum: int, meta: bytes, payload: bytes, job: str
) -> None:
    header = MessageHeader(tag, step, critical, checksum, meta, job)
    body = header.encode() + payload
    offset = HEAD_BYTES + len(job) + len(tag.encode()) + len(meta)
    assert decode_header(body) == (header, offset)
    assert offset == len(body) - len(payload)
    assert body[20] == len(job) and body[HEAD_BYTES : HEAD_BYTES + len(job)] == job.encode()
    assert decode_header(body)[0].job == job


@given(st.binary(max_size=120))
def test_decode_header_only_raises_remote_protocol_error(data: bytes) -> None:
    try:
        header, offset = decode_header(data)
    except RemoteProtocolError:
        return
    assert HEAD_BYTES < offset <= len(data)
    assert header.encode() == bytes(data[:offset]) or data[1] & 0xFE


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "message of 0 bytes is shorter than its header"),
        (header_bytes(b"t", 0, 0, b"")[:20], "message of 20 bytes is shorter"),
        (header_bytes(b"t", 0, 0, b"", version=1), "message version 1 is not supported"),
        (header_bytes(b"t", 0, 0, b"", version=3), "message version 3 is not supported"),
        (header_bytes(b"t", 0, 0, b"", job=b""), "job name of 0 bytes"),
        (header_bytes(b"t", 0, 0, b"", job=b"j" * 65), "job name of 65 bytes"),
        (header_bytes(b"t", 0, 0, b"", job=b"a b"), "message job 'a b' is not a job name"),
        (header_bytes(b"t", 0, 0, b"", job=b"\xff"), "is not a job name"),
        (header_bytes(b"t", 0, 0, b"", version=0), "message version 0 is not supported"),
        (header_bytes(b"", 0, 0, b""), "impossible tag or meta size"),
        (header_bytes(b"t" * (MAX_TAG_BYTES + 1), 0, 0, b""), "impossible tag or meta size"),
        (header_bytes(b"t", 0, 0, b"m" * (MAX_META_BYTES + 1)), "impossible tag or meta size"),
        (header_bytes(b"tag", 0, 0, b"meta")[:-1], "runs past the end of the message"),
        (header_bytes(b"\xff\xfe", 0, 0, b""), "message tag is not UTF-8"),
    ],
)
def test_decode_rejections(raw: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        decode_header(raw)


def test_limits_are_inclusive() -> None:
    raw = header_bytes(b"t" * MAX_TAG_BYTES, 0, 0, b"m" * MAX_META_BYTES)
    header, offset = decode_header(raw)
    assert (len(header.tag), len(header.meta), offset) == (1024, 65536, len(raw))
    assert MessageHeader("t" * MAX_TAG_BYTES, 0, False, 0, b"m" * MAX_META_BYTES).encode() == raw


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (MessageHeader("", 0, False, 0, b""), "tag must be 1..1024 bytes"),
        (MessageHeader("t" * 1025, 0, False, 0, b""), "tag must be 1..1024 bytes"),
        (MessageHeader("é" * 513, 0, False, 0, b""), "tag must be 1..1024 bytes"),
        (MessageHeader("t", 0, False, 0, b"m" * 65537), "tensor description over 65536"),
        (MessageHeader("t", 2**63, False, 0, b""), "signed 64-bit"),
        (MessageHeader("t", -(2**63) - 1, False, 0, b""), "signed 64-bit"),
    ],
)
def test_encode_rejections(header: MessageHeader, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        header.encode()
