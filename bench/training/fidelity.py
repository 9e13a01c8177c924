"""Training fidelity through the gateway: a character-level model on the Python standard
library's own source, trained across three loopback sites through the DDP hook with each
codec and with DiLoCo, against uncompressed DDP; final validation loss and WAN bytes.

Run: .venv/bin/python -m bench training fidelity [--steps 1000] [--seeds 3] [--runs none,int8,...]
     sudo .venv/bin/python -m bench training fidelity --lab coll_3_quarter --runs none,diloco  # lab

Three real gateways on loopback (``LoopbackSites``, 2 QUIC paths between each pair), one
trainer process per site, each its own one-rank DDP group with
``wangate.torch.allreduce_hook`` (the gateway's allreduce, op="mean", across sites). Model:
a character MLP (16 characters of context, 16-wide embeddings, two 128-wide GELU layers,
63k parameters), AdamW with cosine decay from a peak lr of 8e-3 (the best of 3, 6, 8 and
12e-3 for uncompressed DDP: ``bench.training.search``), 64 windows per site per step.
DiLoCo: the same inner optimiser on each site's own 64 windows, ``wangate.torch.DiLoCo``'s
outer step with its defaults (Nesterov, lr 0.7, momentum 0.5) every H inner steps. Seeds
fix initialisation and batches, so runs of one seed differ only by how gradients cross
the WAN. WAN bytes: what each site's gateway sent on its paths
(QUIC packets, all overhead included) per inner step, averaged over sites. Runs are
deterministic per seed; ``--report LOG`` tabulates the complete seeds of a saved output.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import argparse
import contextlib
import json
import math
import socket
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import wangate
import wangate.torch as wt
from wangate.loopback import SITE_NAMES, LoopbackSites

CONTEXT, EMBED, HIDDEN, BATCH = 16, 16, 128, 64
PEAK_LR, TEXT_BYTES, VALID_WINDOWS = 8e-3, 3_000_000, 4096
SITES = 3
# (name, codec for the hook or DiLoCo, DiLoCo H or 0 for DDP)
RUNS = {
    "none": (None, 0),
    "fp16": ("fp16", 0),
    "int8": ("int8", 0),
    "topk": ("topk:0.01", 0),
    "diloco": (None, 20),
    "diloco-int8": ("int8", 20),
}


def corpus() -> np.ndarray:
    """The standard library's .py files, in sorted order, as codes 0..95 (printable ASCII,
    newline; anything else maps to code 0)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= TEXT_BYTES:
            break
    raw = np.frombuffer(b"".join(chunks)[:TEXT_BYTES], dtype=np.uint8)
    codes = np.where((raw >= 32) & (raw < 127), raw - 31, 0).astype(np.int64)
    codes[raw == 10] = 96 - 1
    return codes


VOCAB = 96


class CharMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, EMBED)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(CONTEXT * EMBED, HIDDEN),
            torch.nn.GELU(),
            torch.nn.Linear(HIDDEN, HIDDEN),
            torch.nn.GELU(),
            torch.nn.Linear(HIDDEN, VOCAB),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.embed(x).flatten(1))  # type: ignore[no-any-return]


def windows(codes: np.ndarray, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(CONTEXT + 1)
    block = torch.from_numpy(codes[idx])
    return block[:, :CONTEXT], block[:, CONTEXT]


def learning_rate(step: int, steps: int) -> float:
    return PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))


def sent_bytes(gw: wangate.Client) -> int:
    return sum(int(row["sent_bytes"]) for row in gw.paths())


def run_one(
    gw: wangate.Client, site: int, name: str, seed: int, steps: int, codes: np.ndarray
) -> dict[str, Any]:
    codec, sync_every = RUNS[name]
    split = int(len(codes) * 0.9)
    valid = windows(
        codes, np.random.default_rng(99).integers(split, len(codes) - CONTEXT - 1, VALID_WINDOWS)
    )
    torch.manual_seed(seed)
    model = CharMLP()
    wt.sync_parameters(model, gw, root="bj", tag=f"init.{name}.{seed}")
    data = np.random.default_rng([seed, site])
    before = sent_bytes(gw)
    started = time.perf_counter()
    if sync_every:
        optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR)
        trainer: torch.nn.Module = model
        diloco = wt.DiLoCo(
            model, optimizer, gw, sync_every=sync_every, codec=codec, tag=f"diloco.{name}.{seed}"
        )
    else:
        trainer = DistributedDataParallel(model)
        state = wt.AllreduceHookState(client=gw, codec=codec, tag=f"ddp.{name}.{seed}")
        trainer.register_comm_hook(state, wt.allreduce_hook)
        optimizer = torch.optim.AdamW(trainer.parameters(), lr=PEAK_LR)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps)
        x, y = windows(codes, data.integers(0, split - CONTEXT - 1, BATCH))
        loss = torch.nn.functional.cross_entropy(trainer(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if sync_every:
            diloco.step()
    elapsed = time.perf_counter() - started
    wan = sent_bytes(gw) - before
    if not sync_every:
        state.close()
    with torch.no_grad():
        valid_loss = float(torch.nn.functional.cross_entropy(model(valid[0]), valid[1]))
    return {
        "run": name,
        "seed": seed,
        "site": site,
        "valid_loss": valid_loss,
        "wan_bytes_per_step": wan / steps,
        "seconds": elapsed,
    }


def site_main(index: int, sockets: list[str], args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    codes = corpus()
    results = []
    with wangate.Client(sockets[index]) as gw:
        for seed in range(args.seeds):
            for name in args.runs.split(","):
                results.append(run_one(gw, index, name, seed, args.steps, codes))
                if index == 0:
                    print(json.dumps(results[-1]), flush=True)
    Path(out, f"{index}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    names = args.runs.split(",")
    by = {(r["run"], r["seed"], r["site"]): r for r in results}
    sites = sorted({r["site"] for r in results})
    seeds = range(args.seeds)
    base = {s: by[("none", s, 0)]["valid_loss"] for s in seeds}
    base_bytes = np.mean([by[("none", s, i)]["wan_bytes_per_step"] for s in seeds for i in sites])
    print(
        f"\nchar-MLP on the stdlib source ({sum(p.numel() for p in CharMLP().parameters()):,} "
        f"parameters), {SITES} sites, {args.steps} inner steps, {args.seeds} seeds; WAN bytes "
        f"averaged over the gateways of sites {[SITE_NAMES[i] for i in sites]}. "
        "'vs none': mean and spread (min..max) of the per-seed change in final validation "
        "loss against uncompressed DDP.\n"
    )
    print("| run | valid loss | vs none | WAN bytes / inner step / site | fewer bytes |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        losses = [by[(name, s, 0)]["valid_loss"] for s in seeds]
        change = [100 * (by[(name, s, 0)]["valid_loss"] / base[s] - 1) for s in seeds]
        wan = float(np.mean([by[(name, s, i)]["wan_bytes_per_step"] for s in seeds for i in sites]))
        spread = f"{min(change):+.3f}..{max(change):+.3f}"
        print(
            f"| {name} | {np.mean(losses):.4f} | {np.mean(change):+.3f}% ({spread}) | "
            f"{wan:,.0f} | {base_bytes / wan:.1f}x |"
        )
    for name in names:  # every site ends with the same model, or the run is void
        for s in seeds:
            site_losses = {by[(name, s, i)]["valid_loss"] for i in sites}
            if len(site_losses) != 1:
                print(f"WARNING: {name} seed {s}: sites ended with different models {site_losses}")


@contextlib.contextmanager
def lab_gateways(scenario_name: str) -> Iterator[list[str]]:
    """Gateways of a WAN lab scenario (its first three sites must be bj, sh, gz); the
    trainers stay in this namespace and reach them by their Unix sockets."""
    from bench.runner.gateways import start_gateways, stop_gateways
    from wangate.lab.lab import Lab
    from wangate.lab.scenario import load_scenario

    scenario = load_scenario(scenario_name)
    if list(scenario.sites) != list(SITE_NAMES[:SITES]):
        raise SystemExit(
            f"--lab needs sites {SITE_NAMES[:SITES]}, {scenario_name} has {scenario.sites}"
        )
    with Lab(scenario) as lab:
        logs = lab.state_dir / "logs"
        gateways, _ = start_gateways(lab, lab.write_gateway_configs(), logs, prefix="training-")
        try:
            yield [str(lab.gateway_socket(s)) for s in SITE_NAMES[:SITES]]
        finally:
            stop_gateways(gateways)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench training fidelity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument(
        "--lab", metavar="SCENARIO", help="train over the gateways of this WAN lab scenario"
    )
    parser.add_argument(
        "--report", metavar="LOG", help="only tabulate the seeds complete in a saved output"
    )
    args = parser.parse_args(argv)
    if "none" not in args.runs.split(","):
        args.runs = "none," + args.runs
    if args.report:  # the JSON lines site 0 prints as it goes
        lines = Path(args.report).read_text().splitlines()
        results = [json.loads(line) for line in lines if line.startswith("{")]
        names = args.runs.split(",")
        done = [
            s
            for s in sorted({r["seed"] for r in results})
            if {r["run"] for r in results if r["seed"] == s} >= set(names)
        ]
        args.seeds = len(done)
        report([r for r in results if r["seed"] in done], args)
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out, contextlib.ExitStack() as stack:
        if args.lab:
            sockets = stack.enter_context(lab_gateways(args.lab))
        else:
            lab = stack.enter_context(LoopbackSites(SITES, 2, verbose=False))
            sockets = [str(site.socket_path) for site in lab.sites]
        mp.spawn(site_main, args=(sockets, args, out), nprocs=len(sockets))
        results = [
            r for i in range(len(sockets)) for r in json.loads(Path(out, f"{i}.json").read_text())
        ]
    report(results, args)
    print(f"\n{time.perf_counter() - started:.0f} s wall")
