"""Chunked iteration and float32 working copies shared by the lossy codecs.

The codecs walk arrays in chunks of CHUNK_ELEMS so temporaries stay in the L2 cache and are
allocated once per call, not once per element-wise step.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from wangate.errors import CodecError

CHUNK_ELEMS = 1 << 16  # a multiple of every block size (blocks are powers of two <= 65536)
F32_MAX = float(np.finfo(np.float32).max)
F16_MAX = 65504.0
NON_FINITE = "lossy codecs need finite input (NaN or Inf found); send it with 'none'"


def chunk_ranges(n: int, chunk: int = CHUNK_ELEMS) -> Iterator[tuple[int, int]]:
    for start in range(0, n, chunk):
        yield start, min(n, start + chunk)


def check_finite(low: float, high: float) -> None:
    if not (np.isfinite(low) and np.isfinite(high)):
        raise CodecError(NON_FINITE)


def as_float32(flat: np.ndarray) -> np.ndarray:
    """``flat`` (a 1-D float16/32/64 array) as float32; the same object when it already is.

    float64 values beyond the float32 range saturate to +-F32_MAX; NaN/Inf raise CodecError.
    """
    if flat.dtype == np.float32:
        return flat
    if flat.dtype == np.float16:
        return flat.astype(np.float32)
    if flat.size:
        low, high = float(flat.min()), float(flat.max())
        check_finite(low, high)
        if low < -F32_MAX or high > F32_MAX:
            flat = np.clip(flat, -F32_MAX, F32_MAX)
    return flat.astype(np.float32)


def store_as(out: np.ndarray, values: np.ndarray) -> None:
    """Write float32 ``values`` into ``out`` (float16/32/64); float16 saturates, never Inf."""
    if out.dtype == np.float16:
        for start, stop in chunk_ranges(values.size):
            part = values[start:stop]
            if part.size and (part.max() > F16_MAX or part.min() < -F16_MAX):
                part = np.clip(part, -F16_MAX, F16_MAX)
            out[start:stop] = part
    else:
        out[...] = values
