"""Critical latency and failover: a 64 KiB critical message every 50 ms beside bulk.

    python -m bench suite critical       # critical_bulk, critical_nobulk, critical_jitter, *_w2
    python -m bench suite failover       # failover_degrade, failover_blackhole
    python -m bench transport critical floor [SCENARIO]   # the lab floor alone; needs root

Each scenario runs through the runner without baselines, then its lab floor is measured
(``measure``: the same bytes as raw UDP on the best path, no gateway). The table reads
the records on disk: critical send->deliver p50 / p99 / max against the aim (best path's
one-way delay + 2 x jitter + 10 ms), the floor, losses, and the critical route: when a
path degrades or blackholes (failover), whether and how fast the route leaves it; under
jitter, how often it switches.

**The lab's floor** for a critical message: its bytes as raw UDP, no gateway at all. In
the scenario's lab (default ``critical_nobulk``), a sender in the first site sends each
critical message of the scenario's first flow as a burst of full-size UDP datagrams
(path MTU less the IP and UDP headers) on the path with the least one-way delay, at the
flow's times; a receiver in the other site notes when each datagram arrives. A
message's time is its first datagram's send to its last datagram's arrival (one
monotonic clock for every namespace). The scenario's timeline plays as it would for the
gateways. No transport can deliver those bytes sooner on that path of this emulator, so
this is what a gateway's critical latency is measured against. Results go to
``results/critical_floor/<scenario>.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import struct
import subprocess
import sys
import time
from typing import Any

from bench.common import RESULTS, fmt, load_record, met, ms, quantile
from wangate.lab import Lab, load_scenario

CRITICAL = ("critical_bulk", "critical_jitter", "critical_nobulk")
# the same links and workload with two worker processes per gateway (proto/workers.md):
# their floor is their base scenario's
WORKERS = ("critical_bulk_w2", "critical_nobulk_w2")
FAILOVER = ("failover_degrade", "failover_blackhole")
COOLDOWN_S = 2.0  # the critical selector's cooldown after a switch (README)


def _critical(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in record["messages"] if m["critical"]]


def _routes(record: dict[str, Any], src: str = "bj") -> list[dict[str, Any]]:
    return [c for c in record["route_changes"] if c["source"] == "log" and c["site"] == src]


def _aim_ms(record: dict[str, Any], scenario_name: str) -> tuple[float, str]:
    scenario = load_scenario(scenario_name)
    best = min(scenario.paths, key=lambda p: p.a_to_b.delay_ms)
    aim = best.a_to_b.delay_ms + 2 * best.a_to_b.jitter_ms + 10
    return aim, f"{best.a_to_b.delay_ms:g} + 2x{best.a_to_b.jitter_ms:g} + 10"


def _route_text(change: dict[str, Any] | None) -> str:
    if change is None:
        return "never"
    return f"{change['previous']} -> {change['current']}: {change['reason']}"


def _floor_rows(name: str, p50: float | None, p99: float | None) -> list[str]:
    file = RESULTS / "critical_floor" / f"{name.removesuffix('_w2')}.json"
    if not file.exists():
        return []
    floor = json.loads(file.read_text())
    times = floor["times_s"]
    if not times:
        return []
    floor_p50, floor_p99 = quantile(times, 0.5), quantile(times, 0.99)
    found = [
        f"| {name} | lab floor: the message as {floor['datagrams']} raw UDP datagrams of "
        f"{floor['datagram_bytes']} B on path {floor['path']}, no gateway, the timeline "
        f"playing; first send -> last arrival p50 / p99 / max (ms), {floor['complete']} of "
        f"{floor['messages']} complete | {fmt(ms(floor_p50), '.1f')} / "
        f"{fmt(ms(floor_p99), '.1f')} / {fmt(ms(max(times)), '.1f')} | | |"
    ]
    if floor_p50 and floor_p99 and p50 is not None and p99 is not None:
        found.append(
            f"| {name} | critical p50 / p99 over the floor's | "
            f"{p50 / floor_p50:.2f} / {p99 / floor_p99:.2f} | | |"
        )
    return found


def rows(names: tuple[str, ...]) -> list[str]:
    """The table of the last runs of ``names`` on disk."""
    lines = ["| scenario | metric | measured | aim | met? |", "|---|---|---|---|---|"]
    for name in names:
        record = load_record(name)
        if record is None:
            lines.append(f"| {name} | not run | | | |")
            continue
        crit = _critical(record)
        delays = [m["send_to_deliver_s"] for m in crit if m["send_to_deliver_s"] is not None]
        lost = [m for m in record["messages"] if not m["intact"]]
        aim, aim_text = _aim_ms(record, name)
        p99 = quantile(delays, 0.99)
        wg = record["wangate"]
        p50, worst = quantile(delays, 0.5), max(delays) if delays else None
        lines.append(
            f"| {name} | critical send->deliver p50 / p99 / max (ms), {len(delays)} of "
            f"{len(crit)} delivered | {fmt(ms(p50), '.0f')} / "
            f"**{fmt(ms(p99), '.0f')}** / "
            f"{fmt(ms(worst), '.0f')} | p99 <= {aim:.0f} ({aim_text}) | "
            f"{met(p99 is not None and p99 * 1e3 <= aim)} |"
        )
        lines.extend(_floor_rows(name, p50, p99))
        lines.append(
            f"| {name} | messages lost or corrupt (of {wg['messages']}); bulk delivered "
            f"by | {len(lost)}; workload done at {fmt(wg['time_s'], '.1f', ' s')} | 0 | "
            f"{met(not lost)} |"
        )
        routes = _routes(record)
        events = [e["at_s"] for e in record["timeline"]]
        if name.startswith("failover_"):
            at, hit = events[0], record["timeline"][0]["path"]
            before = [c for c in routes if c["t_s"] < at]
            on = before[-1]["current"] if before else None
            lines.append(
                f"| {name} | critical route when path {hit} changes at t={at:g} s | "
                f"{on} ({_route_text(before[-1]) if before else 'no route'}) | {hit} | "
                f"{met(on == hit)} |"
            )
            moved = [c for c in routes if c["t_s"] >= at and c["previous"] == hit]
            first = moved[0] if moved and on == hit else None
            reaction = first["t_s"] - at if first else None
            lines.append(
                f"| {name} | critical route leaves {hit} after the t={at:g} s event "
                f"| {fmt(reaction, '.2f', ' s')} "
                f"({_route_text(first)}) "
                f"| < 1 s | {met(reaction is not None and reaction < 1.0)} |"
            )
            late = [m for m in crit if m["call_s"] is not None and m["call_s"] >= at]
            worst = max(late, key=lambda m: m["send_to_deliver_s"] or 1e9) if late else None
            if worst:
                lines.append(
                    f"| {name} | longest critical delay after the event | "
                    f"{fmt(ms(worst['send_to_deliver_s']), '.0f', ' ms')} "
                    f"(sent at {worst['call_s']:.2f} s) | | |"
                )
        if "jitter" in name:
            # the route matters while critical traffic flows; moves after it (bulk alone,
            # e.g. a loss burst when bulk speeds up again) are listed on their own
            end = max((m["delivered_s"] or 0 for m in crit), default=0.0)
            inside = [c for c in routes if 0 <= c["t_s"] <= end]
            after = [c for c in routes if c["t_s"] > end]
            windows = max(1, math.ceil(end / COOLDOWN_S))
            worst_window = max(
                (
                    sum(1 for c in inside if t <= c["t_s"] < t + COOLDOWN_S)
                    for t in [c["t_s"] for c in inside]
                ),
                default=0,
            )
            lines.append(
                f"| {name} | critical route switches bj->sh while critical traffic "
                f"flowed ({end:.1f} s) | "
                f"{len(inside)} = {len(inside) / windows:.2f} per {COOLDOWN_S:g} s; "
                "at most "
                f"**{worst_window}** in any {COOLDOWN_S:g} s window | <= 1 per cooldown | "
                f"{met(worst_window <= 1)} |"
            )
            gaps = [b["t_s"] - a["t_s"] for a, b in itertools.pairwise(inside)]
            listed = "; ".join(f"{c['t_s']:.2f} s {_route_text(c)}" for c in inside[:8])
            lines.append(
                f"| {name} | shortest gap between switches; the switches | "
                f"{fmt(min(gaps) if gaps else None, '.2f', ' s')}; {listed or 'none'}"
                f"{' ...' if len(inside) > 8 else ''} | >= {COOLDOWN_S:g} s | "
                f"{met(not gaps or min(gaps) >= COOLDOWN_S)} |"
            )
            if after:
                listed = "; ".join(f"{c['t_s']:.2f} s {_route_text(c)}" for c in after[:4])
                lines.append(
                    f"| {name} | route changes after critical traffic ended | "
                    f"{len(after)}: {listed} | | |"
                )
        lines.append(
            f"| {name} | plot | `results/{name}/latency.png` (route changes marked), "
            f"`paths.png`, `goodput.png` | | |"
        )
    return lines


# ---------------------------------------------------------------- the floor

OUT = RESULTS / "critical_floor"
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
    scenario = load_scenario(scenario_name)
    flow = scenario.flows[0]
    message = next(m for m in flow.messages if m.critical)
    best = min(scenario.paths, key=lambda p: p.a_to_b.delay_ms)
    src, dst = flow.src, flow.dst
    with Lab(scenario) as lab:
        here = next(a for a in lab.site_addresses(src) if a.path == best.name)
        there = next(a for a in lab.site_addresses(dst) if a.path == best.name)
        datagram_bytes = here.mtu - IP_UDP_HEADER_BYTES
        worker = [sys.executable, "-m", "bench.transport.critical"]
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
    parser = argparse.ArgumentParser(prog="python -m bench transport critical")
    sub = parser.add_subparsers(dest="command", required=True)
    floor = sub.add_parser("floor", help="measure and print the lab floor of one scenario")
    floor.add_argument("scenario", nargs="?", default="critical_nobulk")
    args = parser.parse_args(argv)
    record = measure(args.scenario)
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


if __name__ == "__main__":  # a floor's sender or receiver inside a site's namespace
    role, spec = sys.argv[1], json.loads(sys.argv[2])
    sys.exit(_sender(spec) if role == "sender" else _receiver(spec))
