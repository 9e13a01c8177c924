"""Floods of forged QUIC packets at a listener, and what they cost it.

``flood`` sends one kind of hostile traffic (see ``KINDS``; packets from
:mod:`wangate.lab.forge`) to a loopback address at a paced rate; ``flood_in_subprocess``
does it from a process of its own, so the flooder's CPU and GIL are not the caller's::

    python -m wangate.lab.flood KIND HOST:PORT COUNT RATE_PPS    # prints what came back

``rss_mib``, ``RssSampler``, ``socket_drops`` and ``listen_address`` read what the
target daemon pays: its memory, its peak memory, the datagrams its socket dropped.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from wangate.lab.forge import (
    SpoofingSender,
    forged_initial,
    looks_like_token,
    short_header_garbage,
    validated_initials,
)

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # holds this wangate


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
    """:func:`flood` in a process of its own (the caller's threads keep their GIL)."""
    argv = [sys.executable, "-m", "wangate.lab.flood", kind, f"{target[0]}:{target[1]}"]
    out = subprocess.run(  # run from the folder holding this wangate: the same code
        [*argv, str(count), str(rate_pps)],
        cwd=PACKAGE_ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, int] = json.loads(out.stdout)
    return result


def flood(kind: str, target: tuple[str, int], count: int, rate_pps: float) -> dict[str, int]:
    """Send ``count`` hostile datagrams of ``kind`` to ``target``; returns what came back."""
    if kind == "spoofed":
        return _flood_spoofed(target, count, rate_pps)
    if kind == "validated":
        return _flood_validated(target, count, rate_pps)
    make: Callable[[], bytes] = {
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


def main(argv: list[str]) -> int:
    kind, address, count, rate = argv[:4]
    host, port = address.rsplit(":", 1)
    print(json.dumps(flood(kind, (host, int(port)), int(count), float(rate))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
