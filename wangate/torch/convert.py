"""torch tensors to numpy arrays and back, copying only where memory must move.

A detached, contiguous CPU tensor becomes a view of its own memory (``Tensor.numpy``); a
``requires_grad`` tensor is detached (no copy); a non-contiguous one is viewed with its
strides and the codec makes the one C-contiguous copy it needs; a CUDA tensor is copied to
the host once. bfloat16 goes out as its uint16 bits, flagged, and comes back as bfloat16.
"""

from __future__ import annotations

import numpy as np
import torch

from wangate.errors import CodecError
from wangate.tensorlike import BFloat16Bits, is_torch_tensor


def to_numpy(tensor: torch.Tensor) -> tuple[np.ndarray, bool]:
    """``tensor`` as a numpy array (a view where possible) and whether it is bfloat16 bits."""
    if not is_torch_tensor(tensor):
        raise CodecError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise CodecError(f"only dense tensors can be sent, got layout {tensor.layout}")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")  # the one host copy; later steps only view it
    tensor = tensor.resolve_conj().resolve_neg()
    if tensor.dtype == torch.bfloat16:
        bits = tensor.view(torch.int16).numpy().view(np.uint16)
        return bits, True
    try:
        return tensor.numpy(), False
    except TypeError as exc:
        raise CodecError(f"tensor dtype {tensor.dtype} cannot be sent: {exc}") from None


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A received array as a torch tensor sharing its memory; bfloat16 bits become bfloat16."""
    if isinstance(array, BFloat16Bits):
        bits = np.ascontiguousarray(array.view(np.ndarray)).view(np.int16)
        return torch.from_numpy(bits).view(torch.bfloat16)
    if not array.flags.writeable:
        array = array.copy()  # torch tensors are always writable
    return torch.from_numpy(array)


def copy_into(tensor: torch.Tensor, array: np.ndarray) -> None:
    """Write ``array`` (same element count) into ``tensor`` in place, converting the dtype."""
    if array.size != tensor.numel():
        raise CodecError(f"got {array.size} elements for a tensor of {tensor.numel()}")
    flat = array.reshape(tensor.shape)
    if tensor.device.type == "cpu" and tensor.dtype != torch.bfloat16 and tensor.is_contiguous():
        tensor.detach().numpy()[...] = flat  # one pass, no intermediate tensor
        return
    source = flat if flat.flags.writeable else flat.copy()
    tensor.detach().copy_(as_tensor(source))
