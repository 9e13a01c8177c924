"""Baselines on the scenario's own emulated links, in the same run: TCP cubic and TCP
BBR on the best path, one plain aioquic stream on the best path, and the ideal bound.

Each baseline replays the workload (every flow at once, each on the best path between
its sites), with the timeline restarted at the baseline's start.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS
from wangate.lab.bound import best_path, ideal_time_s, schedule
from wangate.lab.lab import Lab
from wangate.lab.scenario import load_scenario

BASE_PORT = 9100
FLOW_PORT_STEP = 16  # flow i of a baseline listens on its port + i * 16: two flows between
# the same sites share the best path and its address, so they need ports of their own
BASELINES = (
    ("tcp-cubic", "tcp", "cubic"),
    ("tcp-bbr", "tcp", "bbr"),
    ("aioquic-stream", "quic", ""),
)


@dataclass(frozen=True)
class BaselineResult:
    name: str
    time_s: float | None  # None when it did not finish in time
    delivered_bytes: int
    total_bytes: int
    message_latency_p50_s: float | None
    message_latency_max_s: float | None
    detail: dict[str, Any]
    error: str | None = None  # why the baseline failed (it is a row, not the end of the run)


def _report_line(out: bytes) -> dict[str, Any] | None:
    """The JSON object a transfer process printed last, or None if it printed none."""
    lines = out.strip().splitlines()
    if not lines:
        return None
    try:
        report = json.loads(lines[-1])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _failure(role: str, process: subprocess.Popen[bytes], err: bytes) -> str:
    last = err.decode(errors="replace").strip().splitlines()
    why = f": {last[-1]}" if last else ""
    return f"{role} exited with {process.returncode} and printed no report{why}"


def run_baseline(
    lab: Lab, name: str, proto: str, cc: str, port: int, timeout_s: float
) -> BaselineResult:
    scenario = lab.scenario
    receivers, senders, flows = [], [], scenario.flows
    ports = [port + index * FLOW_PORT_STEP for index in range(len(flows))]
    for flow, flow_port in zip(flows, ports, strict=True):
        path = best_path(scenario, flow)
        receiver = lab.run_in(
            flow.dst,
            [
                sys.executable,
                "-m",
                "bench.runner.transfer",
                "recv",
                "--proto",
                proto,
                "--bind",
                f"{path.address_of(flow.dst)}:{flow_port}",
                "--messages",
                str(len(schedule(flow))),
            ],
            stdout=subprocess.PIPE,
        )
        assert receiver.stdout is not None
        receiver.stdout.readline()  # ready
        receivers.append(receiver)
    lab.start_timeline()
    for flow, flow_port in zip(flows, ports, strict=True):
        path = best_path(scenario, flow)
        argv = [
            sys.executable,
            "-m",
            "bench.runner.transfer",
            "send",
            "--proto",
            proto,
            "--bind",
            path.address_of(flow.src),
            "--to",
            f"{path.address_of(flow.dst)}:{flow_port}",
            "--schedule",
            json.dumps(schedule(flow)),
        ]
        if cc:
            argv += ["--cc", cc]
        senders.append(lab.run_in(flow.src, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    deadline = time.monotonic() + timeout_s
    finish_times, latencies, delivered, detail = [], [], 0, {}
    errors: list[str] = []
    complete = True
    routes = [f"{flow.src}->{flow.dst}" for flow in flows]
    if len(set(routes)) < len(routes):  # several flows between the same sites
        routes = [f"{route} #{index}" for index, route in enumerate(routes)]
    for flow, sender, receiver, route in zip(flows, senders, receivers, routes, strict=True):
        try:
            out, err = sender.communicate(timeout=max(1.0, deadline - time.monotonic()))
            sent = _report_line(out) or {}
            if not sent:
                errors.append(f"{route}: {_failure('sender', sender, err)}")
        except subprocess.TimeoutExpired:
            sender.kill()
            sender.communicate()
            sent = {}
        if not sent:
            receiver.terminate()
        try:
            got = _report_line(receiver.communicate(timeout=10)[0]) or {}
        except subprocess.TimeoutExpired:
            receiver.kill()
            receiver.communicate()
            got = {}
        completed = got.get("completed", [])
        plan = schedule(flow)
        delivered += sum(size for _, size in plan[: len(completed)])
        if len(completed) < len(plan) or "started" not in sent:
            complete = False
            continue
        start = float(sent["started"])
        finish_times.append(completed[-1] - start)
        latencies += [done - (start + at) for (at, _), done in zip(plan, completed, strict=True)]
        detail[route] = {
            "path": best_path(scenario, flow).name,
            "cc": sent.get("cc"),
            "time_s": completed[-1] - start,
        }
    latencies.sort()
    return BaselineResult(
        name=name,
        time_s=max(finish_times) if complete and finish_times else None,
        delivered_bytes=delivered,
        total_bytes=sum(f.total_bytes for f in flows),
        message_latency_p50_s=latencies[len(latencies) // 2] if latencies else None,
        message_latency_max_s=latencies[-1] if latencies else None,
        detail=detail,
        error="; ".join(errors) or None,
    )


def run_baselines(lab: Lab, timeout_s: float = 120.0, only: tuple[str, ...] = ()) -> dict[str, Any]:
    scenario = lab.scenario
    if not scenario.flows:
        raise ValueError(f"scenario {scenario.name!r} has no [workload] flows")
    bound_s = max(ideal_time_s(scenario, flow) for flow in scenario.flows)
    results = []
    for offset, (name, proto, cc) in enumerate(BASELINES):
        if only and name not in only:
            continue
        try:
            result = run_baseline(lab, name, proto, cc, BASE_PORT + offset, timeout_s)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            result = BaselineResult(
                name=name,
                time_s=None,
                delivered_bytes=0,
                total_bytes=sum(f.total_bytes for f in scenario.flows),
                message_latency_p50_s=None,
                message_latency_max_s=None,
                detail={},
                error=f"{type(exc).__name__}: {exc}",
            )
        results.append(result)
    multi_path = any(len(scenario.paths_between(f.src, f.dst)) > 1 for f in scenario.flows)
    return {
        "scenario": scenario.name,
        "ideal_bound_s": bound_s,
        "ideal_is_multipath": multi_path,
        "total_bytes": sum(f.total_bytes for f in scenario.flows),
        "timeout_s": timeout_s,
        "baselines": [r.__dict__ for r in results],
        "link_stats": lab.link_stats(),
    }


def markdown_table(report: dict[str, Any]) -> str:
    bound = float(report["ideal_bound_s"])
    total_mb = report["total_bytes"] / 1e6
    lines = [
        f"Scenario `{report['scenario']}`: {total_mb:.1f} MB of workload; ideal bound "
        f"{bound:.2f} s ({'sum of path rates' if report['ideal_is_multipath'] else 'one path'}"
        ")",
        "",
        "| transfer | time for workload | goodput | ratio to bound | msg latency p50 / max |",
        "|---|---|---|---|---|",
        f"| ideal bound | {bound:.2f} s | {report['total_bytes'] * 8 / bound / 1e6:.1f} Mbit/s"
        " | 1.00 | |",
    ]
    for result in report["baselines"]:
        if result.get("error"):
            lines.append(f"| {result['name']} | failed: {result['error']} | | | |")
            continue
        if result["time_s"] is None:
            delivered = result["delivered_bytes"] / 1e6
            lines.append(
                f"| {result['name']} | not done in {report['timeout_s']:.0f} s "
                f"({delivered:.1f} MB delivered) | | > "
                f"{report['timeout_s'] / bound:.1f} | |"
            )
            continue
        time_s = float(result["time_s"])
        lines.append(
            f"| {result['name']} | {time_s:.2f} s | "
            f"{result['total_bytes'] * 8 / time_s / 1e6:.1f} Mbit/s | {time_s / bound:.2f} | "
            f"{result['message_latency_p50_s']:.3f} / {result['message_latency_max_s']:.3f} s |"
        )
    return "\n".join(lines)


def write_report(report: dict[str, Any], results_root: Path) -> Path:
    directory = results_root / str(report["scenario"])
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / "baselines.json"
    file.write_text(json.dumps(report, indent=2))
    return file


def main(argv: list[str]) -> int:
    """``python -m bench baselines SCENARIO``: the baselines alone, in the lab."""
    parser = argparse.ArgumentParser(prog="python -m bench baselines", description=__doc__)
    parser.add_argument("scenario", help="file, or name in wangate/lab/scenarios/")
    parser.add_argument("--run-id")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--only", action="append", help="tcp-cubic, tcp-bbr or aioquic-stream")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    with Lab(load_scenario(args.scenario), run_id=args.run_id) as lab:
        report = run_baselines(lab, timeout_s=args.timeout_s, only=tuple(args.only or ()))
    report["forwarders_final"] = lab.final_stats
    file = write_report(report, Path(args.results))
    print(markdown_table(report))
    print(f"\nwritten to {file}")
    return 0
