"""A plain UDP blaster and sink for measuring an emulated link.

Each datagram carries its sequence number and the sender's ``time.monotonic_ns()``;
namespaces share the host's monotonic clock, so the sink measures one-way delay
directly. Rates count IP bytes (UDP payload + 28), which is what the link limits.

    python -m wangate.lab.blaster sink --bind 10.77.1.2:9000 --idle-s 1.0
    python -m wangate.lab.blaster send --bind 10.77.1.1 --to 10.77.1.2:9000 \
        --rate-mbps 20 --size 1200 --count 5000

Both print one JSON line of results on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import statistics
import struct
import sys
import time
from typing import Any

HEADER = struct.Struct("!QQ")
IP_UDP_OVERHEAD = 28


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def send(
    bind: str, to: tuple[str, int], rate_mbps: float, size: int, count: int, duration_s: float
) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    sock.bind((bind, 0))
    sock.connect(to)
    padding = bytes(max(0, size - HEADER.size))
    wire_bytes = size + IP_UDP_OVERHEAD
    rate_bytes_per_s = rate_mbps * 1e6 / 8.0
    start = time.monotonic()
    end = start + duration_s if duration_s > 0 else float("inf")
    sent = errors = 0
    pack, now_ns, monotonic, sendmsg = HEADER.pack, time.monotonic_ns, time.monotonic, sock.send
    while sent < count:
        now = monotonic()
        if now >= end:
            break
        if rate_bytes_per_s <= 0:
            allowed = sent + 64  # flat out, but look at the clock every 64 packets
        else:
            allowed = int((now - start) * rate_bytes_per_s / wire_bytes) + 1
        if sent >= allowed:
            time.sleep(min(0.0005, (sent + 1 - allowed) * wire_bytes / rate_bytes_per_s))
            continue
        for _ in range(min(allowed, count) - sent):
            try:
                sendmsg(pack(sent, now_ns()) + padding)
            except OSError:  # ENOBUFS when the TUN queue is full: count it, keep going
                errors += 1
            sent += 1
    elapsed = time.monotonic() - start
    return {
        "sent": sent,
        "send_errors": errors,
        "elapsed_s": elapsed,
        "size": size,
        "sent_mbps": sent * wire_bytes * 8 / elapsed / 1e6 if elapsed > 0 else 0.0,
    }


def sink(bind: tuple[str, int], idle_s: float, max_s: float, first_s: float) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(bind)
    print(json.dumps({"ready": True}), flush=True)
    sequences: list[int] = []
    delays_ns: list[int] = []
    arrivals_ns: list[int] = []
    size = 0
    buffer = bytearray(65536)
    unpack, now_ns, recv_into = HEADER.unpack_from, time.monotonic_ns, sock.recv_into
    sock.settimeout(first_s)  # waiting for the first packet
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        try:
            size = recv_into(buffer)
        except TimeoutError:
            break
        arrived = now_ns()
        sequence, sent_ns = unpack(buffer)
        sequences.append(sequence)
        delays_ns.append(arrived - sent_ns)
        arrivals_ns.append(arrived)
        sock.settimeout(idle_s)
    return summarise(sequences, delays_ns, arrivals_ns, size)


def summarise(
    sequences: list[int], delays_ns: list[int], arrivals_ns: list[int], size: int
) -> dict[str, Any]:
    received = len(sequences)
    unique = len(set(sequences))
    reordered = sum(1 for before, after in itertools.pairwise(sequences) if after < before)
    result: dict[str, Any] = {
        "received": received,
        "unique": unique,
        "duplicates": received - unique,
        "reordered": reordered,
        "max_sequence": max(sequences) if sequences else -1,
        "size": size,
    }
    if received >= 2:
        delays_ms = sorted(d / 1e6 for d in delays_ns)
        span_s = (arrivals_ns[-1] - arrivals_ns[0]) / 1e9
        result.update(
            delay_median_ms=statistics.median(delays_ms),
            delay_p05_ms=delays_ms[int(0.05 * (received - 1))],
            delay_p95_ms=delays_ms[int(0.95 * (received - 1))],
            delay_stdev_ms=statistics.pstdev(delays_ms),
            span_s=span_s,
            received_mbps=(received - 1) * (size + IP_UDP_OVERHEAD) * 8 / span_s / 1e6
            if span_s > 0
            else 0.0,
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wangate.lab.blaster")
    sub = parser.add_subparsers(dest="mode", required=True)
    sender = sub.add_parser("send")
    sender.add_argument("--bind", required=True)
    sender.add_argument("--to", required=True, type=_address)
    sender.add_argument("--rate-mbps", type=float, default=0.0, help="0 = as fast as possible")
    sender.add_argument("--size", type=int, default=1200, help="UDP payload bytes")
    sender.add_argument("--count", type=int, default=10**12)
    sender.add_argument("--duration-s", type=float, default=0.0)
    receiver = sub.add_parser("sink")
    receiver.add_argument("--bind", required=True, type=_address)
    receiver.add_argument("--idle-s", type=float, default=1.0)
    receiver.add_argument("--max-s", type=float, default=60.0)
    receiver.add_argument(
        "--first-s",
        type=float,
        default=3.0,
        help="give up when no packet arrives this long after start",
    )
    args = parser.parse_args(argv)
    if args.mode == "send":
        if args.size < HEADER.size:
            parser.error(f"--size must be at least {HEADER.size}")
        result = send(args.bind, args.to, args.rate_mbps, args.size, args.count, args.duration_s)
    else:
        result = sink(args.bind, args.idle_s, args.max_s, args.first_s)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
