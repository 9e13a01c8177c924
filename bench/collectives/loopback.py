"""Allreduce across loopback sites against a naive all-to-all over send/recv.

    python -m bench collectives loopback [--sites 3] [--elements 8388608] [--repeat 3]
        [--paths 2]

Real daemons (``LoopbackSites``), one trainer process per site. Each trial starts with a
barrier, then every site reduces the same float32 tensor (``--elements``) either with
``Client.allreduce`` (reduce-scatter/all-gather, shares by measured capacity, 1 MiB
chunks) or with the naive all-to-all (every site ``send``s its whole tensor to every
other and sums what it ``recv``s in sorted site order). Modes alternate within each
repetition, so both see the same machine load. Every result is checked bit for bit
against the reference sum.

Reported per mode (median over repetitions): wall time (the slowest site), the bytes
each site's trainer handed to its gateway, the trainers' CPU seconds (reduction, codec
and socket copies; ``time.process_time`` in each trainer process) and the gateways'
CPU seconds (/proc), and, separately, what the reduction alone costs in the trainer:
the figure that would move onto the daemon's single core if the daemon reduced, and an
int8 encode + decode of one tensor, which would move with it under a lossy policy.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import statistics
import time
import zlib
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from wangate.client import Client
from wangate.codec import decode_tensor, encode_tensor
from wangate.collective.arith import reduce_in_order
from wangate.loopback import LoopbackSites

MODES = ("allreduce", "alltoall")


def tensor(site: str, n: int) -> np.ndarray:
    return np.random.default_rng([ord(c) for c in site]).standard_normal(n, dtype=np.float32)


def worker(conn: Connection, socket_path: str, site: str, sites: list[str], n: int) -> None:
    data = tensor(site, n)
    peers = [s for s in sites if s != site]
    with Client(socket_path) as gw:
        while True:
            command = conn.recv()
            if command is None:
                return
            mode, step = command
            gw.barrier("bench-start", step=step, sites=sites, timeout=120)
            wall, cpu = time.perf_counter(), time.process_time()
            if mode == "allreduce":
                result = gw.allreduce("bench", data, step=step, sites=sites, timeout=600)
            else:
                for peer in peers:
                    gw.send(peer, "bench-a2a", data, step=step)
                parts = {site: data}
                for peer in peers:
                    parts[peer] = gw.recv("bench-a2a", source=peer, step=step, timeout=600)
                ordered = [parts[s] for s in sorted(parts)]
                result = reduce_in_order(ordered, "sum", data.dtype, len(ordered))
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            conn.send((wall, cpu, zlib.crc32(np.ascontiguousarray(result).view(np.uint8))))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench collectives loopback")
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--paths", type=int, default=2)
    parser.add_argument("--elements", type=int, default=8 << 20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    n = args.elements
    ctx = mp.get_context("spawn")
    with LoopbackSites(args.sites, args.paths, verbose=False) as lab:
        sites = [s.name for s in lab.sites]
        inputs = {s: tensor(s, n) for s in sites}
        reference = reduce_in_order([inputs[s] for s in sorted(sites)], "sum", np.dtype("f4"), 1)
        want = zlib.crc32(reference.view(np.uint8))
        del inputs
        pipes, procs = {}, []
        for site in sites:
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=worker, args=(child, str(lab[site].socket_path), site, sites, n)
            )
            proc.start()
            pipes[site] = parent
            procs.append(proc)
        rows: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
        step = 0
        try:
            for _ in range(args.repeat):
                for mode in MODES:
                    step += 1
                    daemon_cpu = sum(lab.cpu_seconds(s) for s in lab.sites)
                    for site in sites:
                        pipes[site].send((mode, step))
                    answers = [pipes[site].recv() for site in sites]
                    daemon_cpu = sum(lab.cpu_seconds(s) for s in lab.sites) - daemon_cpu
                    bad = [s for s, a in zip(sites, answers, strict=True) if a[2] != want]
                    if bad:
                        raise SystemExit(f"{mode}: wrong result at {bad}")
                    wall = max(a[0] for a in answers)
                    trainer_cpu = sum(a[1] for a in answers)
                    rows[mode].append((wall, trainer_cpu, daemon_cpu))
                    print(f"{mode:9} step {step}: {wall:.2f} s", flush=True)
        finally:
            for site in sites:
                pipes[site].send(None)
            for proc in procs:
                proc.join(30)
    report(args, rows, n, len(sites))
    return 0


def report(args: Any, rows: dict[str, list[tuple[float, float, float]]], n: int, k: int) -> None:
    nbytes = n * 4
    sent = {"allreduce": 2 * (k - 1) / k * nbytes, "alltoall": (k - 1) * nbytes}
    parts = [np.random.default_rng(i).standard_normal(n, dtype=np.float32) for i in range(k)]
    cpu = time.process_time()
    for _ in range(3):
        reduce_in_order(parts, "sum", np.dtype("f4"), k)
    reduce_s = (time.process_time() - cpu) / 3
    cpu = time.process_time()
    for part in parts:
        encoded = encode_tensor(part, "int8")
        decode_tensor(encoded.meta, encoded.payload)
    codec_s = (time.process_time() - cpu) / k
    print()
    print(f"{k} loopback sites, {args.paths} paths each, {n} float32 ({nbytes / 2**20:.0f} MiB)")
    print(f"machine: {platform.processor() or platform.machine()}, {mp.cpu_count()} cores")
    print("| mode | wall s (median) | ratio | MB sent per site | trainer CPU s | gateway CPU s |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(r[0] for r in rows["alltoall"])
    for mode in MODES:
        wall = statistics.median(r[0] for r in rows[mode])
        trainer = statistics.median(r[1] for r in rows[mode])
        daemon = statistics.median(r[2] for r in rows[mode])
        print(
            f"| {mode} | {wall:.2f} | {wall / base:.2f} | {sent[mode] / 1e6:.1f} "
            f"| {trainer:.2f} | {daemon:.2f} |"
        )
    print(
        f"reduction alone (sum of {k} x {nbytes / 2**20:.0f} MiB in the trainer): "
        f"{reduce_s * 1e3:.0f} ms CPU; an int8 encode + decode of one tensor: "
        f"{codec_s * 1e3:.0f} ms CPU"
    )
