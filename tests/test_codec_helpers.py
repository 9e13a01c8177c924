"""Shared helpers for the codec tests: error bounds and frame resealing."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

LOSSY_SPECS = (
    "fp16",
    "bf16",
    "int8",
    "int4",
    "int8:64",
    "int4:16",
    "topk:0.1",
    "topk:0.2/int8",
    "topk:0.1/bf16",
    "topk:0.1/fp32",
    "topk:0.1/int4",
    "split:0.1/int8",
    "split:0.05/int4",
    "split:0.1/fp16/fp16",
    "split:0.1/bf16",
    "int8+zstd",
    "topk:0.1/int8+zstd:1",
)
F32_TINY = float(np.finfo(np.float32).tiny)
F32_MAX = float(np.finfo(np.float32).max)


def reseal(meta: bytes, payload: bytes | memoryview) -> bytes:
    """``meta`` with its CRC recomputed, so a test reaches the checks behind the checksum."""
    head = bytes(meta[:-4])
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head)))


def patch_meta(meta: bytes, offset: int, fmt: str, value: int) -> bytes:
    """``meta`` with one little-endian field overwritten (CRC left stale)."""
    patched = bytearray(meta)
    struct.pack_into(fmt, patched, offset, value)
    return bytes(patched)


def block_absmax(x: np.ndarray, block: int) -> np.ndarray:
    """Per-element absmax of the element's block (x flat float64)."""
    padded = np.zeros(-(-x.size // block) * block)
    padded[: x.size] = np.abs(x)
    return np.repeat(padded.reshape(-1, block).max(axis=1), block)[: x.size]


def dense_bound(name: str, x: np.ndarray, block: int) -> np.ndarray:
    """Per-element error bound for a dense carrier on float32-exact values ``x`` (float64)."""
    # Each bound: rounding error, plus saturation beyond the largest value the carrier sends.
    if name == "fp16":
        return np.maximum(np.abs(x) * 2.0**-11, 2.0**-25) + np.maximum(np.abs(x) - 65504, 0)
    if name == "bf16":
        return np.abs(x) * 2.0**-8 + 2.0**-133
    if name == "fp32":
        return np.zeros_like(x)
    qmax = 127 if name == "int8" else 7
    largest = qmax * (F32_MAX / 128 if name == "int8" else F32_MAX / 16)
    rounding = block_absmax(x, block) * (0.5 / qmax) * (1 + 1e-5) + qmax * F32_TINY
    return rounding + np.maximum(np.abs(x) - largest, 0)


def test_reseal_makes_a_patched_frame_pass_the_checksum_only() -> None:
    from wangate.codec import decode_tensor, encode_tensor
    from wangate.errors import CodecError

    encoded = encode_tensor(np.arange(6, dtype=np.int16), "none")
    payload = bytes(encoded.payload)
    assert reseal(encoded.meta, payload) == encoded.meta
    flipped = b"\x07" + payload[1:]
    with np.testing.assert_raises(CodecError):
        decode_tensor(encoded.meta, flipped)
    assert decode_tensor(reseal(encoded.meta, flipped), flipped).tolist() == [7, 1, 2, 3, 4, 5]


def test_dense_bound_is_half_a_step_of_the_block_scale() -> None:
    x = np.array([1.0, -127.0, 0.5, 2.0])
    assert dense_bound("int8", x, 2).tolist() == pytest.approx(
        [0.5, 0.5, 2 / 254, 2 / 254], rel=2e-5
    )
    assert dense_bound("fp32", x, 1).tolist() == [0, 0, 0, 0]
