"""A DDP communication hook that reduces inside the site and across sites through wangate.

    state = wangate.torch.AllreduceHookState(client=gw if site_rank == 0 else None)
    ddp.register_comm_hook(state, wangate.torch.allreduce_hook)

The DDP process group is the site's own ranks. For each gradient bucket the hook averages
the bucket over the site's ranks (Gloo/NCCL), the site's rank 0 hands the site mean to the
gateway's allreduce (op="mean" over sites) and broadcasts the result back inside the site,
so every rank of every site ends with the global mean (exact when every rank has the same
batch size). The work runs on one thread per process, in the order DDP hands buckets over
(which is the same on every rank), so backward keeps computing while buckets travel.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, typed
from torch.futures import Future

from wangate.errors import WangateError
from wangate.torch.convert import copy_into, to_numpy
from wangate.torch.site import SiteGroup

if TYPE_CHECKING:
    from wangate.client import Client


def first_layers(bucket: GradBucket) -> bool:
    """True for the bucket holding the model's first layers: DDP fills buckets in reverse
    parameter order, so that is the last bucket of an iteration (``is_last``), the one the
    next forward pass needs first."""
    return bool(bucket.is_last())


@dataclass
class AllreduceHookState:
    """What ``allreduce_hook`` needs; one per DDP model, the same settings on every rank.

    ``client``: the site gateway's client on the site's rank 0, None on the other ranks.
    ``group``: the site's ranks (None: DDP's default group). ``codec``: a codec spec for
    every bucket, or a function of the bucket (None: the gateway's policy). ``critical``:
    which buckets go as critical (default: the first layers' bucket). ``step`` counts
    iterations (it advances after each iteration's last bucket).
    """

    client: Client | None
    group: dist.ProcessGroup | None = None
    codec: str | Callable[[GradBucket], str | None] | None = None
    critical: Callable[[GradBucket], bool] = first_layers
    timeout_s: float = 60.0
    tag: str = "ddp"
    step: int = 0
    site: SiteGroup = field(init=False)
    _jobs: queue.SimpleQueue[Callable[[], None] | None] = field(
        init=False, default_factory=queue.SimpleQueue
    )
    _worker: threading.Thread | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.site = SiteGroup(self.client, self.group)

    def codec_for(self, bucket: GradBucket) -> str | None:
        return self.codec(bucket) if callable(self.codec) else self.codec

    def submit(self, job: Callable[[], None]) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="wangate-ddp-hook", daemon=True)
            self._worker.start()
        self._jobs.put(job)

    def close(self) -> None:
        """Stop the worker thread (it also ends with the process)."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join()
            self._worker = None

    def reduce(
        self, buffer: torch.Tensor, *, tag: str, step: int, codec: str | None, critical: bool
    ) -> None:
        """One bucket's global mean, in place (every rank of the site calls it in order)."""
        self.site.allreduce_mean(
            buffer, tag=tag, step=step, codec=codec, critical=critical, timeout_s=self.timeout_s
        )

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()


def allreduce_hook(state: AllreduceHookState, bucket: GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: the bucket's mean over every rank of every site (see the module doc)."""
    buffer = bucket.buffer()
    tag = f"{state.tag}.b{bucket.index()}"
    step = state.step
    codec = state.codec_for(bucket)
    critical = state.critical(bucket)
    if bucket.is_last():
        state.step += 1
    future: Future[torch.Tensor] = Future()

    def job() -> None:
        try:
            state.reduce(buffer, tag=tag, step=step, codec=codec, critical=critical)
        except BaseException as exc:
            future.set_exception(exc)  # type: ignore[arg-type]  # the stub is wrong
        else:
            future.set_result(buffer)

    state.submit(job)
    # A future completed by set_exception hands DDP's C++ side the exception object as its
    # value; chained, the failure becomes a proper error that backward() raises.
    return future.then(_value)


def _value(future: Future[torch.Tensor]) -> torch.Tensor:
    return future.value()


# DDP checks a hook's annotations as objects; with postponed evaluation they are strings.
allreduce_hook.__annotations__ = {
    "state": AllreduceHookState,
    "bucket": GradBucket,
    "return": Future[torch.Tensor],
}


def sync_parameters(
    module: torch.nn.Module,
    client: Client | None,
    *,
    root: str,
    group: dist.ProcessGroup | None = None,
    tag: str = "params",
    step: int = 0,
    timeout_s: float = 60.0,
) -> None:
    """Make ``module``'s parameters and buffers those of site ``root``'s rank 0, on every
    rank of every site: a gateway broadcast between the sites' rank 0s, then a broadcast
    inside each site. Call it on every rank before training (``client`` on rank 0 only).
    The state travels as its raw bytes, so every dtype arrives bit for bit."""
    site = SiteGroup(client, group)
    tensors = [*module.parameters(), *module.buffers()]
    for t in tensors:
        if not t.is_contiguous():
            raise WangateError("sync_parameters needs contiguous parameters and buffers")
    if not tensors:
        return
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1).view(torch.uint8).cpu() for t in tensors])
        failure: BaseException | None = None
        if site.is_leader:
            assert client is not None
            try:
                mine, _ = to_numpy(flat)
                given = mine if client.site == root else None
                got: Any = client.broadcast(tag, given, root=root, step=step, timeout=timeout_s)
                copy_into(flat, _same_size(got, flat.numel(), root))
            except Exception as exc:
                failure = exc
        shared = flat.to(tensors[0].device)  # the in-site broadcast runs where the model is
        site.share_result(shared, failure, tag=tag, step=step, what="parameter broadcast")
        offset = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            t.detach().reshape(-1).view(torch.uint8).copy_(shared[offset : offset + n])
            offset += n


def _same_size(array: Any, nbytes: int, root: str) -> Any:
    if getattr(array, "nbytes", None) != nbytes:
        raise WangateError(
            f"site {root!r} sent {getattr(array, 'nbytes', '?')} bytes of parameters, this "
            f"model has {nbytes}: the sites must build the same model"
        )
    return array.reshape(-1).view("u1")
