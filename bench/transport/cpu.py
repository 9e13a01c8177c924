"""CPU cost of the gateway against a plain aioquic transfer, on loopback, no emulation.

    python -m bench transport cpu [--mib 256] [--datagram 1452 --datagram 8952] [--tree REV]
                                  [--rounds 3] [--no-aioquic] [--to-listener]

For each datagram size, side by side in one run and the same bytes:

- wangate: two real daemons (``LoopbackSites``, one path, MTU = datagram + 28), one
  trainer sending ``--mib`` MiB in 16 MiB uint8 messages, one receiving them, both
  after moving the same bytes once uncounted (long-lived trainers, as in training: the
  sender's segment pool is warm, see ``transfer``); from bj, which listens, to sh,
  which dials, or with ``--to-listener`` the other way (a listener's socket is shared
  by every path it accepted; a dialer's is its path's own);
- aioquic: one plain aioquic stream between two processes (``bench.runner.transfer``
  quic mode: the same datagram size, uvloop like the gateway, default congestion
  control and socket buffers), carrying the same messages; its sender keeps at most
  4 MiB unacknowledged in the stream (see SENDER_BUFFER_BYTES).

Two things each make a naive aioquic transfer of 64 MiB take ~32 s instead of ~4.4 s
here, and are avoided so that the comparison is about per-byte cost: queueing every
message at once (aioquic trims acknowledged bytes off the front of one bytearray, so
each ACK costs the queue's length) and 8 MiB socket buffers (no drops on loopback, so
Reno's window grows without bound and every ACK walks more packets in flight).

Reported: wall time and goodput; the CPU seconds of every process (gateway daemons
from /proc, trainer threads from ``time.thread_time()``, aioquic processes from
their own rusage); and goodput per CPU-second, i.e. per fully used core, with the
ratio wangate/aioquic. The machine may be shared: the CPU columns are the stable ones.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bench import tree as trees
from bench.common import ROOT
from bench.tree import THIS, Tree

if TYPE_CHECKING:
    from wangate.loopback import LoopbackSites

MiB = 1 << 20
MESSAGE_BYTES = 16 * MiB
SENDER_BUFFER_BYTES = 4 * MiB  # unacknowledged bytes the aioquic sender may queue
IPV4_UDP_OVERHEAD = 28


@dataclass(frozen=True)
class CpuResult:
    transport: str
    datagram_bytes: int
    total_bytes: int
    seconds: float
    sender_cpu_s: float  # sending gateway daemon (or aioquic sender process)
    receiver_cpu_s: float  # receiving gateway daemon (or aioquic receiver process)
    trainer_cpu_s: float  # wangate only: the two trainer threads (encode, socket copies)

    @property
    def goodput_mbps(self) -> float:
        return self.total_bytes * 8 / self.seconds / 1e6

    @property
    def cpu_s(self) -> float:
        return self.sender_cpu_s + self.receiver_cpu_s + self.trainer_cpu_s

    @property
    def mbit_per_cpu_s(self) -> float:
        return self.total_bytes * 8 / self.cpu_s / 1e6


def run_wangate(
    datagram_bytes: int, total_bytes: int, tree: Tree = THIS, *, to_listener: bool = False
) -> CpuResult:
    from wangate.loopback import LoopbackSites

    count = max(1, total_bytes // MESSAGE_BYTES)
    message = np.frombuffer(os.urandom(MESSAGE_BYTES), dtype=np.uint8)
    lab = LoopbackSites(2, 1, mtu=datagram_bytes + IPV4_UDP_OVERHEAD, verbose=False)
    source, destination = ("sh", "bj") if to_listener else ("bj", "sh")
    cpu0: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        with tree.active():
            stack.enter_context(lab)

        def counting() -> None:
            cpu0.update({s.name: lab.cpu_seconds(s) for s in lab.sites})

        seconds, thread_cpu = transfer(
            lab, message, count, source, destination, warm_up=True, at_start=counting
        )
        cpu = {s.name: lab.cpu_seconds(s) - cpu0[s.name] for s in lab.sites}
    return CpuResult(
        "wangate" if tree.is_this else f"wangate@{tree.label}",
        datagram_bytes,
        count * MESSAGE_BYTES,
        seconds,
        cpu[source],
        cpu[destination],
        thread_cpu["send"] + thread_cpu["recv"],
    )


def transfer(
    lab: LoopbackSites,
    message: np.ndarray,
    count: int,
    source: str = "bj",
    destination: str = "sh",
    *,
    warm_up: bool = False,
    at_start: Callable[[], None] | None = None,
) -> tuple[float, dict[str, float]]:
    """``count`` copies of ``message`` from ``source`` to ``destination`` through the
    local API, a trainer thread each side: seconds until the last one arrived (checked),
    and each trainer thread's CPU seconds (``send``, ``recv``).

    With ``warm_up``, the same two clients first move ``count`` copies that are not
    counted, as a trainer's earlier steps would have: the sender's segment pool then
    holds the segments it reuses (filling fresh ones costs a page fault per page,
    several times the copy; RESULTS.md, "Shared-memory payloads"). ``at_start`` is
    called once those arrived, just before the counted copies go."""
    thread_cpu: dict[str, float] = {}
    errors: list[BaseException] = []
    finished: list[float] = []
    first = count if warm_up else 0  # the step of the first counted copy
    ready = threading.Barrier(3, timeout=600)

    def send() -> None:
        try:
            with lab[source].client() as gw:
                for step in range(first):
                    gw.send(destination, "cpu", message, step=step)
                ready.wait()
                cpu0 = time.thread_time()
                for step in range(first, first + count):
                    gw.send(destination, "cpu", message, step=step)
                thread_cpu["send"] = time.thread_time() - cpu0
        except BaseException as exc:
            errors.append(exc)
            ready.abort()

    def recv() -> None:
        try:
            with lab[destination].client() as gw:
                for step in range(first):
                    gw.recv("cpu", source=source, step=step, timeout=600)
                ready.wait()
                cpu0 = time.thread_time()
                for step in range(first, first + count):
                    got = gw.recv("cpu", source=source, step=step, timeout=600)
                    if got.nbytes != message.nbytes or got[-1] != message[-1]:
                        raise AssertionError(f"message {step} arrived damaged")
                finished.append(time.perf_counter())
                thread_cpu["recv"] = time.thread_time() - cpu0
        except BaseException as exc:
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=recv), threading.Thread(target=send)]
    for thread in threads:
        thread.start()
    started = 0.0
    try:
        ready.wait()
        if at_start is not None:
            at_start()
        started = time.perf_counter()
    except threading.BrokenBarrierError:
        pass  # a trainer failed: its error is raised below
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return finished[0] - started, thread_cpu


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_aioquic(datagram_bytes: int, total_bytes: int) -> CpuResult:
    count = max(1, total_bytes // MESSAGE_BYTES)
    port = _free_port()
    options = ["--max-datagram-size", str(datagram_bytes), "--uvloop"]
    transfer = [sys.executable, "-m", "bench.runner.transfer"]
    cwd = str(ROOT)  # `python -m bench...` of this tree
    receiver = subprocess.Popen(
        [
            *transfer,
            "recv",
            "--proto",
            "quic",
            "--bind",
            f"127.0.0.1:{port}",
            "--messages",
            str(count),
            *options,
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    try:
        assert receiver.stdout is not None
        receiver.stdout.readline()  # ready
        schedule = json.dumps([[0.0, MESSAGE_BYTES]] * count)
        sender = subprocess.run(
            [
                *transfer,
                "send",
                "--proto",
                "quic",
                "--bind",
                "127.0.0.1",
                "--to",
                f"127.0.0.1:{port}",
                "--schedule",
                schedule,
                *options,
                "--max-buffered-bytes",
                str(SENDER_BUFFER_BYTES),
            ],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=900,
            check=True,
        )
        sent = json.loads(sender.stdout)
        got = json.loads(receiver.communicate(timeout=60)[0])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    if len(got["completed"]) != count:
        raise RuntimeError(f"aioquic delivered {len(got['completed'])} of {count} messages")
    # CPU of the transfer itself: start-up (imports, the server's key) left out, as
    # the daemons' start-up is
    return CpuResult(
        "aioquic",
        datagram_bytes,
        count * MESSAGE_BYTES,
        got["completed"][-1] - sent["started"],
        sent["cpu_s"] - sent["cpu_at_start_s"],
        got["cpu_s"] - got["cpu_at_ready_s"],
        0.0,
    )


def markdown(results: list[CpuResult]) -> str:
    lines = [
        "| transport | datagram | MiB | seconds | goodput Mbit/s | CPU s sender | "
        "CPU s receiver | CPU s trainers | Mbit per CPU-second | wangate/aioquic |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(r.transport, r.datagram_bytes): r for r in results}
    for r in results:
        ratio = ""
        other = by_key.get(("aioquic", r.datagram_bytes))
        if r.transport.startswith("wangate") and other is not None:
            ratio = f"{r.mbit_per_cpu_s / other.mbit_per_cpu_s:.2f}"
        trainers = "-" if r.transport == "aioquic" else f"{r.trainer_cpu_s:.1f}"
        lines.append(
            f"| {r.transport} | {r.datagram_bytes} | {r.total_bytes // MiB} | "
            f"{r.seconds:.2f} | {r.goodput_mbps:.0f} | {r.sender_cpu_s:.1f} | "
            f"{r.receiver_cpu_s:.1f} | {trainers} | {r.mbit_per_cpu_s:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def medians(results: list[CpuResult]) -> str:
    """Per transport and datagram size, the median Mbit per CPU-second and goodput over
    its rounds, and this tree's median against it."""
    rows: dict[tuple[str, int], list[CpuResult]] = {}
    for r in results:
        rows.setdefault((r.transport, r.datagram_bytes), []).append(r)
    lines = [
        "| transport | datagram | rounds | median Mbit per CPU-second | median goodput Mbit/s "
        "| this tree / it |",
        "|---|---|---|---|---|---|",
    ]
    this: dict[int, float] = {}  # this tree's median, per datagram size
    for (transport, datagram), runs in rows.items():
        per_cpu = statistics.median(r.mbit_per_cpu_s for r in runs)
        goodput = statistics.median(r.goodput_mbps for r in runs)
        if transport == "wangate":
            this[datagram] = per_cpu
        ratio = f"{this[datagram] / per_cpu:.2f}" if datagram in this else ""
        lines.append(
            f"| {transport} | {datagram} | {len(runs)} | {per_cpu:.0f} | {goodput:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench transport cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mib", type=int, default=256, help="bytes per transfer, MiB")
    parser.add_argument(
        "--datagram",
        type=int,
        action="append",
        help="UDP payload bytes (repeatable; default 1452 and 8952)",
    )
    trees.add_argument(parser)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="transfers per tree and datagram size, the trees alternating; "
        "a row per transfer, then each one's median",
    )
    parser.add_argument(
        "--no-aioquic", action="store_true", help="leave the plain aioquic transfer out"
    )
    parser.add_argument(
        "--to-listener",
        action="store_true",
        help="wangate's messages go to the site that listens (default: to the one that dials)",
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args(argv)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Linux {platform.release()}, Python {platform.python_version()}",
        flush=True,
    )
    results = []
    baseline = () if args.no_aioquic else (None,)
    for datagram in args.datagram or [1452, 8952]:
        for _ in range(args.rounds):
            for tree in (*baseline, *trees.trees(args)):
                if tree is None:
                    result = run_aioquic(datagram, args.mib * MiB)
                else:
                    result = run_wangate(
                        datagram, args.mib * MiB, tree, to_listener=args.to_listener
                    )
                print(
                    f"  {result.transport} {datagram}: {result.seconds:.1f} s, "
                    f"{result.goodput_mbps:.0f} Mbit/s, {result.cpu_s:.1f} CPU s",
                    flush=True,
                )
                results.append(result)
    print()
    print(markdown(results))
    if args.rounds > 1:
        print()
        print(medians(results))
    if args.json:
        print(
            json.dumps(
                [
                    {
                        **r.__dict__,
                        "goodput_mbps": r.goodput_mbps,
                        "cpu_s": r.cpu_s,
                        "mbit_per_cpu_s": r.mbit_per_cpu_s,
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    return 0
