"""CRC-32 (the zlib polynomial) over payloads, in one pass.

ISA-L's CRC-32 (``isal``) gives the same values as ``zlib.crc32`` about 7x faster on
this class of machine (bench/RESULTS.md, "Shared-memory payloads": 15.7 GiB/s against
2.1 GiB/s; CRC-32C from ``crc32c`` ran 14.1 GiB/s and would have changed the wire
format). ``crc32_combine`` lets one pass over a payload serve every checksum that
covers it (the codec frame's and the message's each start with their own header
bytes), as zlib's ``crc32_combine`` does.
"""

from __future__ import annotations

import zlib

try:
    from isal.isal_zlib import crc32 as _fast_crc32
    from isal.isal_zlib import crc32_combine as _fast_combine
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    _fast_crc32 = None
    _fast_combine = None

Buffer = bytes | bytearray | memoryview

_POLY = 0xEDB88320  # CRC-32, reflected


def crc32(data: Buffer, value: int = 0) -> int:
    """``zlib.crc32(data, value)``, computed by ISA-L when it is there."""
    if _fast_crc32 is not None:
        return int(_fast_crc32(data, value))
    return zlib.crc32(data, value)


def crc32_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """The CRC-32 of A followed by B, from CRC(A), CRC(B) and B's length."""
    if _fast_combine is not None:
        return int(_fast_combine(crc_a, crc_b, length_b))
    return _combine(crc_a, crc_b, length_b)  # pragma: no cover


def checksum_with_prefix(prefix: Buffer, payload_crc: int, payload_bytes: int) -> int:
    """CRC-32 of ``prefix`` followed by a payload whose own CRC-32 is known."""
    return crc32_combine(zlib.crc32(prefix), payload_crc, payload_bytes)


def _multiply(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial (reflected bit order), as in zlib's multmodp."""
    m = 1 << 31
    product = 0
    while a:
        if a & m:
            product ^= b
            a ^= m
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """zlib's crc32_combine: CRC(A) times x^(8 * len(B)), plus CRC(B)."""
    power = 1 << 30  # x^1
    factor = 1 << 31  # x^0
    n = 8 * length_b
    while n:
        if n & 1:
            factor = _multiply(factor, power)
        power = _multiply(power, power)
        n >>= 1
    return _multiply(factor, crc_a) ^ crc_b
