"""Shared-memory payloads on the local API, against store-and-forward, in one run.

    python -m bench localapi shm [--runs 3] [--gib 1] [--tree REV]

1. A 1 GiB message bj -> sh through two real daemons on loopback (3 paths, MTU 9000,
   as ``transport throughput``), the trainers in processes of their own. Modes alternate
   run by run: "segments" (this tree) and "in-band" (store-and-forward: this tree's
   daemons with the trainers' payloads through the socket and whole-message buffers, or
   with ``--tree`` another tree's daemons, e.g. the main branch's). Reported:
   ``send`` hand-over time; first bytes at the receiving gateway (its paths' byte
   counters 1 MiB above where they were, polled every 5 ms); last byte (``recv``
   returned in the receiving trainer); goodput; peak RssAnon (private, anonymous) of
   both trainers and of both daemons above their idle figure.
2. Hand-over time against size, in-band and by segment, to find the threshold.
3. CRC-32 implementations on 256 MiB, and the client's checksum work per send
   before (two zlib passes) and now (one ISA-L pass).
4. ``--stream``: 1 GiB bj -> sh, the receiving trainer reading it while it arrives
   (``recv(stream=True)``: first MiB in its hands, then ``result()``) against
   ``--tree``'s daemons (e.g. main: segments, plain ``recv``), alternating.
5. ``--handover-parts``: what ``send`` of 1 GiB spends before the gateway has it (the
   encode with its one CRC pass, the copy into the segment, the rest), and a reused
   segment against a fresh one sealed against writing (F_SEAL_WRITE) per send.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from bench import tree as trees
from bench.tree import THIS, Tree
from wangate.checksum import crc32
from wangate.client import Client
from wangate.loopback import LoopbackSites

MiB = 1 << 20
SAMPLE_S = 0.005
FIRST_BYTE_BYTES = MiB

SENDER = """
import json, sys, time, numpy as np, wangate
gw = wangate.Client(sys.argv[1])
if sys.argv[3] == "in-band":
    gw._session.segment_min_bytes = None
array = np.ones(int(sys.argv[2]) // 4, np.float32)
if sys.argv[4] == "warm" and sys.argv[3] != "in-band":  # a later step: the pool has one
    pool = gw._session.pool
    token, fd, mapping = pool.lend(array.nbytes)
    np.frombuffer(mapping, np.uint8)[:] = 0
    pool.released([token])
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
gw.send("sh", "gib", array, step=0)
t1 = time.monotonic()
print(json.dumps({"t0": t0, "t1": t1}), flush=True)
sys.stdin.readline()
"""

RECEIVER = """
import json, sys, time, numpy as np, wangate
gw = wangate.Client(sys.argv[1])
if sys.argv[3] == "in-band":
    gw._session.segment_min_bytes = None
print("ready", flush=True)
first = first_mib = None
if sys.argv[3] == "stream":
    incoming = gw.recv("gib", source="bj", step=0, timeout=900, stream=True)
    first = time.monotonic()  # the first bytes are the trainer's to read
    assert incoming.ready_bytes > 0
    incoming.wait(1 << 20, timeout=900)  # the first MiB (at the first progress step)
    first_mib = time.monotonic()
    array = incoming.result(timeout=900)
else:
    array = gw.recv("gib", source="bj", step=0, timeout=900)
done = time.monotonic()
ok = array.nbytes == int(sys.argv[2]) and array[0] == 1 and array[-1] == 1
times = {"done": done, "first": first or done, "first_mib": first_mib or done}
print(json.dumps({**times, "ok": bool(ok)}), flush=True)
sys.stdin.readline()
"""


def status_kib(pid: int) -> dict[str, int]:
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssShmem", "RssFile"):
                fields[key] = int(value.split()[0])
    return fields


def received_bytes(gw: Client) -> int:
    return sum(int(row["recv_bytes"] or 0) for row in gw.paths())


class Sampler(threading.Thread):
    """Peak RssAnon per process, and when the receiving gateway's paths had carried
    FIRST_BYTE_BYTES of the message (its per-path byte counters)."""

    def __init__(self, pids: dict[str, int], receiving: Path) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak_anon_kib = dict.fromkeys(pids, 0)
        self.gateway = Client(receiving)
        self.received_before = received_bytes(self.gateway)
        self.first_bytes: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for name, pid in self.pids.items():
                try:
                    kib = status_kib(pid)
                except (FileNotFoundError, ProcessLookupError):
                    continue
                self.peak_anon_kib[name] = max(self.peak_anon_kib[name], kib["RssAnon"])
            if self.first_bytes is None:
                now = time.monotonic()
                if received_bytes(self.gateway) - self.received_before >= FIRST_BYTE_BYTES:
                    self.first_bytes = now
            time.sleep(SAMPLE_S)
        self.gateway.close()


# a shared, loaded host can stall a daemon's loop for seconds: a peer declared dead
# mid-transfer would fail the message (either mode alike), so allow longer silences
LIMITS = "[limits]\npeer_dead_s = 60\n"


def start_sites(tree: Tree) -> LoopbackSites:
    lab = LoopbackSites(2, 3, mtu=9000, verbose=False, extra_toml=LIMITS)
    for site in lab.sites:
        site.process = lab.launch(site, log_mode="wb", env=tree.environ())
    lab.wait_all_paths_up()
    return lab


def spawn(
    script: str, socket_path: Path, size: int, mode: str, pool: str = "cold"
) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", script, os.fspath(socket_path), str(size), mode, pool],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{mode} trainer failed to start")
    return child


def one_transfer(
    lab: LoopbackSites, size: int, mode: str, pool: str, recv_mode: str | None = None
) -> dict[str, Any]:
    bj, sh = lab["bj"], lab["sh"]
    assert bj.process is not None and sh.process is not None
    idle = {name: status_kib(p.pid) for name, p in (("bj", bj.process), ("sh", sh.process))}
    receiver = spawn(RECEIVER, sh.socket_path, size, recv_mode or mode)
    sender = spawn(SENDER, bj.socket_path, size, "segments" if recv_mode else mode, pool)
    pids = {
        "sender": sender.pid,
        "receiver": receiver.pid,
        "bj": bj.process.pid,
        "sh": sh.process.pid,
    }
    sampler = Sampler(pids, sh.socket_path)
    sampler.start()
    assert sender.stdin and sender.stdout and receiver.stdout and receiver.stdin
    sender.stdin.write("go\n")
    sender.stdin.flush()
    sent = json.loads(sender.stdout.readline())
    got = json.loads(receiver.stdout.readline())
    sampler.stop.set()
    sampler.join()
    for child in (sender, receiver):
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(30)
    if not got["ok"]:
        raise AssertionError("the received array differs")
    t0 = sent["t0"]
    last_s = got["done"] - t0
    return {
        "mode": mode,
        "handover_s": sent["t1"] - t0,
        "first_byte_s": None if sampler.first_bytes is None else sampler.first_bytes - t0,
        "trainer_first_s": got["first"] - t0,
        "trainer_first_mib_s": got["first_mib"] - t0,
        "last_byte_s": last_s,
        "mbps": size * 8 / last_s / 1e6,
        "sender_anon_mib": sampler.peak_anon_kib["sender"] / 1024,
        "receiver_anon_mib": sampler.peak_anon_kib["receiver"] / 1024,
        "bj_anon_mib": (sampler.peak_anon_kib["bj"] - idle["bj"]["RssAnon"]) / 1024,
        "sh_anon_mib": (sampler.peak_anon_kib["sh"] - idle["sh"]["RssAnon"]) / 1024,
    }


def gib_table(runs: int, size: int, other: Tree | None, pool: str) -> list[dict[str, Any]]:
    rows = []
    ours = start_sites(THIS)
    theirs = ours if other is None else start_sites(other)
    try:
        for i in range(runs):
            for mode, lab in (("segments", ours), ("in-band", theirs))[:: 1 if i % 2 == 0 else -1]:
                row = one_transfer(lab, size, mode, pool)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        ours.stop()
        if theirs is not ours:
            theirs.stop()
    return rows


def stream_table(runs: int, size: int, other: Tree, pool: str) -> list[dict[str, Any]]:
    """This tree's daemons with a streaming receiver against ``other``'s daemons with a
    plain one (both sending from segments), alternating run by run."""
    rows = []
    ours = start_sites(THIS)
    theirs = start_sites(other)
    try:
        for i in range(runs):
            pairs = (("stream", ours), ("baseline", theirs))[:: 1 if i % 2 == 0 else -1]
            for mode, lab in pairs:
                row = one_transfer(lab, size, mode, pool, "stream" if mode == "stream" else "plain")
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        ours.stop()
        theirs.stop()
    return rows


def handover_parts(size: int, reps: int) -> dict[str, list[float]]:
    """Seconds per part of a ``send`` of ``size`` bytes (pool warm), and the copy into a
    reused segment against a fresh one sealed against writing, as the gateway would
    need it to trust the bytes without the checksum."""
    import fcntl
    import mmap

    from wangate.shm import SEND_NAME, SIZE_SEALS, new_segment, seal

    parts: dict[str, list[float]] = {
        "encode (1 CRC pass)": [],
        "copy into reused segment": [],
        "send() in all": [],
        "fresh segment: fill + F_SEAL_WRITE": [],
    }
    array = np.ones(size // 4, np.float32)
    with (
        LoopbackSites(2, 3, mtu=9000, verbose=False, extra_toml=LIMITS) as lab,
        lab["bj"].client() as bj,
        lab["sh"].client() as sh,
    ):
        session = bj._session
        bj.send("sh", "warm", array)  # the pool now holds a segment of the size
        sh.recv("warm", source="bj", timeout=900)
        for _ in range(reps):
            bj.ping()  # learn that the segment was released
            t0 = time.perf_counter()
            _meta, payload, _crc = session.encode("sh", "p", array, None)
            t1 = time.perf_counter()
            token, fd, mapping = session.fill_segment(payload)
            t2 = time.perf_counter()
            session.handed_back(token, fd, mapping, failed=True)
            parts["encode (1 CRC pass)"].append(t1 - t0)
            parts["copy into reused segment"].append(t2 - t1)
            t3 = time.perf_counter()
            fresh_fd, fresh = new_segment(size, SEND_NAME)
            np.frombuffer(fresh, np.uint8)[:] = np.frombuffer(payload, np.uint8)
            fresh.close()  # F_SEAL_WRITE needs no writable mapping left (EBUSY)
            seal(fresh_fd, SIZE_SEALS | fcntl.F_SEAL_WRITE)
            readonly = mmap.mmap(fresh_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
            t4 = time.perf_counter()
            readonly.close()
            os.close(fresh_fd)
            parts["fresh segment: fill + F_SEAL_WRITE"].append(t4 - t3)
            t5 = time.perf_counter()
            msg_id = bj.send("sh", "p", array)
            parts["send() in all"].append(time.perf_counter() - t5)
            sh.recv("p", source="bj", timeout=900)
            bj.wait("sh", msg_id, timeout=900)
    return parts


def handover_table(sizes: list[int], reps: int) -> dict[str, dict[int, list[float]]]:
    """Median ``send`` time per size, in-band and by segment, the receiver keeping up."""
    results: dict[str, dict[int, list[float]]] = {"in-band": {}, "segment": {}}
    with (
        LoopbackSites(2, 3, mtu=9000, verbose=False, extra_toml=LIMITS) as lab,
        lab["bj"].client() as bj,
        lab["sh"].client() as sh,
    ):
        for size in sizes:
            array = np.ones(size // 4, np.float32)
            for _ in range(reps):
                for mode, threshold in (("in-band", None), ("segment", 0)):
                    bj._session.segment_min_bytes = threshold
                    t0 = time.perf_counter()
                    msg_id = bj.send("sh", "h", array)
                    results[mode].setdefault(size, []).append(time.perf_counter() - t0)
                    sh.recv("h", source="bj", timeout=120)
                    bj.wait("sh", msg_id, timeout=120)  # nothing in flight next time
    return results


def crc_table(size: int = 256 * MiB, reps: int = 5) -> list[tuple[str, float, float]]:
    data = memoryview(np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8))
    candidates: list[tuple[str, Any]] = [
        ("zlib.crc32 (CRC-32)", zlib.crc32),
        ("isal crc32 (CRC-32, wangate.checksum)", crc32),
    ]
    readonly = data.tobytes()  # crc32c takes read-only buffers only
    try:
        import crc32c  # not a dependency: pip install crc32c to compare

        candidates.append(("crc32c.crc32c (CRC-32C)", lambda _: crc32c.crc32c(readonly)))
    except ImportError:
        print("(crc32c not installed: CRC-32C not measured)")
    rows = []
    for name, fn in candidates:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(data)
            times.append(time.perf_counter() - t0)
        gib = size / (1 << 30)
        rows.append((name, gib / statistics.median(times), gib / max(times)))
    return rows


def fmt_range(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    med = statistics.median(values) * scale
    return f"{med:.{digits}f} ({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench localapi shm")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gib", type=float, default=1.0)
    trees.add_argument(parser)
    parser.add_argument("--skip-gib", action="store_true")
    parser.add_argument("--skip-handover", action="store_true")
    parser.add_argument("--skip-crc", action="store_true")
    parser.add_argument("--stream", action="store_true", help="needs --tree")
    parser.add_argument("--handover-parts", action="store_true")
    parser.add_argument(
        "--warm-pool",
        action="store_true",
        help="the sender's pool already holds a segment of the size (a later step)",
    )
    args = parser.parse_args(argv)
    others = trees.trees(args)[1:]
    if len(others) > 1:
        parser.error("at most one --tree: its daemons are the baseline of every table")
    other = others[0] if others else None
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load {os.getloadavg()}"
    )
    if args.handover_parts:
        size = int(args.gib * (1 << 30))
        parts = handover_parts(size, reps=args.runs)
        print(f"\nsend of {size / (1 << 30):g} GiB, s, median (min-max) of {args.runs}")
        for name, values in parts.items():
            print(f"| {name} | {fmt_range(values)} |")
        print(f"load {os.getloadavg()}")
        return
    if args.stream:
        size = int(args.gib * (1 << 30))
        pool = "warm" if args.warm_pool else "cold"
        if other is None:
            parser.error("--stream needs --tree")
        rows = stream_table(args.runs, size, other, pool)
        print(f"\n{size / (1 << 30):g} GiB bj -> sh, median (min-max) of {args.runs} runs")
        print("| | stream (this tree) | baseline | stream / baseline |")
        print("|---|---:|---:|---:|")
        for key, label in [
            ("handover_s", "send hand-over s"),
            ("first_byte_s", "first MiB at sh (gateway) s"),
            ("trainer_first_s", "first bytes readable by the receiving trainer s"),
            ("trainer_first_mib_s", "first MiB readable (first progress step) s"),
            ("last_byte_s", "last byte (verified array) s"),
            ("sender_anon_mib", "sending trainer peak RssAnon MiB"),
            ("receiver_anon_mib", "receiving trainer peak RssAnon MiB"),
            ("bj_anon_mib", "bj daemon peak RssAnon above idle MiB"),
            ("sh_anon_mib", "sh daemon peak RssAnon above idle MiB"),
        ]:
            ours = [r[key] for r in rows if r["mode"] == "stream" and r[key] is not None]
            base = [r[key] for r in rows if r["mode"] == "baseline" and r[key] is not None]
            if ours and base:
                ratio = statistics.median(ours) / max(statistics.median(base), 1e-9)
                print(f"| {label} | {fmt_range(ours)} | {fmt_range(base)} | {ratio:.3f} |")
        print(f"load {os.getloadavg()}")
        return
    if not args.skip_crc:
        print("\nCRC-32 on 256 MiB, GiB/s median of 5 (slowest)")
        for name, med, low in crc_table():
            print(f"| {name} | {med:.2f} | {low:.2f} |")
    if not args.skip_handover:
        sizes = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
        table = handover_table(sizes, reps=7)
        print("\n| size | in-band ms | segment ms | segment / in-band |")
        print("|---:|---:|---:|---:|")
        for size in sizes:
            inband, seg = table["in-band"][size], table["segment"][size]
            ratio = statistics.median(seg) / statistics.median(inband)
            print(
                f"| {size // 1024} KiB | {fmt_range(inband, 1e3)} | {fmt_range(seg, 1e3)} | "
                f"{ratio:.2f} |"
            )
        print(f"load {os.getloadavg()}")
    if not args.skip_gib:
        size = int(args.gib * (1 << 30))
        pool = "warm" if args.warm_pool else "cold"
        rows = gib_table(args.runs, size, other, pool)
        print(
            f"\n{size / (1 << 30):g} GiB bj -> sh, median (min-max) of {args.runs} runs, "
            f"sender's segment pool {pool}"
        )
        keys = [
            ("handover_s", "send hand-over s", 1.0),
            ("first_byte_s", "first byte at sh s", 1.0),
            ("last_byte_s", "last byte (recv returns) s", 1.0),
            ("mbps", "goodput Mbit/s", 1.0),
            ("sender_anon_mib", "sending trainer peak RssAnon MiB", 1.0),
            ("receiver_anon_mib", "receiving trainer peak RssAnon MiB", 1.0),
            ("bj_anon_mib", "bj daemon peak RssAnon above idle MiB", 1.0),
            ("sh_anon_mib", "sh daemon peak RssAnon above idle MiB", 1.0),
        ]
        print("| | segments | in-band | segments / in-band |")
        print("|---|---:|---:|---:|")
        for key, label, scale in keys:
            seg = [r[key] for r in rows if r["mode"] == "segments" and r[key] is not None]
            inb = [r[key] for r in rows if r["mode"] == "in-band" and r[key] is not None]
            if not seg or not inb:
                continue
            ratio = statistics.median(seg) / statistics.median(inb)
            print(f"| {label} | {fmt_range(seg, scale)} | {fmt_range(inb, scale)} | {ratio:.3f} |")
        print(f"load {os.getloadavg()}")
