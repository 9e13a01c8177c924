"""PyTorch integration (``pip install wangate[torch]``): tensors in and out of the gateway,
a DDP communication hook, DiLoCo outer steps, and a start-up parameter broadcast.

``wangate.Client.send`` and the collectives take torch tensors as they are (see
``convert``); the functions here also hand tensors back.
"""

from __future__ import annotations

from typing import Any

import torch

from wangate.client import Client
from wangate.errors import WangateError
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
    """``client.allreduce`` of a tensor, as a new tensor of the input's dtype (bfloat16 is
    reduced in float32, then rounded back). ``partial=True`` is for ``client.allreduce``."""
    if kwargs.get("partial"):
        raise WangateError(
            "wangate.torch.allreduce returns a tensor: for partial=True call "
            "client.allreduce and wangate.torch.as_tensor(result.array)"
        )
    out = torch.empty(tensor.shape, dtype=tensor.dtype)
    copy_into(out, client.allreduce(tag, tensor, **kwargs))  # type: ignore[arg-type]
    return out


def broadcast(
    client: Client, tag: str, tensor: torch.Tensor | None, *, root: str, **kwargs: Any
) -> torch.Tensor:
    """``root``'s tensor on every site, like ``torch.distributed.broadcast``: a site other
    than ``root`` that passes a tensor gets the result written into it (same shape and
    dtype, bfloat16 included, bit for bit); one that passes None gets a new tensor (a
    bfloat16 root tensor then arrives as its int16 bits)."""
    array = None if tensor is None else to_numpy(tensor)[0]
    got = client.broadcast(tag, array, root=root, **kwargs)
    if tensor is None:
        return as_tensor(got)
    if client.site != root:
        bits = tensor.detach().view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
        copy_into(bits, got)
    return tensor
