"""``wangate demo``: several sites on loopback, real daemons, real QUIC, real gradients.

Every site sends every other site one bulk gradient, cut in buckets as a trainer hands
them over, and before each bucket a small critical array; all pairs at once. Every
receiver checks each array bit for bit against what its sender sent. Then it prints
each site's paths table and a summary: what moved between which sites, how fast, and
the CPU each site's daemon used.

The gateways share one host, and on a small one their CPU, not a link, is the
bottleneck. A loopback path's true RTT is 0.1 ms, and past 3 x 10 ms it counts as
degraded; two things keep the paths from being judged against a starved host:

* each gateway is sized as if it had its share of the cores, by the daemon's own rule
  (``WorkersConfig.resolved``): on a small host, no worker processes, which would only
  compete for the cores;
* the load is paced to the host: ``OFFERED_MBPS_PER_CORE`` in all. Unpaced, the
  gateways take more datagrams than their cores keep up with (each path's congestion
  control probes for its own share of the same CPU), the datagrams wait in socket
  buffers, and every path's RTT shows the wait: 40-120 ms on 2 cores.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wangate.config import WorkersConfig
from wangate.loopback import LoopbackSites, SiteProcess, process_cpu_s
from wangate.rows import PathRow
from wangate.views import fmt_bytes, format_paths_table

BUCKET_BYTES = 512 << 10  # the bulk gradient goes in buckets of this size
# What the demo offers, over all pairs, per core of the host: about 40 % of what a
# core's share of sending and receiving gateways carries, so no queue builds
OFFERED_MBPS_PER_CORE = 100


def gradient(source: str, dest: str, tag: str, size_bytes: int) -> np.ndarray:
    """Deterministic, heavy-tailed float32 'gradient'."""
    seed = abs(hash((source, dest, tag))) % (1 << 32)
    rng = np.random.default_rng(seed)
    return rng.standard_t(3, size=max(1, size_bytes // 4)).astype(np.float32)


def critical_array(source: str, dest: str, step: int) -> np.ndarray:
    return gradient(source, dest, f"layer0.bias/{step}", 1024 * (1 + step % 16))


def host_cores() -> int:
    """The cores this process may run on (a container's or taskset's share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class WorkerPlan:
    count: int  # the [workers] count of every gateway (1: no worker processes)
    why: str


def plan_workers(cores: int, sites: int, paths: int) -> WorkerPlan:
    """Worker processes per gateway when ``sites`` gateways share ``cores``."""
    share = cores // sites
    count = WorkersConfig().resolved(share, paths)
    split = f"this host has {cores} cores for {sites} gateways"
    if count < 2:
        return WorkerPlan(
            count,
            f"none, each gateway is one process: {split}, and a gateway starts worker "
            "processes only with 4 cores of its own (fewer would compete for them)",
        )
    return WorkerPlan(
        count,
        f"{count} per gateway: {split}, {share} each; a gateway runs one worker per path "
        "and one for critical messages, within its cores less one for itself",
    )


@dataclass
class Pair:
    """What one site sends another, and what of it arrived."""

    source: str
    dest: str
    bulk: np.ndarray
    interval_s: float  # between buckets: the pair's share of the offered rate
    sent_at: dict[int, float] = field(default_factory=dict)  # a critical array's step
    latencies_s: list[float] = field(default_factory=list)
    arrays: int = 0
    bytes: int = 0
    done_s: float = 0.0  # when its last array arrived, counted from the start
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def buckets(self) -> list[np.ndarray]:
        return np.array_split(self.bulk, max(1, -(-self.bulk.nbytes // BUCKET_BYTES)))

    @property
    def expected(self) -> int:
        return 2 * len(self.buckets)  # a critical array before each bucket

    def check(self, got: np.ndarray, want: np.ndarray, what: str, started: float) -> None:
        with self.lock:  # its two receivers: the critical arrays and the buckets
            self.arrays += 1
            self.bytes += got.nbytes
            self.done_s = time.perf_counter() - started
        if got.tobytes() != want.tobytes():
            self.problems.append(f"{self.source}->{self.dest} {what}: not bit for bit")


def _send(site: SiteProcess, pair: Pair, started: float) -> None:
    try:
        with site.client() as gw:
            due = started
            for step, bucket in enumerate(pair.buckets):
                # paced, without catching up: a late bucket does not bring the next closer
                time.sleep(max(0.0, due - time.perf_counter()))
                due = max(due, time.perf_counter()) + pair.interval_s
                pair.sent_at[step] = time.perf_counter()
                array = critical_array(pair.source, pair.dest, step)
                gw.send(pair.dest, "layer0.bias", array, step=step, critical=True)
                gw.send(pair.dest, "bucket.bulk", bucket, step=step)
    except Exception as exc:  # reported in the summary
        pair.problems.append(f"{pair.source} send to {pair.dest}: {exc}")


def _receive(site: SiteProcess, pair: Pair, started: float, critical: bool) -> None:
    """The pair's critical arrays, or its buckets: apart, so that a critical array's
    time is its own, not that of the buckets before it."""
    try:
        with site.client() as gw:
            for step, bucket in enumerate(pair.buckets):
                if critical:
                    got = gw.recv("layer0.bias", source=pair.source, step=step, timeout=60)
                    pair.latencies_s.append(time.perf_counter() - pair.sent_at[step])
                    want = critical_array(pair.source, pair.dest, step)
                    pair.check(got, want, f"critical {step}", started)
                else:
                    got = gw.recv("bucket.bulk", source=pair.source, step=step, timeout=60)
                    pair.check(got, bucket, f"bucket {step}", started)
    except Exception as exc:
        pair.problems.append(f"{pair.dest} receive from {pair.source}: {exc}")


def host_busy_s() -> float | None:
    """CPU seconds every core of the host has been busy since boot (Linux /proc/stat)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class CpuUse:
    """CPU seconds during the run: each site's (daemon process, with its workers)."""

    sites: dict[str, tuple[float, float]]
    demo_s: float  # this process: the clients' threads
    host_s: float | None  # every process on the host


def _cpu_now(lab: LoopbackSites) -> CpuUse:
    sites = {s.name: (process_cpu_s(lab.pids(s)[0]), lab.cpu_seconds(s)) for s in lab.sites}
    return CpuUse(sites, _own_cpu_s(), host_busy_s())


def _cpu_since(lab: LoopbackSites, before: CpuUse) -> CpuUse:
    now = _cpu_now(lab)
    sites = {
        name: (own - before.sites[name][0], total - before.sites[name][1])
        for name, (own, total) in now.sites.items()
    }
    host = None if now.host_s is None or before.host_s is None else now.host_s - before.host_s
    return CpuUse(sites, now.demo_s - before.demo_s, host)


def run_demo(sites: int = 3, paths: int = 3, size_mib: int = 32) -> int:
    cores = host_cores()
    workers = plan_workers(cores, sites, paths)
    pairs_n = sites * (sites - 1)
    offered_mbps = OFFERED_MBPS_PER_CORE * cores
    interval_s = BUCKET_BYTES * 8 / (offered_mbps * 1e6 / pairs_n)
    plural = "s" if paths > 1 else ""
    print(f"wangate demo: {sites} sites on loopback, {paths} QUIC path{plural} between each pair")
    print(f"  worker processes: {workers.why}")
    print(
        f"  each site sends each other site a bulk gradient of {size_mib} MiB in "
        f"{fmt_bytes(BUCKET_BYTES)} buckets, each after a critical array of 1-16 KiB, "
        f"all pairs at once; paced to the host: {offered_mbps} Mbit/s in all "
        f"({OFFERED_MBPS_PER_CORE} per core), {offered_mbps / pairs_n:.0f} per pair"
    )
    with LoopbackSites(sites, paths, verbose=False, workers=workers.count) as lab:
        names = [s.name for s in lab.sites]
        daemons = ", ".join(f"{s.name} (pid {s.process.pid})" for s in lab.sites if s.process)
        print(f"  daemons up: {daemons}; configs and logs in {lab.directory}")
        pairs = [
            Pair(s, d, gradient(s, d, "bulk", size_mib << 20), interval_s)
            for s in names
            for d in names
            if s != d
        ]
        started = time.perf_counter()
        threads = []
        for pair in pairs:
            source, dest = lab[pair.source], lab[pair.dest]
            for critical in (True, False):
                args = (dest, pair, started, critical)
                threads.append(threading.Thread(target=_receive, args=args))
            threads.append(threading.Thread(target=_send, args=(source, pair, started)))
        cpu_before = _cpu_now(lab)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        cpu = _cpu_since(lab, cpu_before)
        states: Counter[str] = Counter()
        for site in lab.sites:
            with site.client() as gw:
                rows = PathRow.from_dicts(gw.paths())
            states.update(row.state for row in rows)
            print(f"\nsite {site.name}: wangate paths")
            print(format_paths_table(rows))
    return _summary(pairs, elapsed, cpu, states, cores, workers.count)


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / max(seconds, 1e-9) / 1e6


def _summary(
    pairs: list[Pair],
    elapsed: float,
    cpu: CpuUse,
    states: Counter[str],
    cores: int,
    workers: int,
) -> int:
    print("\nwhat moved, every array checked bit for bit against what its sender sent:")
    for p in pairs:
        print(
            f"  {p.source} -> {p.dest}  {p.arrays} of {p.expected} arrays "
            f"({len(p.buckets)} buckets, {len(p.buckets)} critical)  "
            f"{fmt_bytes(p.bytes):>9}  in {p.done_s:5.2f} s  "
            f"{mbps(p.bytes, p.done_s):4.0f} Mbit/s"
        )
    arrays = sum(p.arrays for p in pairs)
    expected = sum(p.expected for p in pairs)
    total = sum(p.bytes for p in pairs)
    print(
        f"  all {len(pairs)} pairs  {arrays} of {expected} arrays  {fmt_bytes(total)}  "
        f"in {elapsed:.2f} s  {mbps(total, elapsed):.0f} Mbit/s aggregate"
    )
    latencies = sorted(s for p in pairs for s in p.latencies_s)
    if latencies:
        median, p99 = (latencies[int(q * (len(latencies) - 1))] * 1000 for q in (0.5, 0.99))
        print(
            f"critical arrays, handed to the gateway to received: median {median:.1f} ms, "
            f"99th percentile {p99:.1f} ms, worst {latencies[-1] * 1000:.1f} ms"
        )
    shown = ", ".join(f"{states[s]} {s}" for s in ("up", "degraded", "down") if states[s])
    rows = "path and worker" if workers > 1 else "path"
    print(f"paths after the run: {shown} (one row per {rows})")
    if states["up"] < sum(states.values()):
        print(
            "  (a loopback path counts as degraded when its srtt passes 3 x 10 ms: that is "
            "the gateways waiting for a core; see how busy the host was below)"
        )
    _print_cpu(cpu, elapsed, cores, workers)
    problems = [problem for p in pairs for problem in p.problems]
    for problem in problems:
        print(f"  problem: {problem}")
    ok = arrays == expected and not problems
    print("demo OK: every array arrived bit for bit" if ok else "demo FAILED")
    return 0 if ok else 1


def _print_cpu(cpu: CpuUse, elapsed: float, cores: int, workers: int) -> None:
    daemons_s = sum(total_s for _, total_s in cpu.sites.values())
    print(
        f"CPU during the {elapsed:.2f} s (user+system seconds, from /proc; this host has "
        f"{cores} cores):"
    )
    for name, (own_s, total_s) in cpu.sites.items():
        split = f" (daemon {own_s:.2f} s, its {workers} workers {total_s - own_s:.2f} s)"
        print(
            f"  {name} daemon: {total_s:.2f} s, {total_s / elapsed:.2f} cores"
            + (split if workers > 1 else "")
        )
    print(f"  the demo's client threads: {cpu.demo_s:.2f} s")
    if cpu.host_s is not None:
        others_s = max(0.0, cpu.host_s - daemons_s - cpu.demo_s)
        print(
            f"  the host: {cpu.host_s / elapsed:.2f} of {cores} cores busy, "
            f"{others_s / elapsed:.2f} of them with other processes"
        )
