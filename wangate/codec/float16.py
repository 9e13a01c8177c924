"""16-bit float carriers: IEEE half (fp16) and bfloat16 (bf16), float32 in, float32 out.

Encoding saturates finite values to the carrier's largest finite value, so finite input never
decodes to Inf; NaN/Inf input raises CodecError. bfloat16 rounds to nearest, ties to even,
done on the float32 bit pattern (the top 16 bits are a bfloat16).
"""

from __future__ import annotations

import numpy as np

from .chunks import CHUNK_ELEMS, F16_MAX, check_finite, chunk_ranges

# Largest float32 that rounds to a finite bfloat16 (0x7F7F7FFF); one more ulp rounds to Inf.
BF16_ROUNDABLE_MAX = float(np.array([0x7F7F7FFF], dtype=np.uint32).view(np.float32)[0])


def fp16_body_size(n: int) -> int:
    return 2 * n


def _round_to_fp16_bits(part: np.ndarray, bits: np.ndarray, scratch: np.ndarray) -> None:
    """float16 bit patterns of ``part`` (finite float32, |x| <= 65504) into ``bits`` (uint32).

    Round to nearest, ties to even, without branches: numpy's own cast takes a slow path for
    results that are float16 subnormals, which small gradients are full of. Adding a power of
    two (2**(e+15), at least 2**-14 * 2**15) to 4|x| leaves exactly the float16 mantissa bits in
    float32 and lets the FPU round them (the method of Maratyszcza's FP16 library).
    """
    words = part.view(np.uint32)
    np.bitwise_and(words, 0x7FFFFFFF, out=bits)
    np.bitwise_and(bits, 0x7F800000, out=scratch)
    np.maximum(scratch, 0x38800000, out=scratch)
    scratch += 0x07800000
    magnitude = bits.view(np.float32)
    magnitude *= np.float32(4.0)
    magnitude += scratch.view(np.float32)
    np.right_shift(bits, 13, out=scratch)
    scratch &= 0x7C00
    bits &= 0x0FFF
    bits += scratch
    np.right_shift(words, 16, out=scratch)
    scratch &= 0x8000
    bits |= scratch


def fp16_encode(x: np.ndarray, out: np.ndarray, keep_residual: bool) -> None:
    """Write ``x`` (float32) as float16 into ``out`` (uint8); optionally leave x - decoded in x."""
    halves = out.view("<u2")
    width = min(x.size, CHUNK_ELEMS)
    bits = np.empty(width, dtype=np.uint32)
    scratch = np.empty(width, dtype=np.uint32)
    for start, stop in chunk_ranges(x.size):
        part = x[start:stop]
        low, high = float(part.min()), float(part.max())
        check_finite(low, high)
        source = np.clip(part, -F16_MAX, F16_MAX) if low < -F16_MAX or high > F16_MAX else part
        count = stop - start
        _round_to_fp16_bits(source, bits[:count], scratch[:count])
        halves[start:stop] = bits[:count]
        if keep_residual:
            part -= halves[start:stop].view("<f2")


def fp16_decode(body: np.ndarray, out: np.ndarray) -> None:
    out[...] = body.view("<f2")


def bf16_encode(x: np.ndarray, out: np.ndarray, keep_residual: bool) -> None:
    halves = out.view("<u2")
    scratch = np.empty(min(x.size, CHUNK_ELEMS), dtype=np.uint32)
    for start, stop in chunk_ranges(x.size):
        part = x[start:stop]
        low, high = float(part.min()), float(part.max())
        check_finite(low, high)
        if low < -BF16_ROUNDABLE_MAX or high > BF16_ROUNDABLE_MAX:
            part_src = np.clip(part, -BF16_ROUNDABLE_MAX, BF16_ROUNDABLE_MAX)
        else:
            part_src = part
        bits = part_src.view(np.uint32)
        rounded = scratch[: stop - start]
        np.right_shift(bits, 16, out=rounded)
        np.bitwise_and(rounded, 1, out=rounded)
        rounded += 0x7FFF
        rounded += bits
        rounded >>= 16
        halves[start:stop] = rounded
        if keep_residual:
            rounded <<= 16
            part -= rounded.view(np.float32)


def bf16_decode(body: np.ndarray, out: np.ndarray) -> None:
    halves = body.view("<u2")
    bits = out.view(np.uint32)
    bits[...] = halves
    bits <<= 16


def fp32_body_size(n: int) -> int:
    return 4 * n


def fp32_encode(x: np.ndarray, out: np.ndarray, keep_residual: bool) -> None:
    if x.size:
        check_finite(float(x.min()), float(x.max()))
    out.view("<f4")[...] = x
    if keep_residual:
        x[...] = 0.0


def fp32_decode(body: np.ndarray, out: np.ndarray) -> None:
    out[...] = body.view("<f4")
