"""DiLoCo outer steps: every site trains on its own for H inner steps, then the sites average
their pseudo-gradients through the gateway and take one outer optimizer step together.

    diloco = wangate.torch.DiLoCo(model, inner_opt, gw, sync_every=20, codec="int8")
    for batch in data:
        loss(model, batch).backward(); inner_opt.step(); inner_opt.zero_grad()
        diloco.step()            # every 20th call: the outer step across sites

The pseudo-gradient is (parameters at the last sync) - (parameters now). Its mean over the
sites drives an outer SGD with Nesterov momentum (outer_lr 0.7, momentum 0.9, as in the
DiLoCo paper) on a float32 copy of the parameters at the last sync; the result is copied
into the model on every rank of every site. All sites start from the same parameters (use
``sync_parameters``), add the same mean and run the same optimizer, so they stay identical
bit for bit. A site with several ranks reduces inside the site first (``group``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from wangate.errors import WangateError
from wangate.torch.site import SiteGroup

if TYPE_CHECKING:
    from wangate.client import Client


class DiLoCo:
    def __init__(
        self,
        model: torch.nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        client: Client | None,
        *,
        sync_every: int = 20,
        outer_lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        codec: str | None = None,
        group: dist.ProcessGroup | None = None,
        tag: str = "diloco",
        timeout_s: float = 60.0,
    ) -> None:
        if sync_every < 1:
            raise WangateError(f"sync_every must be at least 1, got {sync_every}")
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.site = SiteGroup(client, group)
        self.sync_every = sync_every
        self.codec = codec
        self.tag = tag
        self.timeout_s = timeout_s
        self.params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            self.anchor = [p.detach().float().clone() for p in self.params]
        self.outer_optimizer = torch.optim.SGD(
            self.anchor, lr=outer_lr, momentum=momentum, nesterov=nesterov
        )
        self.inner_steps = 0
        self.outer_steps = 0

    def step(self) -> bool:
        """Count one inner step; every ``sync_every``-th runs the outer step. True if it did."""
        self.inner_steps += 1
        if self.inner_steps % self.sync_every:
            return False
        self.sync()
        return True

    @torch.no_grad()
    def sync(self) -> None:
        """The outer step now: average pseudo-gradients across sites, step, resynchronise."""
        pseudo = torch.cat(
            [
                (a - p.detach().float()).reshape(-1)
                for a, p in zip(self.anchor, self.params, strict=True)
            ]
        )
        self.site.allreduce_mean(
            pseudo,
            tag=self.tag,
            step=self.outer_steps,
            codec=self.codec,
            critical=False,
            timeout_s=self.timeout_s,
        )
        offset = 0
        for a in self.anchor:
            a.grad = pseudo[offset : offset + a.numel()].view_as(a)
            offset += a.numel()
        self.outer_optimizer.step()
        for a, p in zip(self.anchor, self.params, strict=True):
            p.copy_(a)
            a.grad = None
        self.outer_steps += 1
