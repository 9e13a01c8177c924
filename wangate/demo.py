"""``wangate demo``: several sites on loopback, real daemons, real QUIC, real gradients.

Every site sends every other site one bulk gradient and a stream of small critical
ones, all at once; every receiver checks each array bit for bit against what the
sender generated, then the paths table of each site and a summary are printed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from wangate.loopback import LoopbackSites, SiteProcess
from wangate.rows import PathRow
from wangate.views import format_paths_table

SMALL_MESSAGES = 50


def gradient(source: str, dest: str, tag: str, size_bytes: int) -> np.ndarray:
    """Deterministic, heavy-tailed float32 'gradient' both ends can regenerate."""
    seed = abs(hash((source, dest, tag))) % (1 << 32)
    rng = np.random.default_rng(seed)
    return rng.standard_t(3, size=max(1, size_bytes // 4)).astype(np.float32)


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    messages: int = 0
    bytes: int = 0
    mismatches: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, ok: bool, nbytes: int, what: str) -> None:
        with self.lock:
            self.messages += 1
            self.bytes += nbytes
            if not ok:
                self.mismatches.append(what)


def _sender(site: SiteProcess, peers: list[str], bulk_bytes: int, tally: Tally) -> None:
    try:
        with site.client() as gw:
            for step in range(SMALL_MESSAGES):
                for peer in peers:
                    arr = gradient(site.name, peer, f"layer0.bias/{step}", 1024 * (1 + step % 16))
                    gw.send(peer, "layer0.bias", arr, step=step, critical=True)
            for peer in peers:
                gw.send(peer, "bucket.bulk", gradient(site.name, peer, "bulk", bulk_bytes), step=0)
    except Exception as exc:  # reported in the summary
        tally.errors.append(f"{site.name} send: {exc}")


def _receiver(site: SiteProcess, peers: list[str], bulk_bytes: int, tally: Tally) -> None:
    try:
        with site.client() as gw:
            for peer in peers:
                for step in range(SMALL_MESSAGES):
                    got = gw.recv("layer0.bias", source=peer, step=step, timeout=60)
                    want = gradient(peer, site.name, f"layer0.bias/{step}", 1024 * (1 + step % 16))
                    tally.add(
                        got.tobytes() == want.tobytes(),
                        got.nbytes,
                        f"{peer}->{site.name} step {step}",
                    )
            for peer in peers:
                got = gw.recv("bucket.bulk", source=peer, step=0, timeout=120)
                want = gradient(peer, site.name, "bulk", bulk_bytes)
                tally.add(got.tobytes() == want.tobytes(), got.nbytes, f"{peer}->{site.name} bulk")
    except Exception as exc:
        tally.errors.append(f"{site.name} recv: {exc}")


DEMO_WORKERS = 2  # [workers] count: worker 0 carries critical messages, worker 1 bulk


def run_demo(sites: int = 3, paths: int = 3, size_mib: int = 32) -> int:
    print(
        f"wangate demo: {sites} sites on loopback, {paths} QUIC paths between each pair, "
        f"{DEMO_WORKERS} worker processes per gateway"
    )
    with LoopbackSites(sites, paths, verbose=False, workers=DEMO_WORKERS) as lab:
        names = [s.name for s in lab.sites]
        print(f"  daemons up: {', '.join(names)} (configs and logs in {lab.directory})")
        bulk_bytes = size_mib << 20
        tally = Tally()
        threads = []
        for site in lab.sites:
            peers = [n for n in names if n != site.name]
            args = (site, peers, bulk_bytes, tally)
            threads.append(threading.Thread(target=_receiver, args=args))
            threads.append(threading.Thread(target=_sender, args=args))
        cpu_before = {s.name: lab.cpu_seconds(s) for s in lab.sites}
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        cpu = {s.name: lab.cpu_seconds(s) - cpu_before[s.name] for s in lab.sites}
        for site in lab.sites:
            with site.client() as gw:
                print(f"\nsite {site.name}: wangate paths")
                print(format_paths_table(PathRow.from_dicts(gw.paths())))
        expected = len(names) * (len(names) - 1) * (SMALL_MESSAGES + 1)
        print(
            f"\n{tally.messages} of {expected} messages crossed, {tally.bytes / 2**20:.1f} MiB "
            f"in {elapsed:.2f} s ({tally.bytes * 8 / elapsed / 1e6:.0f} Mbit/s aggregate), "
            f"{len(tally.mismatches)} mismatches"
        )
        print("daemon CPU: " + ", ".join(f"{n} {c:.1f} s" for n, c in cpu.items()))
        for error in tally.errors + tally.mismatches:
            print(f"  problem: {error}")
        ok = tally.messages == expected and not tally.mismatches and not tally.errors
        print("demo OK: every array arrived bit for bit" if ok else "demo FAILED")
        return 0 if ok else 1
