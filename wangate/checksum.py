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

from isal.isal_zlib import crc32 as _isal_crc32
from isal.isal_zlib import crc32_combine as _isal_combine

Buffer = bytes | bytearray | memoryview


def crc32(data: Buffer, value: int = 0) -> int:
    """``zlib.crc32(data, value)``, computed by ISA-L."""
    return int(_isal_crc32(data, value))


def crc32_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """The CRC-32 of A followed by B, from CRC(A), CRC(B) and B's length."""
    return int(_isal_combine(crc_a, crc_b, length_b))


def checksum_with_prefix(prefix: Buffer, payload_crc: int, payload_bytes: int) -> int:
    """CRC-32 of ``prefix`` followed by a payload whose own CRC-32 is known."""
    return crc32_combine(zlib.crc32(prefix), payload_crc, payload_bytes)
