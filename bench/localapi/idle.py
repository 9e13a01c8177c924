"""Memory of idle local API connections: daemon RSS with N idle trainers vs none.

    python -m bench localapi idle [--connections 1000] [--tree REV ...]

For each tree (this one first, then each ``--tree``, e.g. an older commit) and each
workload, one real daemon
(`python -m wangate run`, a site with no peers) is started; a warm-up client does the
workload three times, then RSS is read from /proc, ``--connections`` clients connect
and each does the workload and then idles, RSS is read again once it stops changing,
and the connections are closed. Workloads: ``hello`` (connect, hello, idle) and
``worked`` (hello, then one 256 KiB send to the site itself and its recv: a trainer
that moved data and now waits). Prints bytes per idle connection (RSS difference over
the count; VmData likewise, for memory reserved but not touched) and the ratio to the
first tree.

Then the price of keeping no buffer while idle: with a daemon of each tree running
side by side, one client sends messages of 1 KiB to the site itself and receives
them, six rounds taking turns (in alternating order) of 4000 messages each; prints
the daemon's CPU time per message (send and recv; /proc, so the load of other
processes matters less than for wall time) and the best round's wall time.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import tree as trees
from bench.tree import Tree
from wangate.certs import create_ca, issue_site_certificate
from wangate.client import Client
from wangate.loopback import process_cpu_s


def status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def rss_bytes(pid: int) -> int:
    return status_bytes(pid, "VmRSS")


def settled_rss(pid: int, timeout_s: float = 10.0) -> int:
    """RSS once two readings 0.2 s apart agree (the daemon has handled every hello)."""
    deadline = time.monotonic() + timeout_s
    last = rss_bytes(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = rss_bytes(pid)
        if now == last:
            return now
        last = now
    return last


def write_config(directory: Path) -> Path:
    certs = directory / "certs"
    create_ca(certs)
    issue_site_certificate(certs, "bj")
    config = directory / "bj.toml"
    config.write_text(
        "\n".join(
            [
                "[site]",
                'name = "bj"',
                'socket = "bj.sock"',
                "[tls]",
                'ca = "certs/ca.pem"',
                'cert = "certs/bj.pem"',
                'key = "certs/bj.key"',
                "",
            ]
        )
    )
    return config


WORK_BYTES = 256 * 1024


def connect(path: Path, index: int, worked: bool) -> Client:
    gw = Client(path, timeout=10)
    if worked:
        array = np.full(WORK_BYTES, index % 251, dtype=np.uint8)
        gw.send("bj", f"idle{index}", array)
        got = gw.recv(f"idle{index}", source="bj", timeout=10)
        if got.tobytes() != array.tobytes():
            raise RuntimeError("payload mismatch")
    return gw


def start_daemon(source: Tree, directory: Path) -> tuple[subprocess.Popen[bytes], Path]:
    directory.mkdir(exist_ok=True)
    config = write_config(directory)
    socket_path = directory / "bj.sock"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "wangate", "run", "-c", os.fspath(config)],
        env=source.environ(),
        cwd=directory,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not socket_path.exists():
        if time.monotonic() > deadline or daemon.poll() is not None:
            daemon.kill()
            raise RuntimeError(f"the daemon of {source.label} did not start")
        time.sleep(0.1)
    return daemon, socket_path


def small_message_cost(
    sources: list[Tree], messages: int = 4000, rounds: int = 6
) -> list[tuple[float, float]]:
    """(daemon CPU µs, best round's wall µs) per small message (send + recv), per tree."""
    with tempfile.TemporaryDirectory(prefix="wangate-rate-") as tmp:
        daemons = [start_daemon(src, Path(tmp) / str(i)) for i, src in enumerate(sources)]
        try:
            clients = [Client(path, timeout=10) for _, path in daemons]
            best = [float("inf")] * len(sources)
            cpu = [0.0] * len(sources)
            small = np.zeros(1024, dtype=np.uint8)
            for round_index in range(rounds):
                order = list(enumerate(clients))
                for index, gw in order if round_index % 2 == 0 else order[::-1]:
                    pid = daemons[index][0].pid
                    cpu_before = process_cpu_s(pid)
                    started = time.perf_counter()
                    for step in range(messages):
                        gw.send("bj", "small", small, step=step)
                    for step in range(messages):
                        gw.recv("small", source="bj", step=step, timeout=10)
                    elapsed_us = (time.perf_counter() - started) * 1e6 / messages
                    best[index] = min(best[index], elapsed_us)
                    cpu[index] += process_cpu_s(pid) - cpu_before
            for gw in clients:
                gw.close()
            return [(c * 1e6 / (messages * rounds), b) for c, b in zip(cpu, best, strict=True)]
        finally:
            for daemon, _ in daemons:
                daemon.terminate()
                daemon.wait(10)


def measure(source: Tree, connections: int, worked: bool) -> tuple[int, int, int, int]:
    """RSS with none, RSS with ``connections`` idle, after they closed; VmData growth."""
    with tempfile.TemporaryDirectory(prefix="wangate-idle-") as tmp:
        daemon, socket_path = start_daemon(source, Path(tmp))
        try:
            for index in range(3):
                connect(socket_path, -1 - index, worked).close()
            before = settled_rss(daemon.pid)
            data_before = status_bytes(daemon.pid, "VmData")
            clients = [connect(socket_path, index, worked) for index in range(connections)]
            idle = settled_rss(daemon.pid)
            data_growth = status_bytes(daemon.pid, "VmData") - data_before
            for gw in clients:
                gw.close()
            after = settled_rss(daemon.pid)
            return before, idle, after, data_growth
        finally:
            daemon.terminate()
            daemon.wait(10)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench localapi idle", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--connections", type=int, default=1000)
    trees.add_argument(parser)
    args = parser.parse_args(argv)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {args.connections} idle connections"
    )
    sources = trees.trees(args)
    print(
        "| workload | gateway | RSS none | RSS idle | RSS after close "
        "| RSS per connection | ratio | VmData per connection |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for worked in (False, True):
        first: float | None = None
        for source in sources:
            before, idle, after, data_growth = measure(source, args.connections, worked)
            per = (idle - before) / args.connections
            first = per if first is None else first
            name = source.label
            print(
                f"| {'worked' if worked else 'hello'} | {name} | {before / 2**20:.1f} MiB "
                f"| {idle / 2**20:.1f} MiB | {after / 2**20:.1f} MiB | {per / 1024:.1f} KiB "
                f"| {per / first:.2f} | {data_growth / args.connections / 1024:.1f} KiB |",
                flush=True,
            )
    print()
    print("| gateway | daemon CPU per 1 KiB send + recv | ratio | wall, best round |")
    print("|---|---|---|---|")
    costs = small_message_cost(sources)
    for source, (cpu_us, wall_us) in zip(sources, costs, strict=True):
        name = source.label
        print(f"| {name} | {cpu_us:.0f} µs | {cpu_us / costs[0][0]:.2f} | {wall_us:.0f} µs |")
