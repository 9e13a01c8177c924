"""One table for the dense value carriers (fp16, bf16, fp32, int8, int4) and their wire ids.

Every carrier takes a 1-D float32 array. ``encode`` writes exactly ``body_size`` bytes and, when
asked, overwrites its input with what it dropped (input minus what the decoder will produce);
``decode`` fills a float32 array.
"""

from __future__ import annotations

import numpy as np

from wangate.errors import CodecError

from . import float16, int4, int8
from .spec import MAX_BLOCK, MIN_BLOCK, DenseKind

DENSE_IDS = {"fp16": 1, "bf16": 2, "int8": 3, "int4": 4, "fp32": 7}
DENSE_NAMES = {ident: name for name, ident in DENSE_IDS.items()}
BLOCKWISE = frozenset(("int8", "int4"))


def check_dense(ident: int, block: int, allowed: tuple[str, ...]) -> DenseKind:
    """The carrier a frame names; CodecError for ids or blocks an encoder never writes."""
    name = DENSE_NAMES.get(ident)
    if name is None or name not in allowed:
        raise CodecError(f"frame names value carrier id {ident}, not allowed here")
    if name in BLOCKWISE:
        if not MIN_BLOCK <= block <= MAX_BLOCK or block & (block - 1):
            raise CodecError(f"frame declares block size {block}, not a power of two in range")
    elif block != 0:
        raise CodecError(f"frame declares a block size for {name}, which has none")
    return DenseKind(name, block)


def body_size(kind: DenseKind, n: int) -> int:
    if kind.name == "int8":
        return int8.int8_body_size(n, kind.block)
    if kind.name == "int4":
        return int4.int4_body_size(n, kind.block)
    if kind.name == "fp32":
        return float16.fp32_body_size(n)
    return float16.fp16_body_size(n)  # fp16 and bf16


def encode(kind: DenseKind, x: np.ndarray, out: np.ndarray, keep_residual: bool) -> None:
    if kind.name == "int8":
        int8.int8_encode(x, kind.block, out, keep_residual)
    elif kind.name == "int4":
        int4.int4_encode(x, kind.block, out, keep_residual)
    elif kind.name == "fp16":
        float16.fp16_encode(x, out, keep_residual)
    elif kind.name == "bf16":
        float16.bf16_encode(x, out, keep_residual)
    else:
        float16.fp32_encode(x, out, keep_residual)


def decode(kind: DenseKind, body: np.ndarray, out: np.ndarray) -> None:
    if kind.name == "int8":
        int8.int8_decode(body, out.size, kind.block, out)
    elif kind.name == "int4":
        int4.int4_decode(body, out.size, kind.block, out)
    elif kind.name == "fp16":
        float16.fp16_decode(body, out)
    elif kind.name == "bf16":
        float16.bf16_decode(body, out)
    else:
        float16.fp32_decode(body, out)
