"""CPU per GiB with worker processes ([workers] count), on loopback, one path.

    python -m bench transport workers [--mib 256] [--counts 1,2,4] [--datagram 1452]
        [--runs 3] [--tree REV]   # and the daemons of REV, interleaved: before/after
        [--idle-s 3]          # how long the idle cost is measured before each transfer

For each count, side by side in one run (the counts interleaved run by run): two real
daemons (``LoopbackSites``, one path, MTU = datagram + 28) with that many workers
each, one trainer sending ``--mib`` MiB in 16 MiB messages, one receiving them. CPU
seconds are read from /proc/PID/stat of every process of both daemons (the
coordinator and each worker; with count 1 the one daemon process), so the figures
hold on a shared machine; wall time does not. With count >= 2 worker 0 carries only
critical messages, so the bulk stripes go to count - 1 workers.

Reported per count: seconds, goodput, CPU seconds of coordinators and of workers,
CPU seconds per GiB moved (both sides), the coordinators' share, the ratio of CPU per
GiB to count 1, and Mbit per CPU-second; the median over runs and the spread
(min..max). Every process also costs CPU while idle (timers, keep-alives: measured for
``IDLE_S``, ``SETTLE_S`` after every path is up, before the transfer), which grows
with wall time, not bytes: on a loaded machine a slow run pays more of it. "beyond
idle" subtracts that rate times the transfer's seconds, leaving the cost of the bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass

import numpy as np

from bench import tree as trees
from bench.transport.cpu import transfer
from bench.tree import THIS, Tree
from wangate.loopback import LoopbackSites, process_cpu_s

MiB = 1 << 20
GiB = 1 << 30
MESSAGE_BYTES = 16 * MiB
IDLE_S = 3.0
SETTLE_S = 2.0
START_TIMEOUT_S = 120.0
IPV4_UDP_OVERHEAD = 28


@dataclass(frozen=True)
class Run:
    workers: int
    total_bytes: int
    seconds: float
    coordinator_cpu_s: float  # both sites' daemon processes (all of it with count 1)
    worker_cpu_s: float  # both sites' worker processes
    idle_cpu_s: float  # what all of them would have used idle for as long
    idle_coordinator_rate: float  # CPU-s per idle second, per daemon process (coordinator)
    idle_worker_rate: float  # CPU-s per idle second, per worker process (0: none)

    @property
    def cpu_s_per_gib_beyond_idle(self) -> float:
        return (self.cpu_s - self.idle_cpu_s) / (self.total_bytes / GiB)

    @property
    def cpu_s(self) -> float:
        return self.coordinator_cpu_s + self.worker_cpu_s

    @property
    def cpu_s_per_gib(self) -> float:
        return self.cpu_s / (self.total_bytes / GiB)

    @property
    def coordinator_share(self) -> float:
        return self.coordinator_cpu_s / self.cpu_s

    @property
    def goodput_mbps(self) -> float:
        return self.total_bytes * 8 / self.seconds / 1e6

    @property
    def mbit_per_cpu_s(self) -> float:
        return self.total_bytes * 8 / self.cpu_s / 1e6


def run_once(
    workers: int,
    datagram_bytes: int,
    total_bytes: int,
    tree: Tree = THIS,
    idle_s: float = IDLE_S,
) -> Run:

    count = max(1, total_bytes // MESSAGE_BYTES)
    message = np.frombuffer(os.urandom(MESSAGE_BYTES), dtype=np.uint8)
    lab = LoopbackSites(
        2, 1, mtu=datagram_bytes + IPV4_UDP_OVERHEAD, verbose=False, workers=workers
    )
    with contextlib.ExitStack() as stack:
        stack.callback(lab.stop)
        with tree.active():
            lab.start(timeout_s=START_TIMEOUT_S)  # a busy machine starts N processes slowly
        time.sleep(SETTLE_S)  # paths validated, routes chosen: then idle is idle
        pids: dict[str, list[int]] = {}
        for site in lab.sites:
            assert site.process is not None
            with site.client() as gw:
                status = gw.status()
            pids[site.name] = [site.process.pid] + [w["pid"] for w in status.get("workers", [])]
        coordinators = [p[0] for p in pids.values()]
        worker_pids = [pid for p in pids.values() for pid in p[1:]]
        idle_from = {pid: process_cpu_s(pid) for pid in coordinators + worker_pids}
        time.sleep(idle_s)  # the processes' idle cost per second, measured as they are now
        before = {pid: process_cpu_s(pid) for pid in coordinators + worker_pids}
        idle_rate = sum(before[pid] - idle_from[pid] for pid in before) / idle_s

        def rate(group: list[int]) -> float:
            return sum(before[p] - idle_from[p] for p in group) / idle_s / max(1, len(group))

        seconds, _ = transfer(lab, message, count)
        used = {pid: process_cpu_s(pid) - before[pid] for pid in before}
    return Run(
        workers,
        count * MESSAGE_BYTES,
        seconds,
        sum(used[pid] for pid in coordinators),
        sum(used[pid] for pid in worker_pids),
        idle_rate * seconds,
        rate(coordinators),
        rate(worker_pids),
    )


def _spread(values: list[float], fmt: str) -> str:
    middle = statistics.median(values)
    if len(values) == 1:
        return format(middle, fmt)
    return f"{format(middle, fmt)} ({format(min(values), fmt)}..{format(max(values), fmt)})"


def table(runs: dict[int, list[Run]], datagram_bytes: int) -> str:
    base = statistics.median(r.cpu_s_per_gib for r in runs[min(runs)])
    base_beyond = statistics.median(r.cpu_s_per_gib_beyond_idle for r in runs[min(runs)])
    lines = [
        f"datagram {datagram_bytes} bytes; median (min..max) over {len(runs[min(runs)])} runs",
        "",
        "| workers | MiB | seconds | goodput Mbit/s | CPU s coordinators | CPU s workers "
        "| CPU s per GiB | coordinator share | CPU/GiB vs 1 worker | Mbit per CPU-second "
        "| CPU s per GiB beyond idle | beyond idle vs 1 worker "
        "| idle CPU s/min per daemon or coordinator | idle CPU s/min per worker |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workers, group in sorted(runs.items()):
        share = [r.coordinator_share for r in group] if workers > 1 else []
        idle_workers = _spread([60 * r.idle_worker_rate for r in group], ".2f")
        lines.append(
            f"| {workers} | {group[0].total_bytes // MiB} "
            f"| {_spread([r.seconds for r in group], '.2f')} "
            f"| {_spread([r.goodput_mbps for r in group], '.0f')} "
            f"| {_spread([r.coordinator_cpu_s for r in group], '.2f')} "
            f"| {_spread([r.worker_cpu_s for r in group], '.2f')} "
            f"| {_spread([r.cpu_s_per_gib for r in group], '.1f')} "
            f"| {_spread([100 * s for s in share], '.1f') + ' %' if share else '-'} "
            f"| {_spread([r.cpu_s_per_gib / base for r in group], '.2f')} "
            f"| {_spread([r.mbit_per_cpu_s for r in group], '.0f')} "
            f"| {_spread([r.cpu_s_per_gib_beyond_idle for r in group], '.1f')} "
            f"| {_spread([r.cpu_s_per_gib_beyond_idle / base_beyond for r in group], '.2f')} "
            f"| {_spread([60 * r.idle_coordinator_rate for r in group], '.2f')} "
            f"| {idle_workers if workers > 1 else '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench transport workers", description=__doc__)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--datagram", type=int, default=1452)
    parser.add_argument("--runs", type=int, default=3)
    trees.add_argument(parser)
    parser.add_argument("--idle-s", type=float, default=IDLE_S)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    compared = trees.trees(args)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"commit {commit}, {platform.python_version()}, load {os.getloadavg()}", flush=True)
    runs: dict[Tree, dict[int, list[Run]]] = {t: {c: [] for c in counts} for t in compared}
    for index in range(args.runs):
        for workers in counts:
            for tree in compared:
                run = run_once(workers, args.datagram, args.mib * MiB, tree, args.idle_s)
                runs[tree][workers].append(run)
                print(
                    f"run {index} {tree.label} workers {workers}: {run.seconds:.2f} s, "
                    f"{run.cpu_s:.2f} CPU s "
                    f"(coordinators {run.coordinator_cpu_s:.2f}, idle {run.idle_cpu_s:.2f}), "
                    f"{run.cpu_s_per_gib:.1f} CPU s/GiB, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    print(f"load after {os.getloadavg()}")
    for tree in compared:
        print(f"\n{tree.label}:\n{table(runs[tree], args.datagram)}")
    return 0
