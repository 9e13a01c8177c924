"""What the client takes as an array: numpy arrays and, without importing torch, torch tensors.

A torch tensor is recognised by its type's module, so ``import wangate`` never imports torch;
the conversion itself lives in ``wangate.torch.convert`` and is loaded only when a tensor
arrives. bfloat16 has no numpy dtype: its bits travel as uint16 with the frame's bfloat16
flag, and a received bfloat16 array comes back as a ``BFloat16Bits`` (a uint16 ndarray that
remembers what it is), which ``send`` carries as bfloat16 again and
``wangate.torch.as_tensor`` turns into a ``torch.bfloat16`` tensor without a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wangate.codec.dtypes import is_bfloat16


class BFloat16Bits(np.ndarray):
    """A uint16 array holding bfloat16 bits (a view; no data of its own)."""


def is_torch_tensor(obj: object) -> bool:
    module = type(obj).__module__
    return module == "torch" or module.startswith("torch.")


def as_wire_array(obj: Any) -> tuple[np.ndarray, bool]:
    """``obj`` as a numpy array and whether it holds bfloat16 bits (as uint16).

    numpy arrays pass through; a torch tensor becomes a view of its memory where it can
    (see ``wangate.torch.convert.to_numpy``).
    """
    if isinstance(obj, BFloat16Bits):
        return obj.view(np.ndarray), True
    if isinstance(obj, np.ndarray):
        return obj, is_bfloat16(obj.dtype)
    if is_torch_tensor(obj):
        from wangate.torch.convert import to_numpy

        return to_numpy(obj)
    return np.asarray(obj), False


def mark_bfloat16(array: np.ndarray) -> np.ndarray:
    """A decoded uint16 array whose frame said bfloat16, marked as such."""
    return array.view(BFloat16Bits)


def as_reducible_array(obj: Any) -> np.ndarray:
    """``obj`` as an array the collectives can add up: bfloat16 becomes float32, exactly."""
    array, bfloat16 = as_wire_array(obj)
    if not bfloat16:
        return array
    return (array.astype(np.uint32) << 16).view(np.float32)
