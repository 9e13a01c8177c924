"""One rank of one site in the DDP test: ``python -m tests.torch_ddp_worker ARGS_JSON``.

Trains the model of ``tests.test_torch_ddp`` with DDP inside the site (Gloo on 127.0.0.1)
and ``wangate.torch.allreduce_hook`` across sites, and saves the parameters after every
step, the losses and which buckets went as critical.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import wangate
import wangate.torch as wt


def build_model(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 48),
        torch.nn.Tanh(),
        torch.nn.Linear(48, 48),
        torch.nn.Tanh(),
        torch.nn.Linear(48, 4),
    )


def batch(step: int, site: int, rank: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng([step, site, rank])
    x = rng.standard_normal((size, 8)).astype(np.float32)
    y = np.sin(x[:, :4] * 1.5 + x[:, 4:]).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


def flat_params(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def main(args: dict[str, object]) -> None:
    torch.set_num_threads(1)
    site, rank = int(str(args["site_index"])), int(str(args["rank"]))
    # Gloo's own wait is bounded too (its default is 30 minutes): a rank whose site
    # partner died fails instead of hanging the run.
    dist.init_process_group(
        "gloo",
        init_method=str(args["init"]),
        rank=rank,
        world_size=int(str(args["ranks"])),
        timeout=timedelta(seconds=120),
    )
    job = str(args["job"]) if args.get("job") else None
    client = wangate.Client(str(args["socket"]), job=job) if rank == 0 else None
    if args.get("alone"):
        alone(args, client, site, rank)
        dist.destroy_process_group()
        if client is not None:
            client.close()
        return
    model = build_model(100 + 10 * site + rank)  # every rank starts elsewhere ...
    wt.sync_parameters(model, client, root=str(args["root"]))  # ... until the broadcast
    history = [flat_params(model)]
    first_weight = model[0].weight.data_ptr()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.004)
    critical_log: list[list[object]] = []

    def critical(bucket: dist.GradBucket) -> bool:
        chosen = wt.first_layers(bucket)
        has_first = any(p.data_ptr() == first_weight for p in bucket.parameters())
        critical_log.append([state.step, bucket.index(), chosen, has_first])
        return chosen

    state = wt.AllreduceHookState(client=client, critical=critical, timeout_s=60.0)
    ddp.register_comm_hook(state, wt.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(int(str(args["steps"]))):
        x, y = batch(step + int(str(args.get("data_offset", 0))), site, rank)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
        history.append(flat_params(model))
    state.close()
    out = Path(str(args["out"]))
    np.savez(out / f"{site}-{rank}.npz", params=np.stack(history), losses=np.array(losses))
    (out / f"{site}-{rank}.critical.json").write_text(json.dumps(critical_log))
    dist.destroy_process_group()
    if client is not None:
        client.close()


def alone(args: dict[str, object], client: wangate.Client | None, site: int, rank: int) -> None:
    """One step with no other site taking part: every rank must raise, none may hang."""
    ddp = DistributedDataParallel(build_model(1))
    state = wt.AllreduceHookState(
        client=client, timeout_s=float(str(args["timeout_s"])), tag="alone"
    )
    ddp.register_comm_hook(state, wt.allreduce_hook)
    x, y = batch(0, site, rank)
    started = time.monotonic()
    try:
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        outcome = {"error": None}
    except RuntimeError as exc:  # DDP re-raises the hook's CrossSiteError as RuntimeError
        outcome = {"error": str(exc)}
    outcome["seconds"] = time.monotonic() - started
    Path(str(args["out"]), f"alone-{rank}.json").write_text(json.dumps(outcome))
    state.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
