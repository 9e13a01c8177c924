"""Critical latency and failover: a 64 KiB critical message every 50 ms beside bulk.

    python -m bench suite critical       # critical_bulk, critical_nobulk, critical_jitter, *_w2
    python -m bench suite failover       # failover_degrade, failover_blackhole

Each scenario runs through the runner without baselines, then its lab floor is measured
(``bench.critical_floor``: the same bytes as raw UDP on the best path, no gateway). The
table reads the records on disk: critical send->deliver p50 / p99 / max against the aim
(best path's one-way delay + 2 x jitter + 10 ms), the floor, losses, and the critical
route: when a path degrades or blackholes (failover), whether and how fast the route
leaves it; under jitter, how often it switches.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

from bench.suite.common import RESULTS, fmt, load_record, met, ms, quantile

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
    from bench.lab.scenario import load_scenario

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
