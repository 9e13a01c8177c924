"""PyTorch integration (``pip install wangate[torch]``): tensors in and out of the gateway,
a DDP communication hook, DiLoCo outer steps, and a start-up parameter broadcast.

``wangate.Client.send`` and the collectives take torch tensors as they are (see
``convert``); the functions here also hand tensors back.
"""

from __future__ import annotations

from typing import Any

import torch

from wangate.client import Client
from wangate.tensorlike import mark_bfloat16
from wangate.torch.convert import as_tensor, copy_into, to_numpy
from wangate.torch.ddp import AllreduceHookState, allreduce_hook, first_layers, sync_parameters
from wangate.torch.diloco import DiLoCo
from wangate.torch.site import CrossSiteError, SiteGroup

__all__ = [
    "AllreduceHookState",
    "CrossSiteError",
    "DiLoCo",
    "SiteGroup",
    "allreduce",
    "allreduce_hook",
    "as_tensor",
    "broadcast",
    "copy_into",
    "first_layers",
    "recv",
    "send",
    "sync_parameters",
    "to_numpy",
]


def send(client: Client, peer: str, tag: str, tensor: torch.Tensor, **kwargs: Any) -> int:
    """``client.send`` for a tensor (bfloat16 travels as bfloat16)."""
    return client.send(peer, tag, tensor, **kwargs)  # type: ignore[arg-type]


def recv(client: Client, tag: str, **kwargs: Any) -> torch.Tensor:
    """``client.recv`` as a tensor: a bfloat16 tensor if one was sent, else the sent dtype."""
    return as_tensor(client.recv(tag, **kwargs))


def allreduce(client: Client, tag: str, tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """``client.allreduce`` of a tensor, returned as a new tensor of the input's dtype (a
    bfloat16 tensor is reduced in float32, then rounded back)."""
    wan = tensor.detach()
    if wan.dtype == torch.bfloat16:
        wan = wan.float()
    result = client.allreduce(tag, to_numpy(wan)[0], **kwargs)
    array = getattr(result, "array", result)
    out = torch.empty(tensor.shape, dtype=tensor.dtype)
    copy_into(out, array)
    return out


def broadcast(
    client: Client, tag: str, tensor: torch.Tensor | None, *, root: str, **kwargs: Any
) -> torch.Tensor:
    """``client.broadcast`` of a tensor (``None`` on the sites other than ``root``); every
    dtype, bfloat16 included, arrives bit for bit."""
    array = None
    if tensor is not None:
        array, bf16 = to_numpy(tensor)
        array = mark_bfloat16(array) if bf16 else array
    return as_tensor(client.broadcast(tag, array, root=root, **kwargs))
