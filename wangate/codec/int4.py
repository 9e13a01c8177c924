"""4-bit blockwise: per-block absmax float32 scale, codes in [-7, 7] stored as nibble q + 8.

Body: ceil(n / B) float32 scales, then ceil(n / 2) bytes; element 2i is the low nibble of byte
i, element 2i+1 the high nibble; an odd count pads the last high nibble with 8 (zero). Nibble
0 is never written; a decoder reads it as -8.
"""

from __future__ import annotations

import numpy as np

from .blockwise import block_count, block_scales, check_scales, padded_blocks
from .chunks import CHUNK_ELEMS, F32_MAX, chunk_ranges

QMAX = 7
# Nibble 0 decodes to -8 * scale: keep that finite.
MAX_SCALE = float(np.float32(F32_MAX / 16))


def int4_body_size(n: int, block: int) -> int:
    return 4 * block_count(n, block) + (n + 1) // 2


def int4_encode(x: np.ndarray, block: int, out: np.ndarray, keep_residual: bool) -> None:
    n = x.size
    blocks_total = block_count(n, block)
    scales = out[: 4 * blocks_total].view("<f4")
    packed = out[4 * blocks_total :]
    width = min(CHUNK_ELEMS, blocks_total * block)
    scratch = np.empty(width, dtype=np.float32)
    nibbles = np.empty(width + 1, dtype=np.uint8)
    for start, stop in chunk_ranges(n):
        count = stop - start
        part = x[start:stop]
        blocks = padded_blocks(part, block)
        rows = blocks.shape[0]
        work = scratch[: rows * block].reshape(rows, block)
        scale, inverse, saturated = block_scales(blocks, QMAX, MAX_SCALE, work)
        np.multiply(blocks, inverse[:, None], out=work)
        np.rint(work, out=work)
        if saturated:
            np.clip(work, -QMAX, QMAX, out=work)
        even = count + (count & 1)
        codes = nibbles[:even]
        codes[count:] = 8
        np.add(work.reshape(-1)[:count], 8, out=codes[:count], casting="unsafe")
        high = codes[1::2]
        high <<= 4
        np.bitwise_or(codes[0::2], high, out=packed[start // 2 : start // 2 + even // 2])
        first = start // block
        scales[first : first + rows] = scale
        if keep_residual:
            work *= scale[:, None]
            part -= work.reshape(-1)[:count]


def int4_decode(body: np.ndarray, n: int, block: int, out: np.ndarray) -> None:
    blocks_total = block_count(n, block)
    scales = body[: 4 * blocks_total].view("<f4")
    check_scales(scales, MAX_SCALE)
    packed = body[4 * blocks_total :]
    codes = np.empty(min(CHUNK_ELEMS, n) + 1, dtype=np.int8)
    for start, stop in chunk_ranges(n):
        count = stop - start
        byte_run = packed[start // 2 : (stop + 1) // 2]
        pairs = codes[: 2 * byte_run.size]
        np.bitwise_and(byte_run, 15, out=pairs[0::2], casting="unsafe")
        np.right_shift(byte_run, 4, out=pairs[1::2], casting="unsafe")
        pairs -= 8
        first = start // block
        whole = count // block * block
        if whole:
            np.multiply(
                pairs[:whole].reshape(-1, block),
                scales[first : first + whole // block, None],
                out=out[start : start + whole].reshape(-1, block),
            )
        if whole < count:
            tail = slice(start + whole, stop)
            np.multiply(pairs[whole:count], scales[first + whole // block], out=out[tail])
