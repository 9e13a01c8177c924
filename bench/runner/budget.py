"""Where the link rate goes: a budget of one wangate run that sums to rate x time.

    python -m bench budget results/loss_long_1/run.json [more run.json ...]

For a scenario with one flow, the capacity of its paths over the workload's time
(first hand-over to last delivery) is split into:

- goodput: the workload's bytes;
- message framing: the message headers the gateway adds (source bytes less goodput);
- lost on the wire: packets the emulator dropped after the bottleneck (random and
  burst loss), headers included: capacity they used and nothing arrived;
- repair beyond the losses: repair bytes (FEC symbols, range repairs) sent in excess
  of the payload lost; what was needed to make up for the losses is already counted
  as "lost on the wire";
- headers, acks, control: everything else that crossed the bottleneck (IP, UDP and
  QUIC headers, shard headers, acks, probes, credit);
- unused capacity, split by the sender's 100 ms samples into start-up (before its
  first sample at 90 % of the paths' rate), tail (after its last sample at half the
  rate: the last repairs, acks and delivery) and mid-transfer (the rest: pacing below
  the delivery rate, gaps between messages, CPU stalls).

Counters come from the emulator (bytes and packets that crossed each bottleneck, drops
by cause) and the sending gateway's ``status()`` (source, FEC and repair bytes). The
parts sum to the capacity by construction: "mid-transfer" is what remains. Alongside:
queue drops (they never used the link), FEC sent up front and after losses, source
symbols the receiver rebuilt, the gaps the sender's paths had nothing to send between
messages, and the gateways' CPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from wangate.lab.scenario import Scenario, load_scenario

START_FRACTION = 0.9  # start-up ends with the first 100 ms sample at this share of the rate
TAIL_FRACTION = 0.5  # the tail starts after the last sample at this share

PARTS = (
    ("goodput", "goodput"),
    ("framing", "message framing"),
    ("lost", "lost on the wire"),
    ("repair_extra", "repair beyond the losses"),
    ("headers", "headers, acks, control"),
    ("unused_startup", "unused: start-up"),
    ("unused_mid", "unused: mid-transfer"),
    ("unused_tail", "unused: tail"),
)


def _direction(scenario: Scenario, path_name: str, src: str) -> str:
    path = next(p for p in scenario.paths if p.name == path_name)
    return "a_to_b" if path.site_a == src else "b_to_a"


def _send_series(
    record: dict[str, Any], src: str, dst: str, paths: list[str]
) -> list[tuple[float, int]]:
    """(t_s, bytes the sender's paths sent since the previous sample) during the workload."""
    series: list[tuple[float, int]] = []
    previous: int | None = None
    for sample in record["samples"]:
        if sample["site"] != src:
            continue
        rows = [r for r in sample["rows"] if r.get("peer") == dst and r.get("path") in paths]
        total = sum(int(r.get("sent_bytes") or 0) for r in rows)
        if previous is not None and sample["t_s"] > 0.0:
            series.append((float(sample["t_s"]), max(0, total - previous)))
        previous = total
    return series


def loss_budget(record: dict[str, Any], scenario: Scenario | None = None) -> dict[str, Any] | None:
    """The budget of one run, or None when it does not apply (several flows, incomplete)."""
    scenario = scenario or load_scenario(record["scenario"])
    wg = record["wangate"]
    if len(scenario.flows) != 1 or not wg.get("complete") or not wg.get("time_s"):
        return None
    flow = scenario.flows[0]
    src, dst = flow.src, flow.dst
    time_s = float(wg["time_s"])
    specs = scenario.paths_between(src, dst)
    rate_Bps = sum(p.params_from(src).rate_bps for p in specs) / 8
    if rate_Bps <= 0:
        return None
    capacity = rate_Bps * time_s
    links = record["link_stats"]["wangate_run"]
    crossed = lost = queue_drops = pushed_packets = 0.0
    for spec in specs:
        d = links[spec.name][_direction(scenario, spec.name, src)]
        packets = max(1, d["pushed_packets"])
        average = d["pushed_bytes"] / packets
        dropped = d["dropped_loss"] + d["dropped_burst"]
        lost += dropped * average
        crossed += d["delivered_bytes"] - d["duplicated"] * average + dropped * average
        queue_drops += d["dropped_queue"]
        pushed_packets += packets
    peer = record["wangate"]["gateway_status"][src]["peers"][dst]
    receiver = record["wangate"]["gateway_status"][dst]["peers"][src]
    source = float(peer["source_bytes"])
    repair_sent = float(peer["fec_bytes"]) + float(peer["repair_bytes"])
    mtu = min(p.mtu for p in specs)
    from wangate.engine import DATAGRAM_OVERHEAD_BYTES

    # the gateway measured may be of any wire version: 20 bytes of datagram header
    # (wire version 2 and later; 42-46 in version 1) and the packet's overhead (40 in
    # the data plane's packets, wire version 4; 30-34 in version 3's QUIC DATAGRAM
    # frames) only set this count, which is shown, not used in the parts
    overhead = DATAGRAM_OVERHEAD_BYTES
    symbol = mtu - 28 - overhead - 20  # IPv4 in the lab
    data_packets = (source + repair_sent) / symbol
    # losses strike data and control packets alike: the data's share of them lost payload
    lost_payload = lost / max(1.0, crossed) * (source + repair_sent)
    parts: dict[str, float] = {
        "goodput": float(record["total_bytes"]),
        "framing": source - float(record["total_bytes"]),
        "lost": lost,
        "repair_extra": repair_sent - lost_payload,
    }
    parts["headers"] = crossed - lost - source - parts["repair_extra"]
    unused = capacity - crossed
    # start-up and tail from the sender's samples (payload bytes, scaled to the wire)
    series = _send_series(record, src, dst, [p.name for p in specs])
    sent_total = sum(b for _, b in series) or 1
    scale = crossed / sent_total
    startup = tail = 0.0
    if series:
        full = [
            i for i, (_, b) in enumerate(series) if b * scale >= START_FRACTION * rate_Bps * 0.1
        ]
        busy = [i for i, (_, b) in enumerate(series) if b * scale >= TAIL_FRACTION * rate_Bps * 0.1]
        first = full[0] if full else len(series)
        last = busy[-1] if busy else -1
        previous_t = 0.0
        for i, (t_s, b) in enumerate(series):
            span = max(0.0, min(t_s, time_s) - previous_t)
            previous_t = min(t_s, time_s)
            gap = max(0.0, rate_Bps * span - b * scale)
            if i < first:
                startup += gap
            elif i > last:
                tail += gap
        tail += max(0.0, time_s - (series[-1][0] if series else 0.0)) * rate_Bps
    startup, tail = min(startup, unused), min(tail, max(0.0, unused - startup))
    parts["unused_startup"] = startup
    parts["unused_tail"] = tail
    parts["unused_mid"] = unused - startup - tail
    cpu = record["wangate"].get("gateway_cpu", {})
    return {
        "capacity_bytes": capacity,
        "time_s": time_s,
        "rate_mbps": rate_Bps * 8 / 1e6,
        "shares": {k: v / capacity for k, v in parts.items()},
        "bytes": parts,
        "info": {
            "queue_drops": int(queue_drops),
            "packets": int(pushed_packets),
            "data_packets": int(data_packets),
            "fec_bytes": int(peer["fec_bytes"]),
            "fec_upfront_bytes": peer.get("fec_upfront_bytes"),
            "fec_after_loss_bytes": (
                None
                if peer.get("fec_upfront_bytes") is None
                else int(peer["fec_bytes"]) - int(peer["fec_upfront_bytes"])
            ),
            "range_repair_bytes": int(peer["repair_bytes"]),
            "symbols_recovered": receiver.get("symbols_recovered"),
            "send_gaps": peer.get("send_gaps"),
            "late_timers": peer.get("late_timers"),
            # the sender's path rows: bytes it holds lost, datagrams it declared lost
            # that were acked later
            **{
                key: sum(
                    int(row.get(key, 0))
                    for row in record["wangate"].get("gateway_paths", {}).get(src, [])
                    if row.get("peer") == dst
                )
                for key in ("lost_bytes", "spurious_losses")
            },
            "send_gap_ms": None if peer.get("send_gap_us") is None else peer["send_gap_us"] / 1e3,
            "gateway_cpu": {site: c.get("core_share") for site, c in cpu.items()},
            "load_average": record["wangate"].get("load_average"),
        },
    }


def budget_table(records: list[dict[str, Any]]) -> str:
    """One column per run: each part's share of the capacity."""
    # a record from bench.runner.run carries its budget (its scenario file may be gone)
    budgets = [(r, r["budget"] if "budget" in r else loss_budget(r)) for r in records]
    budgets = [(r, b) for r, b in budgets if b is not None]
    if not budgets:
        return "(no single-flow run that completed)"
    head = "| part | " + " | ".join(f"{r['scenario']} ({r['run_id']})" for r, _ in budgets) + " |"
    lines = [head, "|---" * (len(budgets) + 1) + "|"]
    for key, label in PARTS:
        cells = [f"{b['shares'][key]:.3f}" for _, b in budgets]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(
        "| sum | " + " | ".join(f"{sum(b['shares'].values()):.3f}" for _, b in budgets) + " |"
    )

    def info(label: str, fmt: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(fmt(b) for _, b in budgets) + " |")

    def mb(value: Any) -> str:
        return "-" if value is None else f"{value / 1e6:.2f} MB"

    info("time (s); link Mbit/s", lambda b: f"{b['time_s']:.2f}; {b['rate_mbps']:.0f}")
    info(
        "FEC up front / after loss",
        lambda b: (
            f"{mb(b['info']['fec_upfront_bytes'])} / {mb(b['info']['fec_after_loss_bytes'])}"
            if b["info"]["fec_upfront_bytes"] is not None
            else f"{mb(b['info']['fec_bytes'])} (not split)"
        ),
    )
    info(
        "symbols rebuilt at the receiver",
        lambda b: str(
            b["info"]["symbols_recovered"] if b["info"]["symbols_recovered"] is not None else "-"
        ),
    )
    info("queue drops (packets)", lambda b: str(b["info"]["queue_drops"]))
    info(
        "gaps between messages (count, ms)",
        lambda b: (
            "-"
            if b["info"]["send_gaps"] is None
            else f"{b['info']['send_gaps']}, {b['info']['send_gap_ms']:.1f}"
        ),
    )
    info(
        "gateway CPU (share of a core)",
        lambda b: ", ".join(
            f"{s} {v:.2f}" for s, v in b["info"]["gateway_cpu"].items() if v is not None
        ),
    )
    info(
        "load average (start, end)",
        lambda b: ", ".join(f"{v:.1f}" for v in b["info"]["load_average"] or []) or "-",
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench budget", description=__doc__)
    parser.add_argument("run_json", nargs="+", type=Path, help="a run.json of the runner")
    args = parser.parse_args(argv)
    records = [json.loads(file.read_text()) for file in args.run_json]
    print(budget_table(records))
    return 0
