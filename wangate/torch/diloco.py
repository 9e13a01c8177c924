"""DiLoCo outer steps: every site trains on its own for H inner steps, then the sites average
their pseudo-gradients through the gateway and take one outer optimizer step together.

    diloco = wangate.torch.DiLoCo(model, inner_opt, gw, sync_every=20, codec="int8")
    for batch in data:
        loss(model, batch).backward(); inner_opt.step(); inner_opt.zero_grad()
        diloco.step()            # every 20th call: the outer step across sites

The pseudo-gradient is (parameters at the last sync) - (parameters now). Its mean over the
sites drives an outer SGD with Nesterov momentum (outer_lr 0.7 as in the DiLoCo paper,
momentum 0.5: the paper's 0.9 suits hundreds of outer steps, and over tens of them it
overshoots; bench/RESULTS.md, "Training") on a float32 copy of the parameters at the
last sync; the result is copied into the model on every rank of every site. All sites
start from the same parameters (use ``sync_parameters``), add the same mean and run the
same optimizer, so they stay identical bit for bit. A site with several ranks reduces
inside the site first (``group``).

With ``overlap=True`` (Streaming DiLoCo's one-step delay) the cross-site exchange runs in
the background while the next inner step trains; the step after it applies the outer
update and keeps that inner step's own progress: parameters = new outer parameters +
(now - at the sync point). The outer parameters stay identical across sites; the model
differs by each site's one local step. Call ``finish()`` after the last step.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from wangate.errors import WangateError
from wangate.torch.site import SiteGroup

if TYPE_CHECKING:
    from wangate.client import Client


@dataclass
class _Flight:
    """An outer exchange in progress (overlap mode)."""

    pseudo: torch.Tensor
    snapshot: list[torch.Tensor]
    step: int
    thread: threading.Thread | None = None
    failure: list[BaseException | None] = field(default_factory=lambda: [None])


class DiLoCo:
    def __init__(
        self,
        model: torch.nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        client: Client | None,
        *,
        sync_every: int = 20,
        outer_lr: float = 0.7,
        momentum: float = 0.5,
        nesterov: bool = True,
        codec: str | None = None,
        group: dist.ProcessGroup | None = None,
        tag: str = "diloco",
        timeout_s: float = 60.0,
        overlap: bool = False,
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
        self.overlap = overlap
        self.inner_steps = 0
        self.outer_steps = 0
        self._flight: _Flight | None = None

    def step(self) -> bool:
        """Count one inner step; every ``sync_every``-th runs the outer step (with overlap,
        starts it, and the next call applies it). True if an outer step was applied."""
        self.inner_steps += 1
        applied = False
        if self._flight is not None:
            self._land()
            applied = True
        if self.inner_steps % self.sync_every == 0:
            if self.overlap:
                self._launch()
            else:
                self.sync()
                applied = True
        return applied

    def finish(self) -> None:
        """Apply an outer step still in flight (overlap mode); a no-op otherwise."""
        if self._flight is not None:
            self._land()

    @torch.no_grad()
    def sync(self) -> None:
        """The outer step now: average pseudo-gradients across sites, step, resynchronise."""
        self.finish()
        pseudo = self._pseudo_gradient()
        self.site.allreduce_mean(
            pseudo,
            tag=self.tag,
            step=self.outer_steps,
            codec=self.codec,
            critical=False,
            timeout_s=self.timeout_s,
        )
        self._outer_step(pseudo)
        for a, p in zip(self.anchor, self.params, strict=True):
            p.copy_(a)

    def _pseudo_gradient(self) -> torch.Tensor:
        pairs = zip(self.anchor, self.params, strict=True)
        return torch.cat([(a - p.detach().float()).reshape(-1) for a, p in pairs])

    def _outer_step(self, mean_pseudo: torch.Tensor) -> None:
        offset = 0
        for a in self.anchor:
            a.grad = mean_pseudo[offset : offset + a.numel()].view_as(a)
            offset += a.numel()
        self.outer_optimizer.step()
        for a in self.anchor:
            a.grad = None
        self.outer_steps += 1

    @torch.no_grad()
    def _launch(self) -> None:
        flight = _Flight(
            self._pseudo_gradient(),
            [p.detach().float().clone() for p in self.params],
            self.outer_steps,
        )
        self.site.mean_in_site(flight.pseudo)  # site collectives stay on this thread

        def exchange() -> None:
            flight.failure[0] = self.site.mean_across_sites(
                flight.pseudo, tag=self.tag, step=flight.step, codec=self.codec,
                critical=False, timeout_s=self.timeout_s,
            )  # fmt: skip

        flight.thread = threading.Thread(target=exchange, name="wangate-diloco", daemon=True)
        flight.thread.start()
        self._flight = flight

    @torch.no_grad()
    def _land(self) -> None:
        flight, self._flight = self._flight, None
        assert flight is not None and flight.thread is not None
        flight.thread.join()
        self.site.share_result(flight.pseudo, flight.failure[0], tag=self.tag, step=flight.step)
        self._outer_step(flight.pseudo)
        for a, p, at_sync in zip(self.anchor, self.params, flight.snapshot, strict=True):
            p.copy_(a + (p.detach().float() - at_sync))
