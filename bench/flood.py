"""Hostile traffic against a real daemon pair on loopback while real traffic flows.

    python -m bench.flood [--packets 100000] [--rate-pps 50000] [--baseline-packets 10000]

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
import contextlib
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.forge import (
    SpoofingSender,
    forged_initial,
    looks_like_token,
    short_header_garbage,
    validated_initials,
)
from wangate.errors import RecvTimeout
from wangate.loopback import LoopbackSites

MiB = 1 << 20
BULK_BYTES = 256 * 1024
BULK_EVERY_S = 0.05  # 40 Mbit/s each way: well within what both daemons and checks keep up with
CRITICAL_EVERY_S = 0.02
CRITICAL_LOST_S = 10.0  # a critical message this late counts as lost, and the next is due
COLLECTOR_VARIANTS = (("tuned gc", ["--tuned-gc"]), ("default gc", []))
DOWN_LINE = re.compile(r"path \S+ down:|\S+/\S+ down:")


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+)", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def listen_address(config_path: Path) -> tuple[str, int]:
    match = re.search(r'listen = \["([\d.]+):(\d+)"', config_path.read_text())
    assert match is not None, f"no listen address in {config_path}"
    return match.group(1), int(match.group(2))


def socket_drops(address: tuple[str, int]) -> int:
    """Datagrams the kernel dropped on the UDP socket bound to ``address``."""
    host = "".join(f"{b:02X}" for b in reversed(socket.inet_aton(address[0])))
    local = f"{host}:{address[1]:04X}"
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local:
            return int(fields[-1])
    return 0


class VariantSites(LoopbackSites):
    """``LoopbackSites`` whose daemons run through ``bench.flood_daemon`` with options."""

    def __init__(self, options: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = options

    def start(self, timeout_s: float = 20.0) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        for site in self.sites:
            with site.log_path.open("wb") as log:
                argv = [sys.executable, "-m", "bench.flood_daemon", *self.options, "--", "-v"]
                site.process = subprocess.Popen(
                    [*argv, "run", "-c", str(site.config_path)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
        self.wait_all_paths_up(timeout_s)


# ----------------------------------------------------------------- real traffic


def bulk_payload(step: int) -> np.ndarray:
    return np.random.default_rng(step).integers(0, 256, BULK_BYTES, dtype=np.uint8)


@dataclass
class TrafficResult:
    messages: int = 0
    bytes: int = 0
    critical_latency_s: list[float] = field(default_factory=list)
    critical_lost: list[int] = field(default_factory=list)  # steps that never arrived
    errors: list[str] = field(default_factory=list)


class Traffic:
    """Bulk both ways and critical bj -> sh, every message checked, until stopped."""

    def __init__(
        self, lab: LoopbackSites, bulk_every_s: float = BULK_EVERY_S, critical: bool = True
    ) -> None:
        self.lab = lab
        self.critical = critical
        self.bulk_every_s = bulk_every_s  # 0: as fast as the receiver keeps up
        self.result = TrafficResult()
        self._received: dict[str, int] = {"sh": 0, "bj": 0}
        self._sent_so_far: dict[str, int] = {}  # messages whose send() returned, by sender
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sent: dict[str, int] = {}
        self._sent_at: dict[int, float] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for src, dst in (("sh", "bj"), ("bj", "sh")):
            self._threads.append(threading.Thread(target=self._send_bulk, args=(src, dst)))
            self._threads.append(threading.Thread(target=self._recv_bulk, args=(src, dst)))
        if self.critical:
            self._threads.append(threading.Thread(target=self._send_critical))
            self._threads.append(threading.Thread(target=self._recv_critical))
        for thread in self._threads:
            thread.start()

    def stop(self) -> TrafficResult:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        return self.result

    def take_latencies(self) -> list[float]:
        with self._lock:
            taken, self.result.critical_latency_s = self.result.critical_latency_s, []
        return taken

    def _sender(self, key: str, work: Callable[[], None]) -> None:
        """Run a sender; whatever happens, its receiver learns how many it sent."""
        try:
            self._guard(work)
        finally:
            with self._lock:
                self._sent[key] = self._sent_so_far.get(key, 0)

    def _wait_sent(self, key: str, step: int) -> bool:
        """Wait until message ``step`` of ``key`` was handed to the gateway; False if it
        never will be (its sender stopped before it)."""
        while self._sent_so_far.get(key, 0) <= step:
            with self._lock:
                final = self._sent.get(key)
            if final is not None and step >= final:
                return False
            time.sleep(0.002)
        return True

    def _guard(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:
            with self._lock:
                self.result.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.set()

    def _send_bulk(self, src: str, dst: str) -> None:
        def work() -> None:
            with self.lab[src].client() as gw:
                step = 0
                started = time.monotonic()
                while not self._stop.is_set():
                    gw.send(dst, "bulk", bulk_payload(step), step=step)
                    step += 1
                    self._sent_so_far[src] = step
                    ahead_s = started + step * self.bulk_every_s - time.monotonic()
                    if ahead_s > 0:
                        time.sleep(ahead_s)
                    # at most a few messages ahead of the checks: no backlog in any inbox
                    while step - self._received[src] > 8 and not self._stop.is_set():
                        time.sleep(0.001)

        self._sender(src, work)

    def _recv_bulk(self, src: str, dst: str) -> None:
        def work() -> None:
            with self.lab[dst].client() as gw:
                step = 0
                while self._wait_sent(src, step):
                    got = gw.recv("bulk", source=src, step=step, timeout=30)
                    if got.tobytes() != bulk_payload(step).tobytes():
                        raise AssertionError(f"bulk {src}->{dst} step {step} arrived damaged")
                    with self._lock:
                        self.result.messages += 1
                        self.result.bytes += BULK_BYTES
                    step += 1
                    self._received[src] = step

        self._guard(work)

    def _send_critical(self) -> None:
        def work() -> None:
            with self.lab["bj"].client() as gw:
                step = 0
                while not self._stop.is_set():
                    with self._lock:
                        self._sent_at[step] = time.monotonic()
                    gw.send("sh", "crit", np.full(256, step, np.int32), step=step, critical=True)
                    step += 1
                    self._sent_so_far["crit"] = step
                    time.sleep(CRITICAL_EVERY_S)

        self._sender("crit", work)

    def _recv_critical(self) -> None:
        def work() -> None:
            with self.lab["sh"].client() as gw:
                step = 0
                while self._wait_sent("crit", step):
                    try:
                        got = gw.recv("crit", source="bj", step=step, timeout=CRITICAL_LOST_S)
                    except RecvTimeout:
                        with self._lock:
                            self.result.critical_lost.append(step)
                        step += 1
                        continue
                    arrived = time.monotonic()
                    if got.tobytes() != np.full(256, step, np.int32).tobytes():
                        raise AssertionError(f"critical step {step} arrived damaged")
                    with self._lock:
                        self.result.critical_latency_s.append(arrived - self._sent_at[step])
                        self.result.messages += 1
                    step += 1

        self._guard(work)


# ------------------------------------------------------------------------ floods


def _paced(count: int, rate_pps: float) -> Iterator[int]:
    started = time.perf_counter()
    for i in range(count):
        if i % 100 == 0:
            ahead_s = started + i / rate_pps - time.perf_counter()
            if ahead_s > 0:
                time.sleep(ahead_s)
        yield i


def flood_in_subprocess(
    kind: str, target: tuple[str, int], count: int, rate_pps: float
) -> dict[str, int]:
    """:func:`flood` in a process of its own (the bench's threads keep their GIL)."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-m", "bench.flood", "send", kind, f"{target[0]}:{target[1]}"]
    out = subprocess.run(
        [*argv, str(count), str(rate_pps)], env=env, check=True, capture_output=True, text=True
    )
    result: dict[str, int] = json.loads(out.stdout)
    return result


def flood(kind: str, target: tuple[str, int], count: int, rate_pps: float) -> dict[str, int]:
    """Send ``count`` hostile datagrams of ``kind`` to ``target``; returns what came back."""
    if kind == "spoofed":
        return _flood_spoofed(target, count, rate_pps)
    if kind == "validated":
        return _flood_validated(target, count, rate_pps)
    make = {
        "one-source": forged_initial,
        "bad-token": lambda: forged_initial(token=looks_like_token()),
        "garbage": short_header_garbage,
    }[kind]
    packets = [make() for _ in range(count)]  # made first: the flooder's CPU is not ours
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.99.1", 0))
        sock.setblocking(False)
        replies = 0
        for i in _paced(count, rate_pps):
            with contextlib.suppress(BlockingIOError):
                sock.sendto(packets[i], target)
            if i % 64 == 0:
                with contextlib.suppress(BlockingIOError):
                    while sock.recv(2048):
                        replies += 1
        return {"sent": count, "replies": replies}


def _flood_spoofed(target: tuple[str, int], count: int, rate_pps: float) -> dict[str, int]:
    try:
        sender = SpoofingSender()
    except PermissionError:  # not root: many real addresses instead of forged ones
        return _flood_many_bound(target, count, rate_pps)
    packets = []
    for _ in range(count):
        a, b, c = random.randint(64, 127), random.getrandbits(8), random.randint(1, 254)
        packets.append((forged_initial(), (f"127.{a}.{b}.{c}", random.randint(1024, 65535))))
    try:
        for i in _paced(count, rate_pps):
            payload, source = packets[i]
            sender.sendto(payload, source, target)
    finally:
        sender.close()
    return {"sent": count, "sources": count}


def _flood_many_bound(target: tuple[str, int], count: int, rate_pps: float) -> dict[str, int]:
    socks = []
    try:
        for i in range(256):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((f"127.64.{i}.1", 0))
            socks.append(sock)
        for i in _paced(count, rate_pps):
            socks[i % len(socks)].sendto(forged_initial(), target)
    finally:
        for sock in socks:
            sock.close()
    return {"sent": count, "sources": len(socks)}


def _flood_validated(target: tuple[str, int], count: int, rate_pps: float) -> dict[str, int]:
    """Tokens from 20 real addresses first (paced by the server's answer budget), then
    every validated Initial at once."""
    sources = 20
    per_source = max(1, count // sources)
    socks = []
    packets: list[tuple[socket.socket, bytes]] = []
    try:
        for i in range(sources):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((f"127.0.98.{i + 1}", 0))
            socks.append(sock)
            packets += [(sock, p) for p in validated_initials(sock, target, per_source, 0.2)]
        for i in _paced(len(packets), rate_pps):
            sock, packet = packets[i]
            sock.sendto(packet, target)
    finally:
        for sock in socks:
            sock.close()
    return {"sent": len(packets), "sources": sources}


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


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_mib(self.pid))

    def reset(self) -> float:
        now = rss_mib(self.pid)
        self.peak = now
        return now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["send"]:  # python -m bench.flood send KIND HOST:PORT COUNT RATE
        kind, address, count, rate = argv[1:5]
        host, port = address.rsplit(":", 1)
        print(json.dumps(flood(kind, (host, int(port)), int(count), float(rate))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__)
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


if __name__ == "__main__":
    sys.exit(main())
