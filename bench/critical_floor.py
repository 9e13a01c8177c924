"""The lab's own floor for a critical message: its bytes as raw UDP, no gateway at all.

    python -m bench.critical_floor [SCENARIO]        # default critical_nobulk; needs root

In the scenario's lab, a sender in the first site sends each critical message of the
scenario's first flow as a burst of full-size UDP datagrams (path MTU less the IP and
UDP headers) on the path with the least one-way delay, at the flow's times; a receiver
in the other site notes when each datagram arrives. A message's time is its first
datagram's send to its last datagram's arrival (one monotonic clock for every
namespace). The scenario's timeline plays as it would for the gateways. No transport
can deliver those bytes sooner on that path of this emulator, so this is what a
gateway's critical latency is measured against. Results go to
``results/critical_floor/<scenario>.json``.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "critical_floor"
PORT = 9411
IP_UDP_HEADER_BYTES = 28
HEAD = struct.Struct("!IQH")  # message index, first send time (ns), datagram index
DRAIN_S = 2.0  # the receiver stops this long after the last datagram
START_S = 0.5  # the first burst leaves this long after the receiver is ready


def _sender(spec: dict[str, Any]) -> int:
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((spec["local"], 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    payload_bytes = spec["datagram_bytes"] - HEAD.size
    count = -(-spec["size_bytes"] // payload_bytes)
    pad = bytes(payload_bytes)
    t0_ns = int(spec["t0_ns"])
    for index in range(spec["messages"]):
        due_ns = t0_ns + int(index * spec["interval_s"] * 1e9)
        wait_s = (due_ns - time.monotonic_ns()) / 1e9
        if wait_s > 0:
            time.sleep(wait_s)
        first_ns = time.monotonic_ns()
        for datagram in range(count):
            sock.sendto(HEAD.pack(index, first_ns, datagram) + pad, (spec["remote"], PORT))
    return 0


def _receiver(spec: dict[str, Any]) -> int:
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((spec["local"], PORT))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    messages: dict[int, list[int]] = {}  # index -> [first send ns, datagrams, last arrival ns]
    print(json.dumps({"ready": True}), flush=True)
    # until the bursts are over (a blackhole may silence the path for seconds), then
    # until the path has been quiet for DRAIN_S
    end_ns = time.monotonic_ns() + int((spec["start_s"] + spec["duration_s"]) * 1e9)
    while True:
        remaining_s = (end_ns - time.monotonic_ns()) / 1e9
        sock.settimeout(max(remaining_s, DRAIN_S))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        now_ns = time.monotonic_ns()
        index, first_ns, _ = HEAD.unpack_from(data)
        entry = messages.setdefault(index, [first_ns, 0, 0])
        entry[1] += 1
        entry[2] = now_ns
    print(json.dumps({str(k): v for k, v in messages.items()}), flush=True)
    return 0


def measure(scenario_name: str = "critical_nobulk") -> dict[str, Any]:
    from bench.lab import Lab, load_scenario

    scenario = load_scenario(scenario_name)
    flow = scenario.flows[0]
    message = next(m for m in flow.messages if m.critical)
    best = min(scenario.paths, key=lambda p: p.a_to_b.delay_ms)
    src, dst = flow.src, flow.dst
    with Lab(scenario) as lab:
        here = next(a for a in lab.site_addresses(src) if a.path == best.name)
        there = next(a for a in lab.site_addresses(dst) if a.path == best.name)
        datagram_bytes = here.mtu - IP_UDP_HEADER_BYTES
        worker = [sys.executable, "-m", "bench.critical_floor", "worker"]
        duration_s = flow.steps * flow.interval_s
        receiver = lab.run_in(
            dst,
            [
                *worker,
                "receiver",
                json.dumps({"local": there.local, "start_s": START_S, "duration_s": duration_s}),
            ],
            stdout=subprocess.PIPE,
        )
        assert receiver.stdout is not None
        receiver.stdout.readline()  # ready
        t0_ns = time.monotonic_ns() + int(START_S * 1e9)
        lab.start_timeline(t0_ns / 1e9)  # the timeline starts with the first burst
        spec = {
            "local": here.local,
            "remote": here.remote,
            "datagram_bytes": datagram_bytes,
            "size_bytes": message.size_bytes,
            "messages": flow.steps,
            "interval_s": flow.interval_s,
            "t0_ns": t0_ns,
        }
        sender = lab.run_in(src, [*worker, "sender", json.dumps(spec)])
        sender.wait()
        out, _ = receiver.communicate(timeout=30)
    arrived = json.loads(out.decode().splitlines()[-1])
    count = -(-message.size_bytes // (datagram_bytes - HEAD.size))
    times_s = sorted(
        (last_ns - first_ns) / 1e9 for first_ns, got, last_ns in arrived.values() if got == count
    )
    record = {
        "scenario": scenario_name,
        "path": best.name,
        "delay_ms": best.a_to_b.delay_ms,
        "jitter_ms": best.a_to_b.jitter_ms,
        "rate_mbps": best.a_to_b.rate_mbps,
        "size_bytes": message.size_bytes,
        "datagram_bytes": datagram_bytes,
        "datagrams": count,
        "messages": flow.steps,
        "complete": len(times_s),
        "times_s": times_s,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{scenario_name}.json").write_text(json.dumps(record, indent=1))
    return record


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        spec = json.loads(argv[2])
        return _sender(spec) if argv[1] == "sender" else _receiver(spec)
    record = measure(*argv[:1])
    times: list[float] = record["times_s"]

    def q(p: float) -> float:
        return times[min(len(times) - 1, int(p * len(times)))] * 1e3

    print(
        f"{record['scenario']} path {record['path']}: {record['complete']} of "
        f"{record['messages']} bursts of {record['datagrams']} x {record['datagram_bytes']} B; "
        f"first send -> last arrival p50 {q(0.5):.1f} / p99 {q(0.99):.1f} / "
        f"max {times[-1] * 1e3:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
