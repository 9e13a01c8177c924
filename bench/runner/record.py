"""From raw run data to the JSON record and its Markdown summary (no I/O here).

Times in the record are seconds after ``t0`` (the instant the timeline and the
senders started). Per-path series are per direction ``"src->dst"``: goodput from the
receiving gateway's ``recv_bytes`` for that path (shard bytes that arrived, repairs
included), RTT, loss and role from the sending gateway's row for that path.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from wangate.lab.scenario import Flow, Scenario

RECORD_KEYS = (
    "scenario",
    "description",
    "machine",
    "command",
    "run_id",
    "gateway_version",
    "started_at",
    "bound_s",
    "bound_is_multipath",
    "total_bytes",
    "wangate",
    "messages",
    "paths",
    "route_changes",
    "baselines",
    "link_stats",
    "gateway_logs",
)


def flow_key(flow: Flow) -> str:
    return f"{flow.src}->{flow.dst}"


def flow_messages(flow: Flow) -> list[list[Any]]:
    """``[step, index, name, size_bytes, critical, at_s]`` of every message, in send order."""
    return [
        [step, index, m.name, m.size_bytes, m.critical, flow.start_s + step * flow.interval_s]
        for step in range(flow.steps)
        for index, m in enumerate(flow.messages)
    ]


# -- counters to rates --------------------------------------------------------------------
def counter_deltas(points: Sequence[tuple[float, int]]) -> list[tuple[float, float, int]]:
    """``(start, end, bytes)`` between consecutive samples; a counter that went back
    (connection replaced) counts from zero."""
    spans = []
    for (t_a, c_a), (t_b, c_b) in itertools.pairwise(points):
        delta = c_b - c_a if c_b >= c_a else c_b
        if t_b > t_a:
            spans.append((t_a, t_b, delta))
    return spans


def bytes_between(spans: Iterable[tuple[float, float, int]], start: float, end: float) -> float:
    """Bytes counted in ``[start, end]``, spreading each span's bytes evenly over it."""
    total = 0.0
    for t_a, t_b, delta in spans:
        overlap = min(end, t_b) - max(start, t_a)
        if overlap > 0:
            total += delta * overlap / (t_b - t_a)
    return total


def per_second(spans: Sequence[tuple[float, float, int]], end_s: float) -> list[float]:
    """Mbit/s in each whole second ``[k, k+1)`` from 0 to ``end_s``."""
    seconds = max(1, math.ceil(end_s))
    return [bytes_between(spans, k, k + 1) * 8 / 1e6 for k in range(seconds)]


def _series(
    rows: list[tuple[float, dict[str, Any]]], key: str, end_s: float, reduce: str
) -> list[Any]:
    """One value per second from the samples inside it (median or last; None if none)."""
    out: list[Any] = []
    for k in range(max(1, math.ceil(end_s))):
        values = [row[key] for t, row in rows if k <= t < k + 1 and row.get(key) is not None]
        if not values:
            out.append(None)
        elif reduce == "median":
            out.append(round(float(statistics.median(values)), 3))
        elif reduce == "max":
            out.append(round(float(max(values)), 5))
        else:
            out.append(values[-1])
    return out


def path_rows(
    samples: list[dict[str, Any]], site: str, peer: str, path: str, t0_ns: int
) -> list[tuple[float, dict[str, Any]]]:
    found = []
    for sample in samples:
        if sample["site"] != site:
            continue
        for row in sample["rows"]:
            if row["peer"] == peer and row["path"] == path:
                found.append(((sample["t_ns"] - t0_ns) / 1e9, row))
    return found


def path_series(
    scenario: Scenario, samples: list[dict[str, Any]], t0_ns: int, end_s: float
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per direction and path: per-second goodput, RTT, loss, role, and byte totals."""
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for flow in scenario.flows:
        key = flow_key(flow)
        if key in result:
            continue
        result[key] = {}
        for spec in scenario.paths_between(flow.src, flow.dst):
            received = path_rows(samples, flow.dst, flow.src, spec.name, t0_ns)
            sending = path_rows(samples, flow.src, flow.dst, spec.name, t0_ns)
            spans = counter_deltas([(t, int(row["recv_bytes"] or 0)) for t, row in received])
            result[key][spec.name] = {
                "t_s": list(range(max(1, math.ceil(end_s)))),
                "goodput_mbps": [round(v, 3) for v in per_second(spans, end_s)],
                "srtt_ms": _series(sending, "srtt_ms", end_s, "median"),
                "loss": _series(sending, "loss", end_s, "max"),
                "role": _series(sending, "role", end_s, "last"),
                "state": _series(sending, "state", end_s, "last"),
                "received_bytes": round(bytes_between(spans, 0.0, end_s)),
                "nominal": {
                    "rate_mbps": spec.params_from(flow.src).rate_mbps,
                    "delay_ms": spec.params_from(flow.src).delay_ms,
                    "loss": spec.params_from(flow.src).loss,
                },
            }
    return result


def role_changes(
    scenario: Scenario, samples: list[dict[str, Any]], t0_ns: int
) -> list[dict[str, Any]]:
    """Changes of the critical route seen in the sending gateways' ``role`` column."""
    changes = []
    for flow in scenario.flows:
        current: str | None = None
        seen = False
        for sample in samples:
            if sample["site"] != flow.src:
                continue
            critical = [
                r["path"]
                for r in sample["rows"]
                if r["peer"] == flow.dst and r["role"] == "critical"
            ]
            now = critical[0] if critical else None
            if seen and now != current:
                changes.append(
                    {
                        "t_s": round((sample["t_ns"] - t0_ns) / 1e9, 3),
                        "site": flow.src,
                        "peer": flow.dst,
                        "previous": current,
                        "current": now,
                        "source": "paths",
                    }
                )
            current, seen = now, True
    return sorted(changes, key=lambda c: c["t_s"])


def log_route_changes(events: list[dict[str, Any]], t0_ns: int) -> list[dict[str, Any]]:
    return [
        {
            "t_s": round((e["t_ns"] - t0_ns) / 1e9, 3),
            "site": e["site"],
            "peer": e["peer"],
            "previous": e["previous"],
            "current": e["current"],
            "reason": e["reason"],
            "source": "log",
        }
        for e in events
        if e["kind"] == "route"
    ]


# -- messages -----------------------------------------------------------------------------
def message_records(
    scenario: Scenario,
    t0_ns: int,
    sent: dict[str, dict[str, Any]],
    received: dict[str, dict[str, Any]],
    samples: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per scheduled message: times, latency, integrity and bytes per path."""
    rows = []
    for number, flow in enumerate(scenario.flows):
        key = flow_key(flow)
        sends = {(r["step"], r["index"]): r for r in sent.get(str(number), {}).get("records", [])}
        recvs = {
            (r["step"], r["index"]): r for r in received.get(str(number), {}).get("records", [])
        }
        spans = {
            p.name: counter_deltas(
                [
                    (t, int(row["recv_bytes"] or 0))
                    for t, row in path_rows(samples, flow.dst, flow.src, p.name, t0_ns)
                ]
            )
            for p in scenario.paths_between(flow.src, flow.dst)
        }
        for step, index, name, size, critical, at_s in flow_messages(flow):
            send = sends.get((step, index))
            recv = recvs.get((step, index))
            row: dict[str, Any] = {
                "flow": key,
                "flow_index": number,
                "step": step,
                "index": index,
                "name": name,
                "size_bytes": size,
                "critical": critical,
                "scheduled_s": at_s,
                "call_s": None,
                "accepted_s": None,
                "delivered_s": None,
                "latency_s": None,
                "send_to_deliver_s": None,
                "intact": False,
                "path_bytes": {},
            }
            if send is not None:
                row["call_s"] = round((send["call_ns"] - t0_ns) / 1e9, 6)
                row["accepted_s"] = round((send["accepted_ns"] - t0_ns) / 1e9, 6)
            if recv is not None:
                delivered = (recv["delivered_ns"] - t0_ns) / 1e9
                row["delivered_s"] = round(delivered, 6)
                row["latency_s"] = round(delivered - at_s, 6)
                row["intact"] = bool(recv["intact"]) and recv["received_bytes"] == size
                if row["call_s"] is not None:
                    row["send_to_deliver_s"] = round(delivered - row["call_s"], 6)
                    # bytes each path delivered while this message was in flight
                    # (other messages in flight at the same time count too)
                    row["path_bytes"] = {
                        p: round(bytes_between(s, row["call_s"], delivered))
                        for p, s in spans.items()
                    }
            rows.append(row)
    return rows


def latency_stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_s": None, "p95_s": None, "max_s": None, "count": 0}
    ordered = sorted(values)
    return {
        "p50_s": ordered[len(ordered) // 2],
        "p95_s": ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)],
        "max_s": ordered[-1],
        "count": len(ordered),
    }


def wangate_summary(scenario: Scenario, messages: list[dict[str, Any]]) -> dict[str, Any]:
    complete = all(m["delivered_s"] is not None for m in messages)
    per_flow = {}
    for flow in scenario.flows:
        done = [
            m["delivered_s"]
            for m in messages
            if m["flow"] == flow_key(flow) and m["delivered_s"] is not None
        ]
        per_flow[flow_key(flow)] = max(done) if done else None
    latencies = [m["latency_s"] for m in messages if m["latency_s"] is not None]
    return {
        "time_s": max(v for v in per_flow.values() if v is not None) if complete else None,
        "complete": complete,
        "flow_time_s": per_flow,
        "messages": len(messages),
        "delivered": sum(1 for m in messages if m["delivered_s"] is not None),
        "intact": sum(1 for m in messages if m["intact"]),
        "delivered_bytes": sum(m["size_bytes"] for m in messages if m["delivered_s"] is not None),
        "latency": latency_stats(latencies),
        "critical_latency": latency_stats(
            [m["latency_s"] for m in messages if m["critical"] and m["latency_s"] is not None]
        ),
        "bulk_latency": latency_stats(
            [m["latency_s"] for m in messages if not m["critical"] and m["latency_s"] is not None]
        ),
    }


# -- Markdown -----------------------------------------------------------------------------
def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def results_rows(record: dict[str, Any]) -> list[tuple[str, float | None, str]]:
    """(transfer, time or None, note) for wangate, each baseline and the bound."""
    rows: list[tuple[str, float | None, str]] = []
    wg = record["wangate"]
    rows.append(
        (
            "wangate",
            wg["time_s"],
            ""
            if wg["complete"]
            else f"{wg['delivered']} of {wg['messages']} messages in {wg['timeout_s']:.0f} s",
        )
    )
    for result in (record["baselines"] or {}).get("baselines", []):
        if result.get("error"):
            rows.append((result["name"], None, f"failed: {result['error']}"))
            continue
        note = (
            ""
            if result["time_s"] is not None
            else (
                f"{result['delivered_bytes'] / 1e6:.1f} of {result['total_bytes'] / 1e6:.1f} MB "
                f"in {record['baselines']['timeout_s']:.0f} s"
            )
        )
        rows.append((result["name"], result["time_s"], note))
    return rows


def markdown_summary(record: dict[str, Any]) -> str:
    bound = float(record["bound_s"])
    total = int(record["total_bytes"])
    wg = record["wangate"]
    lines = [
        f"# `{record['scenario']}`",
        "",
        record["description"],
        "",
        f"Run {record['run_id']} at {record['started_at']} on {record['machine']}; "
        f"gateway {record['gateway_version']}.",
        f"Reproduce: `{record['command']}`",
        "",
        f"Workload: {total / 1e6:.1f} MB in {wg['messages']} messages. Ideal bound "
        f"{bound:.2f} s ({'sum of path rates' if record['bound_is_multipath'] else 'one path'}"
        ", plus the least one-way delay).",
        "",
        "| transfer | time for workload | goodput | ratio to bound | note |",
        "|---|---|---|---|---|",
        f"| ideal bound | {bound:.2f} s | {total * 8 / bound / 1e6:.1f} Mbit/s | 1.00 | |",
    ]
    # baselines ran after the wangate run, in the same lab, one at a time
    for name, time_s, note in results_rows(record):
        if time_s is None:
            lines.append(f"| {name} | not done | | | {note} |")
        else:
            lines.append(
                f"| {name} | {time_s:.2f} s | {total * 8 / time_s / 1e6:.1f} Mbit/s | "
                f"{time_s / bound:.2f} | {note} |"
            )
    cpu = ", ".join(
        f"{site} {c['cpu_s']:.1f} s ({c['core_share']:.0%} of a core)"
        for site, c in wg.get("gateway_cpu", {}).items()
    )
    lines += [
        "",
        f"Messages intact: {wg['intact']} of {wg['messages']} "
        f"(checked bit for bit against the seeded payload).",
        "",
        f"Gateway CPU during the workload: {cpu or 'not measured'}.",
        "",
        "Latency from scheduled hand-over to delivery (ms):",
        "",
        "| messages | count | p50 | p95 | max |",
        "|---|---|---|---|---|",
    ]
    for label, key in (
        ("critical", "critical_latency"),
        ("bulk", "bulk_latency"),
        ("all", "latency"),
    ):
        stats = wg[key]
        lines.append(
            f"| {label} | {stats['count']} | {_ms(stats['p50_s'])} | "
            f"{_ms(stats['p95_s'])} | {_ms(stats['max_s'])} |"
        )
    for result in (record["baselines"] or {}).get("baselines", []):
        lines.append(
            f"| {result['name']} (all) | | {_ms(result['message_latency_p50_s'])} | | "
            f"{_ms(result['message_latency_max_s'])} |"
        )
    lines += [
        "",
        "Paths (wangate run):",
        "",
        "| direction | path | nominal | received | share | peak Mbit/s | srtt median ms "
        "| max loss | seconds as critical route |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for direction, paths in record["paths"].items():
        total_dir = sum(p["received_bytes"] for p in paths.values()) or 1
        for name, p in paths.items():
            nominal = p["nominal"]
            srtts = [v for v in p["srtt_ms"] if v is not None]
            losses = [v for v in p["loss"] if v is not None]
            critical_s = sum(1 for r in p["role"] if r == "critical")
            lines.append(
                f"| {direction} | {name} | {nominal['rate_mbps']:g} Mbit/s, "
                f"{nominal['delay_ms']:g} ms, {nominal['loss'] * 100:g} % | "
                f"{p['received_bytes'] / 1e6:.1f} MB | {p['received_bytes'] / total_dir:.0%} | "
                f"{max(p['goodput_mbps'] or [0]):.1f} | "
                f"{statistics.median(srtts) if srtts else float('nan'):.1f} | "
                f"{max(losses) if losses else 0:.3f} | {critical_s} |"
            )
    changes = [c for c in record["route_changes"] if c["source"] == "log"]
    lines += ["", f"Critical route changes (gateway logs): {len(changes)}", ""]
    for change in changes[:30]:
        lines.append(
            f"- {change['t_s']:.2f} s, {change['site']} -> {change['peer']}: "
            f"{change['previous']} -> {change['current']} ({change['reason']})"
        )
    if len(changes) > 30:
        lines.append(f"- ... {len(changes) - 30} more in run.json")
    problems = [
        e
        for e in record["gateway_logs"]
        if e["kind"] == "log" and not e["text"].startswith(("wangate ", "shutting down"))
    ]
    if problems:
        lines += ["", f"Other gateway warnings: {len(problems)} (first ones below)", ""]
        lines += [f"- {e['site']} {e['t_s']:.2f} s: {e['text']}" for e in problems[:10]]
    if record.get("budget"):
        from bench.runner.budget import budget_table

        lines += ["", "Where the link rate went (share of rate x time, `bench.runner.budget`):", ""]
        lines.append(budget_table([record]))
    lines += [
        "",
        "Plots: `goodput.png` (goodput per path per second), `latency.png` "
        "(message latency over time, route changes marked), `paths.png` (RTT and loss).",
        "",
    ]
    return "\n".join(lines)


def combined_table(records: list[dict[str, Any]]) -> str:
    """scenario x {wangate, cubic, bbr, aioquic stream, bound}: time and ratio to bound."""
    names = ("wangate", "tcp-cubic", "tcp-bbr", "aioquic-stream")
    lines = [
        "| scenario | MB | bound | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for record in records:
        bound = float(record["bound_s"])
        cells = {name: "-" for name in names}
        for name, time_s, note in results_rows(record):
            if name not in cells:
                continue
            if note.startswith("failed"):
                cells[name] = "failed"
            elif time_s is None:
                timeout = (
                    record["wangate"]["timeout_s"]
                    if name == "wangate"
                    else record["baselines"]["timeout_s"]
                )
                cells[name] = f"> {timeout:.0f} s (> {timeout / bound:.1f})"
            else:
                cells[name] = f"{time_s:.2f} s ({time_s / bound:.2f})"
        lines.append(
            f"| {record['scenario']} | {record['total_bytes'] / 1e6:.1f} | "
            f"{bound:.2f} s | " + " | ".join(cells[n] for n in names) + " |"
        )
    return "\n".join(lines)
