"""Gateway throughput on loopback: real daemons, real QUIC, no emulation.

    python -m bench transport throughput [--paths 3] [--mtu 9000] [--skip-gib]

Two workloads: 128 MiB of float32 each way at once in 32 MiB messages over three
paths, and one 1 GiB message. Prints Mbit/s of goodput
(array bytes over wall time from the first send to the last byte received) and the CPU
seconds each daemon spent, read from /proc.
"""

from __future__ import annotations

import argparse
import platform
import threading
import time

import numpy as np

from wangate.loopback import LoopbackSites

MiB = 1 << 20


def _transfer(lab: LoopbackSites, plan: dict[tuple[str, str], list[np.ndarray]]) -> float:
    errors: list[BaseException] = []

    def send(src: str, dst: str) -> None:
        try:
            with lab[src].client() as gw:
                for i, arr in enumerate(plan[(src, dst)]):
                    gw.send(dst, "bench", arr, step=i)
        except BaseException as exc:
            errors.append(exc)

    def recv(src: str, dst: str) -> None:
        try:
            with lab[dst].client() as gw:
                for i, arr in enumerate(plan[(src, dst)]):
                    got = gw.recv("bench", source=src, step=i, timeout=600)
                    if got.nbytes != arr.nbytes or got[-1] != arr[-1] or got[0] != arr[0]:
                        raise AssertionError("payload mismatch")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=recv, args=pair) for pair in plan]
    threads += [threading.Thread(target=send, args=pair) for pair in plan]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


def run(paths: int, mtu: int, skip_gib: bool) -> None:
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"{__import__('os').cpu_count()} cores, Python {platform.python_version()}"
    )
    rng = np.random.default_rng(0)
    rows = []
    with LoopbackSites(2, paths, mtu=mtu, verbose=False) as lab:
        workloads = {
            "128 MiB each way, 32 MiB messages": {
                ("bj", "sh"): [rng.standard_normal(8 * MiB, np.float32) for _ in range(4)],
                ("sh", "bj"): [rng.standard_normal(8 * MiB, np.float32) for _ in range(4)],
            },
        }
        if not skip_gib:
            workloads["one 1 GiB message"] = {
                ("bj", "sh"): [np.ones(256 * MiB, np.float32)],
            }
        for name, plan in workloads.items():
            total = sum(a.nbytes for arrays in plan.values() for a in arrays)
            cpu0 = {s.name: lab.cpu_seconds(s) for s in lab.sites}
            elapsed = _transfer(lab, plan)
            cpu = {s.name: lab.cpu_seconds(s) - cpu0[s.name] for s in lab.sites}
            rows.append((name, total, elapsed, cpu))
    print(f"\n{paths} paths, MTU {mtu} (datagrams of {mtu - 28} bytes)\n")
    print("| workload | bytes | seconds | goodput Mbit/s | CPU s bj | CPU s sh |")
    print("|---|---|---|---|---|---|")
    for name, total, elapsed, cpu in rows:
        print(
            f"| {name} | {total / MiB:.0f} MiB | {elapsed:.2f} | "
            f"{total * 8 / elapsed / 1e6:.0f} | {cpu['bj']:.1f} | {cpu['sh']:.1f} |"
        )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench transport throughput")
    parser.add_argument("--paths", type=int, default=3)
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--skip-gib", action="store_true")
    args = parser.parse_args(argv)
    run(args.paths, args.mtu, args.skip_gib)
