"""Settings search for training fidelity, in one process: the model, data and optimisers of
``bench.training.fidelity`` with the gateway replaced by the collective's own sans-IO arithmetic.

Run: .venv/bin/python -m bench training search [--steps 1000] [--seeds 3] [--lr 8e-3] CONFIG...
     CONFIG: '{"name": "topk", "kind": "ddp", "options": {"codec": "topk:0.01"}}', or "kind":
     "diloco" with DiLoCo's arguments; "inner_lr" and "optimizer" ("sgd") in options too

Each site is a thread running the real ``wangate.torch`` hook or ``DiLoCo`` against an
``InProcessClient``: its ``allreduce`` waits for every site's call, then runs one
``AllreduceRun`` per site (the same plan, codec, error feedback per hop and sorted-order
reduction as ``Client.allreduce``) and hands each site its result. Only the transport is
missing: at the settings of bench/RESULTS.md it gave the gateway runs' losses to the
digits reported for none, int8 and DiLoCo, and top-k's within 0.05 % (DDP's bucket lays the
parameters out in another order, which top-k's selection sees). Use it to search settings
in minutes, and ``bench.training.fidelity`` (real gateways) for WAN bytes.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import threading
from typing import Any

import numpy as np
import torch

import wangate.torch as wt
from bench.training.fidelity import BATCH, PEAK_LR, CharMLP, corpus, learning_rate, windows
from wangate.codec import decode_tensor
from wangate.collective.allreduce import AllreduceRun
from wangate.collective.feedback import HopFeedback
from wangate.collective.plan import Plan
from wangate.loopback import SITE_NAMES

INIT = threading.Lock()


class Hub:
    """What the sites' gateways and the WAN would do for one allreduce, in memory."""

    def __init__(self, sites: list[str]) -> None:
        self.sites = sites
        self.feedback = {s: HopFeedback() for s in sites}
        self.wire_bytes = {s: 0 for s in sites}
        self._cond = threading.Condition()
        self._calls: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self._results: dict[tuple[str, int], dict[str, np.ndarray]] = {}

    def allreduce(self, site: str, tag: str, array: np.ndarray, step: int, spec: str) -> np.ndarray:
        key = (tag, step)
        with self._cond:
            self._calls.setdefault(key, {})[site] = np.array(array, copy=True)
            if len(self._calls[key]) == len(self.sites):
                self._results[key] = self._reduce(tag, self._calls.pop(key), spec)
                self._cond.notify_all()
            while site not in self._results.get(key, {}):
                self._cond.wait()
            result = self._results[key].pop(site)
            if not self._results[key]:
                del self._results[key]
            return result

    def _reduce(self, tag: str, arrays: dict[str, np.ndarray], spec: str) -> dict[str, np.ndarray]:
        plan = Plan.equal(self.sites)
        runs = {
            s: AllreduceRun(
                site=s, plan=plan, tag=tag, array=a, op="mean", spec=spec, feedback=self.feedback[s]
            )
            for s, a in arrays.items()
        }
        queue = [(s, out) for s, run in runs.items() for out in run.start()]
        while queue:
            source, out = queue.pop(0)
            self.wire_bytes[source] += (len(out.meta) + len(out.payload)) * len(out.peers)
            for peer in out.peers:
                value = decode_tensor(out.meta, out.payload)
                queue.extend((peer, o) for o in runs[peer].receive(source, out.tag, value))
        return {s: run.result() for s, run in runs.items()}


class InProcessClient:
    def __init__(self, hub: Hub, site: str) -> None:
        self.hub, self.site = hub, site

    def allreduce(self, tag: str, array: np.ndarray, **kw: Any) -> np.ndarray:
        assert kw.get("op") == "mean"
        return self.hub.allreduce(self.site, tag, array, kw["step"], kw.get("codec") or "none")


def site_run(
    client: InProcessClient,
    index: int,
    codes: np.ndarray,
    seed: int,
    steps: int,
    kind: str,
    options: dict[str, Any],
    out: dict[int, float],
) -> None:
    torch.set_num_threads(1)
    split = int(len(codes) * 0.9)
    rng = np.random.default_rng(99)
    valid = windows(codes, rng.integers(split, len(codes) - 17, 4096))
    with INIT:  # torch's global generator is shared by the threads
        torch.manual_seed(seed)
        model = CharMLP()
    data = np.random.default_rng([seed, index])
    peak = float(options.pop("inner_lr", PEAK_LR))
    optimizer: torch.optim.Optimizer
    kind_of_optimizer = options.pop("optimizer", "adamw")
    if kind_of_optimizer.startswith("sgd"):  # "sgd": momentum 0.9; "sgd0": none
        momentum = 0.0 if kind_of_optimizer == "sgd0" else 0.9
        optimizer = torch.optim.SGD(model.parameters(), lr=peak, momentum=momentum)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=peak)
    diloco = state = None
    if kind == "diloco":
        diloco = wt.DiLoCo(model, optimizer, client, **options)  # type: ignore[arg-type]
    else:
        state = wt.AllreduceHookState(client=client, **options)  # type: ignore[arg-type]
    params = list(model.parameters())
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps) * peak / PEAK_LR
        x, y = windows(codes, data.integers(0, split - 17, BATCH))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if state is not None:  # what DDP does with one bucket: flatten, hook, unflatten
            flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
            codec = state.codec if isinstance(state.codec, str) else None
            state.reduce(flat, tag="ddp.b0", step=step, codec=codec, critical=True)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))  # type: ignore[union-attr]
                offset += p.numel()
        optimizer.step()
        if diloco is not None:
            diloco.step()
    if diloco is not None:
        diloco.finish()
    with torch.no_grad():
        out[index] = float(torch.nn.functional.cross_entropy(model(valid[0]), valid[1]))


def run(
    codes: np.ndarray, seed: int, steps: int, kind: str, options: dict[str, Any]
) -> dict[str, Any]:
    sites = list(SITE_NAMES[:3])
    hub = Hub(sites)
    out: dict[int, float] = {}
    threads = [
        threading.Thread(
            target=site_run,
            args=(InProcessClient(hub, s), i, codes, seed, steps, kind, dict(options), out),
        )
        for i, s in enumerate(sites)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(set(out.values())) != 1:
        raise SystemExit(f"sites ended with different models: {out}")
    return {"loss": out[0], "payload_bytes_per_step": hub.wire_bytes[sites[0]] / steps}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench training search", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lr", type=float, default=PEAK_LR, help="the baseline's peak lr")
    parser.add_argument(
        "configs",
        nargs="+",
        help='JSON: {"name": ..., "kind": "ddp"|"diloco", "options": {...}}',
    )
    args = parser.parse_args(argv)
    codes = corpus()
    base: dict[int, float] = {}
    for seed in range(args.seeds):
        base[seed] = run(codes, seed, args.steps, "ddp", {"inner_lr": args.lr})["loss"]
    print(f"none: {np.mean(list(base.values())):.4f} {base}", flush=True)
    for text in args.configs:
        config = json.loads(text)
        changes, losses, wire = [], [], []
        for seed in range(args.seeds):
            options = {"inner_lr": args.lr, **config.get("options", {})}
            r = run(codes, seed, args.steps, config["kind"], options)
            losses.append(r["loss"])
            wire.append(r["payload_bytes_per_step"])
            changes.append(100 * (r["loss"] / base[seed] - 1))
        print(
            f"{config['name']}: loss {np.mean(losses):.4f} vs none {np.mean(changes):+.2f} % "
            f"({min(changes):+.2f}..{max(changes):+.2f}) payload/step {np.mean(wire):,.0f} "
            f"{json.dumps(config.get('options', {}))}",
            flush=True,
        )
