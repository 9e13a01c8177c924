"""One pass over a payload serves every CRC that covers it (wangate.checksum)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wangate.checksum import checksum_with_prefix, crc32, crc32_combine
from wangate.codec import decode_tensor, encode_tensor
from wangate.codec.frame import verify_by_transport
from wangate.core.message import message_checksum
from wangate.errors import FrameChecksumError


@given(st.binary(max_size=300), st.binary(max_size=3000), st.integers(0, 2**32 - 1))
def test_isal_crc32_and_combine_give_zlib_values(prefix: bytes, data: bytes, seed: int) -> None:
    assert crc32(data, seed) == zlib.crc32(data, seed)
    assert crc32_combine(zlib.crc32(prefix), crc32(data), len(data)) == zlib.crc32(prefix + data)
    assert checksum_with_prefix(prefix, crc32(data), len(data)) == zlib.crc32(prefix + data)


def test_the_encoder_reads_the_payload_once_for_both_checksums() -> None:
    array = np.arange(100_000, dtype=np.float32)
    encoded = encode_tensor(array)
    payload = memoryview(encoded.payload).cast("B")
    assert encoded.payload_crc == zlib.crc32(payload)
    assert zlib.crc32(payload, zlib.crc32(encoded.meta[:-4])) == int.from_bytes(
        encoded.meta[-4:], "little"
    )
    transport = checksum_with_prefix(encoded.meta, encoded.payload_crc, payload.nbytes)
    assert transport == zlib.crc32(encoded.meta + bytes(payload))


def test_the_frame_crc_is_checked_against_the_transport_crc_without_the_payload() -> None:
    encoded = encode_tensor(np.arange(1000, dtype=np.int32))
    payload = bytes(encoded.payload)
    transport = message_checksum(encoded.meta, payload)
    verify_by_transport(encoded.meta, transport, len(payload))
    got = decode_tensor(encoded.meta, bytearray(payload), transport_checksum=transport)
    np.testing.assert_array_equal(got, np.arange(1000, dtype=np.int32))
    with pytest.raises(FrameChecksumError):
        verify_by_transport(encoded.meta, transport ^ 1, len(payload))
    broken = bytearray(encoded.meta)
    broken[-1] ^= 0x80  # the frame's own CRC disagrees with what the transport verified
    with pytest.raises(FrameChecksumError):
        decode_tensor(bytes(broken), payload, transport_checksum=transport)
