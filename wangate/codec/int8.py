"""int8 blockwise: per-block absmax float32 scale, codes in [-127, 127].

Body: ceil(n / B) float32 scales, then n int8 codes.
"""

from __future__ import annotations

import numpy as np

from .blockwise import block_count, block_scales, check_scales, padded_blocks
from .chunks import CHUNK_ELEMS, F32_MAX, chunk_ranges

QMAX = 127
# 127 * MAX_SCALE stays below F32_MAX even after float32 rounding.
MAX_SCALE = float(np.float32(F32_MAX / 128))


def int8_body_size(n: int, block: int) -> int:
    return 4 * block_count(n, block) + n


def int8_encode(x: np.ndarray, block: int, out: np.ndarray, keep_residual: bool) -> None:
    n = x.size
    blocks_total = block_count(n, block)
    scales = out[: 4 * blocks_total].view("<f4")
    codes = out[4 * blocks_total :].view(np.int8)
    scratch = np.empty(min(CHUNK_ELEMS, blocks_total * block), dtype=np.float32)
    for start, stop in chunk_ranges(n):
        part = x[start:stop]
        blocks = padded_blocks(part, block)
        rows = blocks.shape[0]
        work = scratch[: rows * block].reshape(rows, block)
        scale, inverse, saturated = block_scales(blocks, QMAX, MAX_SCALE, work)
        np.multiply(blocks, inverse[:, None], out=work)
        np.rint(work, out=work)
        if saturated:
            np.clip(work, -QMAX, QMAX, out=work)
        codes[start:stop] = work.reshape(-1)[: stop - start]
        first = start // block
        scales[first : first + rows] = scale
        if keep_residual:
            work *= scale[:, None]
            part -= work.reshape(-1)[: stop - start]


def int8_decode(body: np.ndarray, n: int, block: int, out: np.ndarray) -> None:
    blocks_total = block_count(n, block)
    scales = body[: 4 * blocks_total].view("<f4")
    check_scales(scales, MAX_SCALE)
    codes = body[4 * blocks_total :].view(np.int8)
    for start, stop in chunk_ranges(n):
        first = start // block
        whole = (stop - start) // block * block
        if whole:
            np.multiply(
                codes[start : start + whole].reshape(-1, block),
                scales[first : first + whole // block, None],
                out=out[start : start + whole].reshape(-1, block),
            )
        if start + whole < stop:
            tail = slice(start + whole, stop)
            np.multiply(codes[tail], scales[first + whole // block], out=out[tail])
