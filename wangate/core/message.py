"""A message body: the header that names it, then the tensor bytes.

A message travels as one body of ``msg_len`` bytes carved into shards by byte offset;
the header is simply the first bytes of that body, so it needs no channel of its own
and is repaired like any other shard.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Final

from wangate.checksum import crc32
from wangate.core.buffer import Buffer
from wangate.core.jobs import DEFAULT_JOB, JOB_NAME, MAX_JOB_BYTES
from wangate.errors import ChecksumError, LocalProtocolError, RemoteProtocolError

MESSAGE_VERSION: Final = 2  # 2: the job's name after the fixed head (version 1 had none)
MAX_TAG_BYTES: Final = 1024
MAX_META_BYTES: Final = 64 * 1024
FLAG_CRITICAL: Final = 0x01

# version u8, flags u8, tag_len u16, step i64, checksum u32, meta_len u32, job_len u8
_HEAD: Final = struct.Struct("!BBHqIIB")
HEAD_BYTES: Final = _HEAD.size  # 21
# a body's bytes before the payload, at most
MAX_HEADER_BYTES: Final = HEAD_BYTES + MAX_JOB_BYTES + MAX_TAG_BYTES + MAX_META_BYTES


@dataclass(frozen=True)
class MessageHeader:
    tag: str
    step: int
    critical: bool
    checksum: int  # CRC-32 of meta followed by payload
    meta: bytes
    job: str = DEFAULT_JOB  # the namespace: messages of other jobs never match

    def encode(self) -> bytes:
        if JOB_NAME.fullmatch(self.job) is None:
            raise LocalProtocolError(f"job {self.job!r} is not a job name")
        job = self.job.encode()
        tag = self.tag.encode()
        if not 0 < len(tag) <= MAX_TAG_BYTES:
            raise LocalProtocolError(f"tag must be 1..{MAX_TAG_BYTES} bytes of UTF-8")
        if len(self.meta) > MAX_META_BYTES:
            raise LocalProtocolError(f"tensor description over {MAX_META_BYTES} bytes")
        if not -(1 << 63) <= self.step < (1 << 63):
            raise LocalProtocolError("step must fit in a signed 64-bit integer")
        flags = FLAG_CRITICAL if self.critical else 0
        head = _HEAD.pack(
            MESSAGE_VERSION,
            flags,
            len(tag),
            self.step,
            self.checksum & 0xFFFFFFFF,
            len(self.meta),
            len(job),
        )
        return head + job + tag + self.meta


def decode_header(body: Buffer) -> tuple[MessageHeader, int]:
    """Parse the header at the start of ``body``; returns it and the payload offset."""
    if len(body) < HEAD_BYTES:
        raise RemoteProtocolError(f"message of {len(body)} bytes is shorter than its header")
    version, flags, tag_len, step, checksum, meta_len, job_len = _HEAD.unpack_from(body)
    if version != MESSAGE_VERSION:
        raise RemoteProtocolError(f"message version {version} is not supported")
    if not 0 < tag_len <= MAX_TAG_BYTES or meta_len > MAX_META_BYTES:
        raise RemoteProtocolError("message header declares an impossible tag or meta size")
    if not 0 < job_len <= MAX_JOB_BYTES:
        raise RemoteProtocolError(f"message header declares a job name of {job_len} bytes")
    tag_at = HEAD_BYTES + job_len
    end = tag_at + tag_len + meta_len
    if end > len(body):
        raise RemoteProtocolError("message header runs past the end of the message")
    job = bytes(body[HEAD_BYTES:tag_at]).decode("latin-1")
    if JOB_NAME.fullmatch(job) is None:
        raise RemoteProtocolError(f"message job {job!r} is not a job name")
    try:
        tag = bytes(body[tag_at : tag_at + tag_len]).decode()
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError("message tag is not UTF-8") from exc
    meta = bytes(body[tag_at + tag_len : end])
    return MessageHeader(tag, step, bool(flags & FLAG_CRITICAL), checksum, meta, job), end


def payload_offset(first_bytes: Buffer) -> int | None:
    """Where the payload starts in a body beginning with ``first_bytes``; None if they
    do not hold the fixed head (or it is not one): a hint, checked again on delivery."""
    if len(first_bytes) < HEAD_BYTES:
        return None
    version, _flags, tag_len, _step, _checksum, meta_len, job_len = _HEAD.unpack_from(first_bytes)
    if version != MESSAGE_VERSION:
        return None
    return int(HEAD_BYTES + job_len + tag_len + meta_len)


def head_job(first_bytes: Buffer) -> str | None:
    """The job a body beginning with ``first_bytes`` names; None if they do not hold
    it (or it is not a job name): a hint, checked again on delivery."""
    if len(first_bytes) < HEAD_BYTES:
        return None
    version, _flags, _tag_len, _step, _checksum, _meta_len, job_len = _HEAD.unpack_from(first_bytes)
    end = HEAD_BYTES + job_len
    if version != MESSAGE_VERSION or not 0 < job_len <= MAX_JOB_BYTES or end > len(first_bytes):
        return None
    job = bytes(memoryview(first_bytes)[HEAD_BYTES:end]).decode("latin-1")
    return job if JOB_NAME.fullmatch(job) is not None else None


def message_checksum(meta: Buffer, payload: Buffer) -> int:
    return crc32(payload, zlib.crc32(meta))


def verify_body(body: Buffer) -> tuple[MessageHeader, memoryview]:
    """Header and payload view of a complete body, after checking its checksum."""
    header, start = decode_header(body)
    payload = memoryview(body)[start:]
    actual = message_checksum(header.meta, payload)
    if actual != header.checksum:
        raise ChecksumError(
            f"message {header.tag!r} step {header.step}: checksum {actual:08x}, "
            f"sender declared {header.checksum:08x}"
        )
    return header, payload
