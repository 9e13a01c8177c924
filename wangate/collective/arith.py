"""The reduction arithmetic: which dtypes, in what order, in what precision.

Float addition is not associative, so every reduction adds the contributions in sorted
site order, one fixed sequence of operations: the site that reduces a part produces the
same bits whoever it is, and every other site receives those bits. float16 is
accumulated in float32 and rounded once at the end; float32, float64 and the integer
types are accumulated in their own dtype (integers wrap like numpy's).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wangate.errors import LocalProtocolError

OPS = ("sum", "mean")


def check_reducible(dtype: np.dtype[np.generic], op: str) -> None:
    if op not in OPS:
        raise LocalProtocolError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    if dtype.kind == "f" and dtype.itemsize in (2, 4, 8):
        return
    if dtype.kind in "iu":
        if op == "mean":
            raise LocalProtocolError(
                f"op 'mean' needs a float array, got {dtype}: use op='sum' and divide, "
                "or convert to float first"
            )
        return
    raise LocalProtocolError(
        f"cannot reduce a {dtype} array (float16/32/64 and integer arrays can be reduced; "
        "send bfloat16 as float32)"
    )


def accumulator_dtype(dtype: np.dtype[np.generic]) -> np.dtype[np.generic]:
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def reduce_in_order(
    parts: Sequence[np.ndarray], op: str, dtype: np.dtype[np.generic], count: int
) -> np.ndarray:
    """``parts`` (already in sorted site order) reduced; ``count`` divides for mean."""
    acc_dtype = accumulator_dtype(dtype)
    acc = np.array(parts[0], dtype=acc_dtype, copy=True)
    for part in parts[1:]:
        np.add(acc, part, out=acc, casting="unsafe")
    if op == "mean":
        np.divide(acc, acc_dtype.type(count), out=acc)
    return acc if acc_dtype == dtype else acc.astype(dtype)
