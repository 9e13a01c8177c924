"""One scenario end to end: lab, real gateways, timed trainers, baselines, record, plots.

Order inside one lab (the very same emulated links): the gateways start and connect
every path; trainers start (receivers in the destination sites, senders in the
sources) and report ready; the timeline starts at ``t0`` and the senders follow the
workload's schedule from ``t0``; when every message has arrived (or the timeout
passed) the gateways stop and the baselines (TCP cubic, TCP BBR, one aioquic stream,
each on the best path) run one after the other, each with the timeline restarted.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import wangate
from bench.common import RESULTS
from bench.runner import record as rec
from bench.runner.baselines import BASELINES, run_baselines
from bench.runner.budget import loss_budget
from bench.runner.gateways import process_cpu_s, start_gateways, stop_gateways
from bench.runner.monitor import PathMonitor, read_log_events, wall_to_monotonic_offset_ns
from bench.tree import THIS, Tree, version
from wangate.config import MIN_MTU
from wangate.errors import ConfigError, WangateError
from wangate.lab.bound import ideal_time_s
from wangate.lab.lab import Lab
from wangate.lab.scenario import Scenario

BASELINE_NAMES = tuple(name for name, _, _ in BASELINES)


def default_timeout_s(bound_s: float) -> float:
    """How long wangate gets for the workload: generous, but a run stays under 2 minutes."""
    return min(60.0, max(20.0, 4.0 * bound_s + 10.0))


def default_baseline_timeout_s(bound_s: float) -> float:
    return min(30.0, max(20.0, 2.5 * bound_s))


def machine_description() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import aioquic

    return (
        f"{model}, {os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}, aioquic {aioquic.__version__}"
    )


def check_scenario(scenario: Scenario) -> None:
    if not scenario.flows:
        raise ConfigError(f"scenario {scenario.name!r} has no [workload] flows to run")
    for path in scenario.paths:
        if path.mtu < MIN_MTU:
            raise ConfigError(
                f"scenario {scenario.name!r}: path {path.name!r} has mtu "
                f"{path.mtu}; wangate needs at least {MIN_MTU} (QUIC's 1200-byte "
                "datagrams): raise it in the scenario file"
            )


class _Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.started:6.1f} s] {text}", flush=True)


def _read_json_line(process: subprocess.Popen[bytes], what: str) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise WangateError(f"{what} exited before reporting (status {process.wait()})")
    result: dict[str, Any] = json.loads(line)
    return result


def _finish(
    process: subprocess.Popen[bytes], deadline: float, stop: bytes | None, what: str
) -> dict[str, Any]:
    """The trainer's final JSON line; after ``deadline`` it is told to stop (or killed)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=max(0.1, deadline - time.monotonic()))
    try:
        out, _ = process.communicate(input=stop, timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    lines = out.decode(errors="replace").strip().splitlines()
    if not lines:
        return {"records": [], "error": f"{what} produced no result (status {process.returncode})"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _stats_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    diff: dict[str, Any] = {}
    for path, stats in after.items():
        entry: dict[str, Any] = {}
        for direction in ("a_to_b", "b_to_a"):
            start = before.get(path, {}).get(direction, {})
            entry[direction] = {k: v - start.get(k, 0) for k, v in stats[direction].items()}
        entry["cpu_s"] = round(stats["cpu_s"] - before.get(path, {}).get("cpu_s", 0.0), 3)
        diff[path] = entry
    return diff


def run_scenario(
    scenario: Scenario,
    results_root: Path = RESULTS,
    *,
    baselines: tuple[str, ...] = BASELINE_NAMES,
    timeout_s: float | None = None,
    baseline_timeout_s: float | None = None,
    run_id: str | None = None,
    plots: bool = True,
    quiet: bool = False,
    command: str | None = None,
    tree: Tree = THIS,
) -> dict[str, Any]:
    """Run ``scenario`` with the gateways of ``tree``; write ``results_root/<name>/`` and
    return the record."""
    check_scenario(scenario)
    say = _Progress(quiet)
    bound_s = max(ideal_time_s(scenario, flow) for flow in scenario.flows)
    timeout_s = timeout_s or default_timeout_s(bound_s)
    baseline_timeout_s = baseline_timeout_s or default_baseline_timeout_s(bound_s)
    out_dir = results_root / scenario.name
    logs_dir = out_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    for old in logs_dir.glob("*"):
        old.unlink()
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    offset_ns = wall_to_monotonic_offset_ns()
    sent: dict[str, dict[str, Any]] = {}
    received: dict[str, dict[str, Any]] = {}
    gateway_status: dict[str, Any] = {}
    gateway_paths: dict[str, Any] = {}
    with Lab(scenario, run_id=run_id) as lab:
        say(f"{scenario.name}: lab {lab.run_id} up ({len(scenario.paths)} paths)")
        gateways, logs = start_gateways(lab, lab.write_gateway_configs(), logs_dir, tree=tree)
        say(f"gateways of {tree.label} up, every path connected")

        trainers: list[tuple[str, str, subprocess.Popen[bytes], IO[bytes]]] = []
        try:
            for flow_index, flow in enumerate(scenario.flows):
                schedule = rec.flow_messages(flow)
                for role, site in (("recv", flow.dst), ("send", flow.src)):
                    spec = {
                        "role": role,
                        "socket": str(lab.gateway_socket(site)),
                        "src": flow.src,
                        "dst": flow.dst,
                        "flow": flow_index,
                        "seed": scenario.seed,
                        "timeout_s": timeout_s,
                        "messages": schedule,
                    }
                    err: IO[bytes] = (logs_dir / f"trainer-{flow_index}-{role}.log").open("wb")
                    process = lab.run_in(
                        site,
                        [sys.executable, "-m", "bench.runner.trainer", json.dumps(spec)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                    )
                    trainers.append((str(flow_index), role, process, err))
            for number, role, process, _ in trainers:
                _read_json_line(process, f"trainer {number} ({role})")  # ready
            say(f"{len(trainers)} trainers ready")

            monitor = PathMonitor({site: lab.gateway_socket(site) for site in scenario.sites})
            monitor.start()
            time.sleep(0.3)
            links_before = lab.link_stats()
            cpu_before = {site: process_cpu_s(p.pid) for site, p in gateways.items()}
            load_before = os.getloadavg()
            t0_ns = time.monotonic_ns()
            lab.start_timeline(t0_ns / 1e9)
            for _, role, process, _ in trainers:
                if role == "send":
                    assert process.stdin is not None
                    process.stdin.write(f"go {t0_ns}\n".encode())
                    process.stdin.flush()
            say(f"timeline started; running the workload (timeout {timeout_s:.0f} s)")
            deadline = t0_ns / 1e9 + timeout_s
            for number, role, process, _ in trainers:
                if role == "send":
                    sent[number] = _finish(process, deadline, None, f"sender {number}")
            for number, role, process, _ in trainers:
                if role == "recv":
                    received[number] = _finish(process, deadline, b"stop\n", f"receiver {number}")
            finished_ns = time.monotonic_ns()
            cpu_after = {site: process_cpu_s(p.pid) for site, p in gateways.items()}
            load_after = os.getloadavg()
            time.sleep(0.5)
            monitor.stop()
            links_after = lab.link_stats()
        finally:
            for _, _, process, err in trainers:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                err.close()
        say("workload done")
        for site in scenario.sites:
            try:
                with wangate.Client(lab.gateway_socket(site)) as gw:
                    gateway_status[site] = gw.status()
                    gateway_paths[site] = gw.paths()
            except WangateError as exc:
                gateway_status[site] = {"error": str(exc)}
        stop_gateways(gateways)
        baseline_report: dict[str, Any] | None = None
        if baselines:
            say(f"baselines {', '.join(baselines)} (timeout {baseline_timeout_s:.0f} s each)")
            baseline_report = run_baselines(
                lab, timeout_s=baseline_timeout_s, only=tuple(baselines)
            )
    say("lab down")

    log_events = []
    for site, log_file in logs.items():
        log_events += read_log_events(log_file, site, offset_ns)
    log_events.sort(key=lambda e: e["t_ns"])
    messages = rec.message_records(scenario, t0_ns, sent, received, monitor.samples)
    summary = rec.wangate_summary(scenario, messages)
    summary["timeout_s"] = timeout_s
    summary["trainer_errors"] = {
        f"{kind} {n}": r["error"]
        for kind, results in (("sender", sent), ("receiver", received))
        for n, r in results.items()
        if r.get("error")
    }
    summary["trainer_cpu_s"] = {
        f"{kind} {n}": r.get("cpu_s")
        for kind, results in (("sender", sent), ("receiver", received))
        for n, r in results.items()
    }
    summary["gateway_status"] = gateway_status
    summary["gateway_paths"] = gateway_paths
    # CPU the daemons used from t0 until the trainers finished, as a share of one core
    wall_s = (finished_ns - t0_ns) / 1e9
    summary["gateway_cpu"] = {
        site: {"cpu_s": round(after - before, 2), "core_share": round((after - before) / wall_s, 3)}
        for site in gateways
        if (before := cpu_before[site]) is not None and (after := cpu_after[site]) is not None
    }
    # the machine's 1-minute load average as the workload started and ended: on a shared
    # machine the gateways' share of the CPU sets their pace
    summary["load_average"] = [round(load_before[0], 2), round(load_after[0], 2)]
    summary["monitor_errors"] = monitor.errors[:10]
    end_s = max([m["delivered_s"] or 0.0 for m in messages] + [0.0]) + 1.0
    if not summary["complete"]:
        end_s = max(end_s, timeout_s)
    record: dict[str, Any] = {
        "scenario": scenario.name,
        "description": scenario.description,
        "machine": machine_description(),
        "command": command or f"python -m bench run {scenario.name}",
        "run_id": lab.run_id,
        "gateway_version": version(tree),
        "started_at": started_at,
        "bound_s": bound_s,
        "bound_is_multipath": any(
            len(scenario.paths_between(f.src, f.dst)) > 1 for f in scenario.flows
        ),
        "total_bytes": sum(f.total_bytes for f in scenario.flows),
        "wangate": summary,
        "messages": messages,
        "paths": rec.path_series(scenario, monitor.samples, t0_ns, end_s),
        "route_changes": sorted(
            rec.log_route_changes(log_events, t0_ns)
            + rec.role_changes(scenario, monitor.samples, t0_ns),
            key=lambda c: c["t_s"],
        ),
        "timeline": [
            {"at_s": e.at_s, "path": e.path, "direction": e.direction, "set": e.changes}
            for e in scenario.timeline
        ],
        "baselines": baseline_report,
        "baselines_order": "after the wangate run, in the same lab, one at a time",
        "link_stats": {
            "wangate_run": _stats_diff(links_before, links_after),
            "forwarders_final": lab.final_stats,
        },
        "gateway_logs": [
            {
                "t_s": round((e["t_ns"] - t0_ns) / 1e9, 3),
                **{k: v for k, v in e.items() if k != "t_ns"},
            }
            for e in log_events
        ],
        "samples": [
            {"t_s": round((s["t_ns"] - t0_ns) / 1e9, 3), "site": s["site"], "rows": s["rows"]}
            for s in monitor.samples
        ],
    }
    record["budget"] = loss_budget(record, scenario)
    (out_dir / "run.json").write_text(json.dumps(record, indent=1))
    (out_dir / "summary.md").write_text(rec.markdown_summary(record))
    if plots:
        from bench.runner.plots import write_plots

        written = write_plots(record, out_dir)
        if not written:
            say(
                "plots skipped: matplotlib is not installed "
                "(.venv/bin/pip install matplotlib, or pip install -e '.[bench]')"
            )
    say(f"written {out_dir}/run.json, summary.md")
    return record
