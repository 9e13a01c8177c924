"""Hostile traffic against a real daemon pair on loopback while real traffic flows.

    python -m bench robustness flood [--packets 100000] [--rate-pps 50000]
        [--baseline-packets 10000]

Two daemons (``LoopbackSites``, 2 paths; sh dials bj). Throughout, sh and bj exchange
256 KiB messages both ways and bj sends sh a 1 KiB critical message every 20 ms; every
message is checked byte for byte. bj's first listening socket (which also carries the
accepted real path) is flooded, one phase after the other:

- ``one-source``: forged 1200-byte Initials, random connection IDs, one address;
- ``spoofed``: the same from random sources in 127.64.0.0/10 (raw socket, root);
- ``bad-token``: Initials with random tokens the size of a real one;
- ``garbage``: short-header packets for no connection;
- ``validated``: Initials carrying valid Retry tokens obtained from 20 real addresses
  (the Retry exchange done for each), which the listener must admit within its caps.

Each phase reports bj's RSS before, at its peak and after (3 s later; the validated
phase waits out the handshake timeout), bj's CPU, datagrams the kernel dropped on the
socket, and whether any real path went down. Side by side, in one run: the daemon as
built, the same with the collector tuned as it was (``--tuned-gc``), and the listener
before this change (aioquic ``serve()``, ``--baseline-packets`` of one-source only).
A quiet phase first measures CPU per GiB and critical latency without a flood.
Handshake time with and without Retry is measured in-process on the same listener.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wangate.lab.flood import (
    RssSampler,
    flood_in_subprocess,
    listen_address,
    rss_mib,
    socket_drops,
)
from wangate.lab.traffic import Traffic, TrafficResult
from wangate.loopback import LoopbackSites, SiteProcess

MiB = 1 << 20
COLLECTOR_VARIANTS = (("tuned gc", ["--tuned-gc"]), ("default gc", []))
DOWN_LINE = re.compile(r"path \S+ down:|\S+/\S+ down:")


class VariantSites(LoopbackSites):
    """``LoopbackSites`` whose daemons run through ``flood_daemon`` with options."""

    def __init__(self, options: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = options

    def daemon_command(self) -> list[str]:
        return [sys.executable, "-m", "bench.robustness.flood_daemon", *self.options, "--", "-v"]

    def launch(
        self, site: SiteProcess, *, log_mode: str = "ab", env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        root = str(Path(__file__).resolve().parents[2])  # bench importable by the daemon
        path = root + os.pathsep + os.environ.get("PYTHONPATH", "")
        return super().launch(site, log_mode=log_mode, env={**(env or {}), "PYTHONPATH": path})


# ------------------------------------------------------------------- phases


@dataclass
class Phase:
    variant: str
    name: str
    packets: int
    seconds: float
    rss_before_mib: float
    rss_peak_mib: float
    rss_after_mib: float
    cpu_bj_s: float
    cpu_sh_s: float
    kernel_drops: int
    paths_down: int
    critical_p50_ms: float | None
    critical_max_ms: float | None
    traffic_mib: float
    extra: dict[str, int]


def run_phase(
    variant: str,
    name: str,
    lab: LoopbackSites,
    traffic: Traffic,
    sampler: RssSampler,
    action: Callable[[], dict[str, int]],
    settle_s: float,
) -> Phase:
    bj, sh = lab["bj"], lab["sh"]
    target = listen_address(bj.config_path)
    logs_before = (len(bj.log_path.read_bytes()), len(sh.log_path.read_bytes()))
    drops0 = socket_drops(target)
    cpu0 = (lab.cpu_seconds(bj), lab.cpu_seconds(sh))
    traffic_bytes0 = traffic.result.bytes
    traffic.take_latencies()
    before = sampler.reset()
    started = time.perf_counter()
    extra = action()
    seconds = time.perf_counter() - started
    time.sleep(settle_s)
    after = rss_mib(bj.process.pid) if bj.process else float("nan")
    down = 0
    for site, offset in zip((bj, sh), logs_before, strict=True):
        text = site.log_path.read_bytes()[offset:].decode(errors="replace")
        down += len(DOWN_LINE.findall(text))
    latencies = traffic.take_latencies()
    return Phase(
        variant=variant,
        name=name,
        packets=extra.get("sent", 0),
        seconds=round(seconds, 2),
        rss_before_mib=round(before, 1),
        rss_peak_mib=round(sampler.peak, 1),
        rss_after_mib=round(after, 1),
        cpu_bj_s=round(lab.cpu_seconds(bj) - cpu0[0], 2),
        cpu_sh_s=round(lab.cpu_seconds(sh) - cpu0[1], 2),
        kernel_drops=socket_drops(target) - drops0,
        paths_down=down,
        critical_p50_ms=round(statistics.median(latencies) * 1000, 2) if latencies else None,
        critical_max_ms=round(max(latencies) * 1000, 2) if latencies else None,
        traffic_mib=round((traffic.result.bytes - traffic_bytes0) / MiB, 1),
        extra=extra,
    )


def run_variant(
    variant: str, options: list[str], kinds: list[tuple[str, int]], rate_pps: float, quiet_s: float
) -> tuple[list[Phase], TrafficResult]:
    directory = Path(tempfile.mkdtemp(prefix="wangate-flood-"))
    lab = VariantSites(options, sites=2, paths=2, directory=directory)
    phases: list[Phase] = []
    with lab:
        bj = lab["bj"]
        assert bj.process is not None
        target = listen_address(bj.config_path)
        sampler = RssSampler(bj.process.pid)
        traffic = Traffic(lab)
        traffic.start()
        try:
            phases.append(
                run_phase(variant, "quiet", lab, traffic, sampler, lambda: {}, settle_s=quiet_s)
            )
            for kind, count in kinds:
                settle_s = 6.0 if kind == "validated" else 3.0

                def action(kind: str = kind, count: int = count) -> dict[str, int]:
                    return flood_in_subprocess(kind, target, count, rate_pps)

                phases.append(run_phase(variant, kind, lab, traffic, sampler, action, settle_s))
                print(json.dumps(asdict(phases[-1])), flush=True)
        finally:
            result = traffic.stop()
            sampler.stop()
    return phases, result


# ------------------------------------------------------------------ collector


@dataclass
class CollectorRun:
    variant: str
    seconds: float
    gib: float
    cpu_s: float  # both daemons
    cpu_s_per_gib: float
    critical_p50_ms: float
    critical_p99_ms: float
    critical_max_ms: float
    rss_start_mib: float
    rss_peak_mib: float
    rss_end_mib: float
    critical_lost: list[int]
    errors: list[str]


def collector_run(variant: str, options: list[str], seconds: float) -> CollectorRun:
    """Bulk both ways as fast as the checks keep up, critical every 20 ms, no flood."""
    directory = Path(tempfile.mkdtemp(prefix="wangate-gc-"))
    lab = VariantSites(options, sites=2, paths=2, directory=directory)
    with lab:
        bj = lab["bj"]
        assert bj.process is not None
        sampler = RssSampler(bj.process.pid)
        start_rss = sampler.reset()
        cpu0 = sum(lab.cpu_seconds(s) for s in lab.sites)
        traffic = Traffic(lab, bulk_every_s=0.0)
        started = time.perf_counter()
        traffic.start()
        time.sleep(seconds)
        result = traffic.stop()
        elapsed = time.perf_counter() - started
        cpu_s = sum(lab.cpu_seconds(s) for s in lab.sites) - cpu0
        end_rss = rss_mib(bj.process.pid)
        sampler.stop()
    lat = np.array(result.critical_latency_s) * 1000
    gib = result.bytes / (1 << 30)
    return CollectorRun(
        variant,
        round(elapsed, 1),
        round(gib, 3),
        round(cpu_s, 2),
        round(cpu_s / gib, 1) if gib else float("nan"),
        round(float(np.percentile(lat, 50)), 2),
        round(float(np.percentile(lat, 99)), 2),
        round(float(lat.max()), 2),
        round(start_rss, 1),
        round(sampler.peak, 1),
        round(end_rss, 1),
        result.critical_lost,
        result.errors,
    )


# ---------------------------------------------------------------- handshakes


def handshake_times(connections: int) -> dict[str, list[float]]:
    """Connect ``connections`` times to one listener with Retry and to one without,
    alternately; the seconds from connect() to a completed handshake."""
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic.configuration import QuicConfiguration

    from wangate.certs import create_ca, issue_site_certificate
    from wangate.net import aioquic_compat as compat
    from wangate.net.listener import listen_for_peers

    directory = Path(tempfile.mkdtemp(prefix="wangate-hs-"))
    create_ca(directory)
    cert, key = issue_site_certificate(directory, "bj")
    server_cfg = QuicConfiguration(is_client=False, alpn_protocols=["hs"])
    server_cfg.load_cert_chain(cert, key)
    client_cfg = QuicConfiguration(is_client=True, alpn_protocols=["hs"], server_name="bj")
    client_cfg.load_verify_locations(cafile=str(directory / "ca.pem"))

    async def main() -> dict[str, list[float]]:
        ports = {}
        listeners = []
        for retry in (True, False):
            listener = await listen_for_peers(
                "127.0.0.1",
                0,
                configuration=server_cfg,
                create_protocol=QuicConnectionProtocol,
                is_established=lambda p: compat.handshake_complete(compat.connection_of(p)),
                retry=retry,
            )
            assert listener.transport is not None
            ports[retry] = listener.transport.get_extra_info("sockname")[1]
            listeners.append(listener)
        times: dict[str, list[float]] = {"retry": [], "no-retry": []}
        for _ in range(connections):
            for retry in (True, False):
                started = time.perf_counter()
                async with connect("127.0.0.1", ports[retry], configuration=client_cfg):
                    times["retry" if retry else "no-retry"].append(time.perf_counter() - started)
        for listener in listeners:
            listener.close()
        return times

    return asyncio.run(main())


# ---------------------------------------------------------------------- report


def markdown(phases: list[Phase]) -> str:
    head = (
        "| variant | phase | packets | s | RSS before / peak / after MiB | CPU s bj | "
        "kernel drops | paths down | critical p50 / max ms | traffic MiB |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for p in phases:
        crit = "-" if p.critical_p50_ms is None else f"{p.critical_p50_ms} / {p.critical_max_ms}"
        rows.append(
            f"| {p.variant} | {p.name} | {p.packets} | {p.seconds} | "
            f"{p.rss_before_mib} / {p.rss_peak_mib} / {p.rss_after_mib} | {p.cpu_bj_s} | "
            f"{p.kernel_drops} | {p.paths_down} | {crit} | {p.traffic_mib} |"
        )
    return head + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench robustness flood", description=__doc__)
    parser.add_argument("--packets", type=int, default=100_000)
    parser.add_argument("--rate-pps", type=float, default=20_000)
    parser.add_argument("--baseline-packets", type=int, default=10_000)
    parser.add_argument("--validated", type=int, default=1_000)
    parser.add_argument("--quiet-s", type=float, default=8.0)
    parser.add_argument("--handshakes", type=int, default=100)
    parser.add_argument("--collector-s", type=float, default=30.0)
    parser.add_argument("--collector-rounds", type=int, default=2)
    parser.add_argument("--only", choices=["flood", "collector", "handshake"], default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    n = args.packets
    kinds = [
        ("one-source", n),
        ("spoofed", n),
        ("bad-token", n),
        ("garbage", n),
        ("validated", args.validated),
    ]
    variants = [
        ("wangate", [], kinds),
        ("tuned gc", ["--tuned-gc"], kinds),
        ("aioquic serve()", ["--aioquic-serve"], [("one-source", args.baseline_packets)]),
    ]
    report: dict[str, Any] = {}
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if args.only in (None, "collector"):
        runs = []
        for _ in range(args.collector_rounds):  # alternated, so load changes hit both
            for variant, options in COLLECTOR_VARIANTS:
                runs.append(collector_run(variant, options, args.collector_s))
                print(json.dumps(asdict(runs[-1])), flush=True)
        report["collector"] = [asdict(r) for r in runs]
    if args.only in (None, "flood"):
        phases: list[Phase] = []
        traffic: dict[str, dict[str, Any]] = {}
        for variant, options, variant_kinds in variants:
            got, result = run_variant(variant, options, variant_kinds, args.rate_pps, args.quiet_s)
            phases += got
            traffic[variant] = {
                "messages": result.messages,
                "critical_lost": result.critical_lost,
                "errors": result.errors,
            }
        print(markdown(phases))
        print("traffic:", json.dumps(traffic))
        report["phases"] = [asdict(p) for p in phases]
        report["traffic"] = traffic
    if args.only in (None, "handshake"):
        times = handshake_times(args.handshakes)
        report["handshake"] = {
            k: {
                "median_ms": round(statistics.median(v) * 1000, 2),
                "p90_ms": round(float(np.percentile(v, 90)) * 1000, 2),
            }
            for k, v in times.items()
        }
        print("handshake (loopback):", json.dumps(report["handshake"]))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))
    return 0
