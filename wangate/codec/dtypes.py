"""The dtypes a frame may carry: a small whitelist of one-byte codes, always little-endian."""

from __future__ import annotations

import numpy as np

from wangate.errors import CodecError

DTYPE_BY_CODE: dict[int, np.dtype[np.generic]] = {
    1: np.dtype("?"),
    2: np.dtype("<i1"),
    3: np.dtype("<u1"),
    4: np.dtype("<i2"),
    5: np.dtype("<u2"),
    6: np.dtype("<i4"),
    7: np.dtype("<u4"),
    8: np.dtype("<i8"),
    9: np.dtype("<u8"),
    10: np.dtype("<f2"),
    11: np.dtype("<f4"),
    12: np.dtype("<f8"),
}
CODE_BY_KEY = {(dt.kind, dt.itemsize): code for code, dt in DTYPE_BY_CODE.items()}
FLOAT_CODES = frozenset((10, 11, 12))
NPY_USERDEF = 256  # the first type number of a dtype registered outside numpy
UINT16_CODE = 5


def dtype_code(dtype: np.dtype[np.generic]) -> int:
    """The wire code of ``dtype`` (any byte order); CodecError if it is not carried."""
    code = CODE_BY_KEY.get((dtype.kind, dtype.itemsize))
    if code is None:
        names = ", ".join(str(dt) for dt in DTYPE_BY_CODE.values())
        raise CodecError(f"dtype {dtype} is not supported (supported: {names}, bfloat16)")
    return code


def is_bfloat16(dtype: np.dtype[np.generic]) -> bool:
    """True for an ml_dtypes-style bfloat16 dtype, carried as uint16 bits."""
    # numpy's own dtypes number below NPY_USERDEF; only a registered one is asked its
    # name, which numpy builds in Python (on a send's way, after an idle gap, ~0.2 ms)
    return dtype.num >= NPY_USERDEF and dtype.name == "bfloat16" and dtype.itemsize == 2


def wire_array(array: np.ndarray) -> tuple[np.ndarray, int, bool]:
    """The array as C-contiguous little-endian, its dtype code and whether it is bfloat16.

    Copies only when the layout or byte order requires it.
    """
    bfloat16 = is_bfloat16(array.dtype)
    if bfloat16:
        array = array.view(np.uint16)
    code = dtype_code(array.dtype)
    wanted = DTYPE_BY_CODE[code]
    if array.dtype != wanted:
        array = array.astype(wanted)  # byte order swap; also a C-contiguous copy
    elif not array.flags.c_contiguous:
        array = array.copy(order="C")
    return array, code, bfloat16
