"""One reduction across sites as a site's ranks do it: reduce inside the site, one rank
crosses the WAN, the result comes back to every rank of the site.

Inside the site the ranks form a ``torch.distributed`` group (Gloo on CPU, NCCL on GPUs);
its rank 0 holds the ``wangate.Client`` (it runs on the gateway host). Every collective here
is issued in the same order on every rank of the site, which is what Gloo and NCCL require.
If the WAN step fails, rank 0 still tells the others, so no rank waits on a reduction that
will never come: every rank raises the same ``CrossSiteError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from wangate.errors import WangateError
from wangate.tensorlike import as_wire_array
from wangate.torch.convert import copy_into

if TYPE_CHECKING:
    from wangate.client import Client

# Dtypes the cross-site reduction adds up as they are; others go over the WAN as float32.
WAN_REDUCE_DTYPES = (torch.float32, torch.float64, torch.float16)


class CrossSiteError(WangateError):
    """The cross-site step of a site's reduction failed; every rank of the site raises it."""


@dataclass
class SiteGroup:
    """The ranks of one site and, on its rank 0, the client of the site's gateway."""

    client: Client | None
    group: dist.ProcessGroup | None = None  # None: the default group (or a one-rank site)

    def __post_init__(self) -> None:
        if self.is_leader and self.client is None:
            raise WangateError(
                "the site's rank 0 needs a wangate.Client (it talks to the gateway); "
                "pass client=wangate.Client(socket) there and None on the other ranks"
            )

    @property
    def size(self) -> int:
        if not dist.is_available() or not dist.is_initialized():
            return 1
        return int(dist.get_world_size(self.group))

    @property
    def is_leader(self) -> bool:
        return self.size == 1 or dist.get_rank(self.group) == 0

    @property
    def leader_global_rank(self) -> int:
        if self.group is None:
            return 0
        return int(dist.get_global_rank(self.group, 0))

    def broadcast_from_leader(self, tensor: torch.Tensor) -> None:
        if self.size > 1:
            dist.broadcast(tensor, src=self.leader_global_rank, group=self.group)

    def allreduce_mean(
        self,
        buffer: torch.Tensor,
        *,
        tag: str,
        step: int,
        codec: str | None,
        critical: bool,
        timeout_s: float,
    ) -> None:
        """Replace ``buffer`` (a flat tensor, the same shape on every rank) in place by its
        mean over the site's ranks, then over the sites."""
        self.mean_in_site(buffer)
        failure = self.mean_across_sites(
            buffer, tag=tag, step=step, codec=codec, critical=critical, timeout_s=timeout_s
        )
        self.share_result(buffer, failure, tag=tag, step=step)

    def mean_in_site(self, buffer: torch.Tensor) -> None:
        """Step 1, every rank: the mean over the site's ranks."""
        if self.size > 1:
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
            buffer.div_(self.size)

    def mean_across_sites(
        self,
        buffer: torch.Tensor,
        *,
        tag: str,
        step: int,
        codec: str | None,
        critical: bool,
        timeout_s: float,
    ) -> BaseException | None:
        """Step 2, the site's rank 0 only (a no-op elsewhere): the gateway's mean over the
        sites, in place; the failure, if any, is returned for ``share_result``. Uses no
        site collective, so it may run on another thread."""
        if not self.is_leader:
            return None
        assert self.client is not None
        try:
            wan = buffer if buffer.dtype in WAN_REDUCE_DTYPES else buffer.float()
            array, _ = as_wire_array(wan)
            result = self.client.allreduce(
                tag, array, step=step, op="mean", codec=codec, critical=critical,
                timeout=timeout_s,
            )  # fmt: skip
            copy_into(buffer, np.asarray(result))
        except Exception as exc:
            return exc
        return None

    def share_result(
        self,
        buffer: torch.Tensor,
        failure: BaseException | None,
        *,
        tag: str,
        step: int,
        what: str = "allreduce",
    ) -> None:
        """Step 3, every rank: rank 0's result (or its failure) to the whole site."""
        if self.size > 1:
            flag = [0 if failure is None else 1]  # on the buffer's device: NCCL needs that
            status = torch.tensor(flag, dtype=torch.int32, device=buffer.device)
            self.broadcast_from_leader(status)
            if int(status.item()) == 0:
                self.broadcast_from_leader(buffer)
            elif failure is None:
                raise CrossSiteError(
                    f"{tag!r} step {step}: the site's rank 0 failed the cross-site "
                    f"{what} (its log has the reason)"
                )
        if failure is not None:
            raise CrossSiteError(
                f"{tag!r} step {step}: cross-site {what} failed: {failure}"
            ) from failure
