"""The kernel-UDP floor: plain kernel UDP on loopback, Mbit per CPU-second, both sides.

    python -m bench transport floor [--duration 3] [--sizes 1452,8952] [--gso-sizes 1452]

What the gateway's per-datagram CPU aims are stated against: the same bytes over plain
kernel UDP on this machine, no QUIC, no crypto, no Python. ``udp_floor.c`` (built with
gcc into ``results/build/udp_floor`` when the source is newer) forks a receiver and a
sender on 127.0.0.1: the sender sends datagrams of one size flat out, ``sendmmsg`` of
64 on a connected socket; the receiver reads them with ``recvmmsg`` of 64 into a
64 MiB receive buffer. Modes: ``plain``, and ``gso+gro`` (the sender hands the kernel
super-buffers of up to 64 KiB cut into datagrams of the size, UDP_SEGMENT; the
receiver takes them coalesced, UDP_GRO).

Reported per run: datagrams sent and received, drops (sent minus received), received
Mbit/s (over the receiver's first to last datagram), the CPU seconds of each process
(getrusage, its loop only) and received bits over both CPU times: Mbit per
CPU-second, the unit of ``transport cpu``. On loopback the sender's system time also
carries most of the receive path (the kernel delivers to the receiver's socket inside
the sender's send); softirq work deferred to ksoftirqd is in neither. Written to
``results/floor/floor.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS

SOURCE = Path(__file__).resolve().with_name("udp_floor.c")
BINARY = RESULTS / "build" / "udp_floor"
OUTPUT = RESULTS / "floor" / "floor.json"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]
REPORT_KEYS = (
    "role",
    "size",
    "batch",
    "gso",
    "gro",
    "datagrams",
    "bytes",
    "calls",
    "wall_s",
    "user_s",
    "sys_s",
    "cpu_s",
)


class FloorError(RuntimeError):
    """The probe could not be built or did not run."""


def build(binary: Path = BINARY, source: Path = SOURCE) -> Path:
    """``binary`` compiled from ``source`` unless it is already newer than the source."""
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return binary
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FloorError(f"gcc not found on PATH: it is needed to build {source.name}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    # into a temporary name, then renamed: a concurrent build never runs a half-written one
    fd, tmp = tempfile.mkstemp(prefix=".udp_floor.", dir=binary.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [gcc, *CFLAGS, "-o", tmp, str(source)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise FloorError(f"gcc failed to build {source}:\n{done.stderr.strip()}")
        os.replace(tmp, binary)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return binary


def run_probe(
    binary: Path,
    size: int,
    *,
    duration: float | None = None,
    count: int | None = None,
    batch: int = 64,
    gso: bool = False,
) -> dict[str, dict[str, Any]]:
    """One ``udp_floor both`` run: its two reports by role (``send``, ``recv``)."""
    args = [str(binary), "both", "--size", str(size), "--batch", str(batch)]
    if duration is not None:
        args += ["--duration", str(duration)]
    if count is not None:
        args += ["--count", str(count)]
    if gso:
        args += ["--gso", "--gro"]
    timeout = (duration or 0) + 60
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise FloorError(f"{' '.join(args)}: no result after {timeout:.0f} s") from exc
    if done.returncode != 0:
        raise FloorError(
            f"{' '.join(args)} exited with status {done.returncode}: {done.stderr.strip()}"
        )
    reports: dict[str, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        report = json.loads(line)
        reports[report["role"]] = report
    if set(reports) != {"send", "recv"}:
        raise FloorError(
            f"{' '.join(args)}: expected a send and a recv report, got {done.stdout!r}"
        )
    return reports


@dataclass(frozen=True)
class FloorResult:
    size: int
    mode: str  # "plain" or "gso+gro"
    sender: dict[str, Any]
    receiver: dict[str, Any]

    @property
    def drops(self) -> int:
        return int(self.sender["datagrams"]) - int(self.receiver["datagrams"])

    @property
    def received_mbps(self) -> float:
        wall = float(self.receiver["wall_s"])
        return self.receiver["bytes"] * 8 / wall / 1e6 if wall > 0 else 0.0

    @property
    def cpu_s(self) -> float:
        return float(self.sender["cpu_s"]) + float(self.receiver["cpu_s"])

    @property
    def mbit_per_cpu_s(self) -> float:
        return self.receiver["bytes"] * 8 / self.cpu_s / 1e6 if self.cpu_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "mode": self.mode,
            "sender": self.sender,
            "receiver": self.receiver,
            "drops": self.drops,
            "received_mbps": self.received_mbps,
            "cpu_s": self.cpu_s,
            "mbit_per_cpu_s": self.mbit_per_cpu_s,
        }


def measure(binary: Path, size: int, gso: bool, duration: float, batch: int) -> FloorResult:
    reports = run_probe(binary, size, duration=duration, batch=batch, gso=gso)
    return FloorResult(size, "gso+gro" if gso else "plain", reports["send"], reports["recv"])


def markdown(results: list[FloorResult]) -> str:
    lines = [
        "| datagram | mode | seconds | sent | received | drops | received Mbit/s | "
        "CPU s sender | CPU s receiver | Mbit per CPU-second |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        sent, got = r.sender["datagrams"], r.receiver["datagrams"]
        drops = f"{r.drops} ({r.drops / sent:.2%})" if sent else "0"
        lines.append(
            f"| {r.size} | {r.mode} | {r.receiver['wall_s']:.2f} | {sent} | {got} | {drops} | "
            f"{r.received_mbps:.0f} | {r.sender['cpu_s']:.2f} | {r.receiver['cpu_s']:.2f} | "
            f"{r.mbit_per_cpu_s:.0f} |"
        )
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected sizes like 1452,8952, got {text!r}") from exc
    if any(not 1 <= size <= 65507 for size in sizes):
        raise argparse.ArgumentTypeError("a datagram size is 1..65507 bytes")
    return sizes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench transport floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run (3)")
    parser.add_argument(
        "--sizes", type=_sizes, default=[1452, 8952], help="datagram sizes, plain (1452,8952)"
    )
    parser.add_argument(
        "--gso-sizes",
        type=_sizes,
        default=[1452],
        help="datagram sizes run again with GSO+GRO (1452; '' for none)",
    )
    parser.add_argument("--batch", type=int, default=64, help="messages per syscall (64)")
    args = parser.parse_args(argv)
    if args.duration <= 0:
        parser.error("--duration must be positive")
    try:
        binary = build()
        machine = (
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Linux {platform.release()}"
        )
        print(f"machine: {machine}", flush=True)
        results = []
        for size, gso in [(s, False) for s in args.sizes] + [(s, True) for s in args.gso_sizes]:
            result = measure(binary, size, gso, args.duration, args.batch)
            print(
                f"  {size} {result.mode}: {result.received_mbps:.0f} Mbit/s, "
                f"{result.cpu_s:.2f} CPU s, {result.drops} drops",
                flush=True,
            )
            results.append(result)
    except FloorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print()
    print(markdown(results))
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(
        json.dumps(
            {
                "machine": machine,
                "duration_s": args.duration,
                "batch": args.batch,
                "results": [r.as_dict() for r in results],
            },
            indent=1,
        )
        + "\n"
    )
    print(f"\nwritten to {OUTPUT.relative_to(RESULTS.parent)}")
    return 0
