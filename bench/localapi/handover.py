"""What a small message's hand-over costs, back to back and after an idle gap, loopback.

    python -m bench localapi handover [--size-kib 64] [--count 60] [--gap-ms 0 50]

Two real daemons (``LoopbackSites``, one path, no bulk), one trainer sending ``--count``
critical messages of ``--size-kib`` KiB to a trainer at the other site that takes each
before the next goes. For each gap between messages (0: back to back), the median and
90th percentile of:

- ``encode``: the client's own work before it writes (``Session.encode``: policy,
  codec, checksum), timed alone on the same array at the same gap;
- ``decode``: the receiving client's own work on the message (``Session.decode``: the
  frame's meta and checksum, the array over the payload), timed alone likewise;
- ``accepted``: ``send`` called to its reply (the daemon read the message, handed it
  to the session, which sent it, and answered);
- ``delivered``: ``send`` called to the receiving trainer holding the array;
- ``async ping``: an ``AsyncClient``'s ``ping`` round trip (plain asyncio), the local
  API's own cost to a coroutine.

Nothing but the gap changes between the rows: the gap's effect is that of running the
same code cold (after the core slept, its caches went to other work).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

import wangate
from wangate.loopback import LoopbackSites


def _quantiles(samples_us: list[float]) -> tuple[float, float]:
    ordered = sorted(samples_us)
    return statistics.median(ordered), ordered[max(0, int(0.9 * len(ordered)) - 1)]


def _timed(call: Callable[[], object], count: int, gap_s: float) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1e6)
        time.sleep(gap_s)
    return samples


async def _async_pings(path: str, count: int, gap_s: float) -> list[float]:
    samples = []
    async with wangate.AsyncClient(path) as gateway:
        for _ in range(count):
            started = time.perf_counter()
            await gateway.ping()
            samples.append((time.perf_counter() - started) * 1e6)
            await asyncio.sleep(gap_s)
    return samples


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench localapi handover")
    parser.add_argument("--size-kib", type=int, default=64)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--gap-ms", type=float, nargs="+", default=[0.0, 50.0])
    args = parser.parse_args(argv)
    array = np.frombuffer(os.urandom(args.size_kib * 1024), np.uint8)
    rows = []
    lab = LoopbackSites(2, 1, verbose=False)
    with lab, lab["bj"].client() as tx, lab["sh"].client() as rx:
        step = 0
        meta, payload, checksum = tx._session.encode("sh", "handover", array, None)
        received = memoryview(bytearray(payload))  # as a reply's payload: writable
        for gap_ms in args.gap_ms:
            gap_s = gap_ms / 1e3
            encode = _timed(
                lambda: tx._session.encode("sh", "handover", array, None), args.count, gap_s
            )
            decode = _timed(lambda: rx._session.decode(meta, checksum, received), args.count, gap_s)
            accepted, delivered = [], []
            for _ in range(args.count):
                started = time.perf_counter()
                tx.send("sh", "handover", array, step=step, critical=True)
                accepted.append((time.perf_counter() - started) * 1e6)
                got = rx.recv("handover", source="bj", step=step, timeout=10)
                delivered.append((time.perf_counter() - started) * 1e6)
                if got.nbytes != array.nbytes or got[-1] != array[-1]:
                    raise AssertionError(f"message {step} arrived damaged")
                step += 1
                time.sleep(gap_s)
            pings = asyncio.run(_async_pings(str(lab["bj"].socket_path), args.count, gap_s))
            rows.append((gap_ms, encode, decode, accepted, delivered, pings))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}")
    print(f"{args.size_kib} KiB critical messages, {args.count} per gap, microseconds\n")
    print(
        "| gap between messages | encode p50 / p90 | decode p50 / p90 | accepted p50 / p90 "
        "| delivered p50 / p90 | async ping p50 / p90 |"
    )
    print("|---|---|---|---|---|---|")
    for gap_ms, *columns in rows:
        cells = " | ".join("{:.0f} / {:.0f}".format(*_quantiles(c)) for c in columns)
        print(f"| {gap_ms:g} ms | {cells} |")
    return 0
