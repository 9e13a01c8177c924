"""Per-block absmax scales for the integer codecs (int8, int4).

A block of B consecutive elements shares one float32 scale = absmax / qmax; an element is sent
as round(x / scale), clipped to [-qmax, qmax]. Scales are capped at ``max_scale`` so that no
decodable code times its scale overflows float32; a block whose scale would be below the
smallest normal float32 is sent as zeros (error feedback carries it).
"""

from __future__ import annotations

import numpy as np

from wangate.errors import CodecError

from .chunks import check_finite

F32_TINY = float(np.finfo(np.float32).tiny)


def block_count(n: int, block: int) -> int:
    return -(-n // block)


def padded_blocks(part: np.ndarray, block: int) -> np.ndarray:
    """``part`` as (blocks, block), zero-padding a last partial block (a copy only then)."""
    rows = block_count(part.size, block)
    if rows * block == part.size:
        return part.reshape(rows, block)
    padded = np.zeros(rows * block, dtype=part.dtype)
    padded[: part.size] = part
    return padded.reshape(rows, block)


def block_scales(
    blocks: np.ndarray, qmax: int, max_scale: float, scratch: np.ndarray
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(scale, 1/scale or 0, saturated) per row of ``blocks``; CodecError on NaN/Inf.

    ``scratch`` (same shape, float32) is overwritten.
    """
    np.abs(blocks, out=scratch)
    absmax = scratch.max(axis=1)
    check_finite(float(absmax.min()), float(absmax.max()))
    scale = absmax / np.float32(qmax)
    saturated = bool(scale.max() > max_scale)
    if saturated:
        np.minimum(scale, np.float32(max_scale), out=scale)
    scale[scale < F32_TINY] = 0.0
    inverse = np.zeros_like(scale)
    np.divide(np.float32(1.0), scale, out=inverse, where=scale > 0)
    return scale, inverse, saturated


def check_scales(scales: np.ndarray, max_scale: float) -> None:
    """Reject scales a correct encoder never writes (NaN, negative, above the cap)."""
    if scales.size and not (scales.min() >= 0.0 and scales.max() <= max_scale):
        raise CodecError("frame carries a block scale that is negative, too large or NaN")
