"""The frame header ("meta") that travels beside every encoded payload. See proto/codec.md.

Layout, little-endian, version 1::

    magic "WC" | version u8 | codec u8 | dtype u8 | flags u8 | ndim u8 | params_len u8
    body_size u64 | payload_size u64 | shape ndim x u64 | params | crc32 u32

The CRC-32 (zlib polynomial) covers every meta byte before it and then the payload, so one
check protects the header and the bulk.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from wangate.checksum import checksum_with_prefix, crc32, crc32_combine
from wangate.errors import CodecError, FrameChecksumError

from .dtypes import DTYPE_BY_CODE, UINT16_CODE

MAGIC = b"WC"
VERSION = 1
MAX_META_BYTES = 4096
MAX_NDIM = 32
MAX_DIM = (1 << 63) - 1

FLAG_ZSTD = 0x01  # payload is one zstd frame holding the body
FLAG_BFLOAT16 = 0x02  # uint16 elements are bfloat16 bits
KNOWN_FLAGS = FLAG_ZSTD | FLAG_BFLOAT16

CODEC_NONE = 0
CODEC_FP16 = 1
CODEC_BF16 = 2
CODEC_INT8 = 3
CODEC_INT4 = 4
CODEC_TOPK = 5
CODEC_SPLIT = 6
CODEC_NAMES = {0: "none", 1: "fp16", 2: "bf16", 3: "int8", 4: "int4", 5: "topk", 6: "split"}

_HEAD = struct.Struct("<2sBBBBBBQQ")
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class FrameInfo:
    """What a meta block declares; built by ``parse_meta`` after structural checks."""

    codec: int
    dtype_code: int
    shape: tuple[int, ...]
    params: bytes
    body_size: int
    payload_size: int
    zstd: bool = False
    bfloat16: bool = False

    @property
    def codec_name(self) -> str:
        return CODEC_NAMES[self.codec]

    @property
    def element_count(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def decoded_bytes(self) -> int:
        return self.element_count * DTYPE_BY_CODE[self.dtype_code].itemsize


def frame_checksum(meta_head: bytes, payload: memoryview) -> int:
    """CRC-32 of the meta bytes before the CRC field, continued over the payload."""
    return crc32(payload, zlib.crc32(meta_head))


def pack_meta(info: FrameInfo, payload_crc: int) -> bytes:
    """Serialise ``info`` and append the checksum over it and the payload, given the
    payload's own CRC-32 (``payload_crc``): the payload is read once, by the caller."""
    flags = (FLAG_ZSTD if info.zstd else 0) | (FLAG_BFLOAT16 if info.bfloat16 else 0)
    head = _HEAD.pack(
        MAGIC,
        VERSION,
        info.codec,
        info.dtype_code,
        flags,
        len(info.shape),
        len(info.params),
        info.body_size,
        info.payload_size,
    )
    head += struct.pack(f"<{len(info.shape)}Q", *info.shape) + info.params
    return head + _CRC.pack(checksum_with_prefix(head, payload_crc, info.payload_size))


def parse_meta(meta: bytes | bytearray | memoryview) -> FrameInfo:
    """Check the structure of a meta block and return what it declares (no payload check)."""
    meta = bytes(meta[: MAX_META_BYTES + 1]) if len(meta) <= MAX_META_BYTES else b""
    if len(meta) < _HEAD.size + _CRC.size:
        raise CodecError(f"frame meta must be {_HEAD.size + _CRC.size}..{MAX_META_BYTES} bytes")
    magic, version, codec, dtype, flags, ndim, params_len, body, payload = _HEAD.unpack_from(meta)
    if magic != MAGIC:
        raise CodecError("frame meta has a bad magic (not a wangate codec frame)")
    if version != VERSION:
        raise CodecError(f"frame version {version} is not supported (this side speaks {VERSION})")
    if codec not in CODEC_NAMES:
        raise CodecError(f"frame names unknown codec id {codec}")
    if dtype not in DTYPE_BY_CODE:
        raise CodecError(f"frame names unknown dtype code {dtype}")
    if flags & ~KNOWN_FLAGS:
        raise CodecError(f"frame has unknown flags 0x{flags:02x}")
    if flags & FLAG_BFLOAT16 and dtype != UINT16_CODE:
        raise CodecError("bfloat16 flag set on a dtype other than uint16")
    if ndim > MAX_NDIM:
        raise CodecError(f"frame declares {ndim} dimensions (at most {MAX_NDIM})")
    expected = _HEAD.size + 8 * ndim + params_len + _CRC.size
    if len(meta) != expected:
        raise CodecError(f"frame meta is {len(meta)} bytes, its header says {expected}")
    shape = struct.unpack_from(f"<{ndim}Q", meta, _HEAD.size)
    if any(dim > MAX_DIM for dim in shape):
        raise CodecError("frame declares a dimension beyond 2**63 - 1")
    start = _HEAD.size + 8 * ndim
    return FrameInfo(
        codec=codec,
        dtype_code=dtype,
        shape=tuple(shape),
        params=meta[start : start + params_len],
        body_size=body,
        payload_size=payload,
        zstd=bool(flags & FLAG_ZSTD),
        bfloat16=bool(flags & FLAG_BFLOAT16),
    )


def verify_checksum(meta: bytes | bytearray | memoryview, payload: memoryview) -> None:
    """Raise CodecError unless the CRC in ``meta`` matches its bytes and ``payload``."""
    meta = bytes(meta)
    (declared,) = _CRC.unpack_from(meta, len(meta) - _CRC.size)
    if frame_checksum(meta[: -_CRC.size], payload) != declared:
        raise FrameChecksumError("frame checksum does not match its meta and payload")


def verify_by_transport(
    meta: bytes | bytearray | memoryview, transport_checksum: int, payload_bytes: int
) -> None:
    """``verify_checksum`` without reading the payload, given ``transport_checksum``:
    the CRC-32 of ``meta`` followed by the payload, already checked against the bytes
    (by the gateway that delivered them, proto/localapi.md). Both CRCs cover the same
    payload after different prefixes, so they differ by the prefixes' difference
    carried over ``payload_bytes`` (CRC-32 is linear: zlib's crc32_combine).
    """
    meta = bytes(meta)
    (declared,) = _CRC.unpack_from(meta, len(meta) - _CRC.size)
    prefixes = zlib.crc32(meta) ^ zlib.crc32(meta[: -_CRC.size])
    if transport_checksum ^ crc32_combine(prefixes, 0, payload_bytes) != declared:
        raise FrameChecksumError("frame checksum does not match its meta and payload")
