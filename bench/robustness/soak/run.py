"""One soak run: the lab, a tree's daemons, warm-up, the faults, the drain, the verdict.

Phases: warm-up (traffic, no faults), quiesce (senders stop and resolve what is open;
each daemon's RSS "after warm-up"), faults (``seconds``, the schedule: link faults on
the lab's timeline, process faults from this thread), drain (senders stop and resolve
what is open, for at most ``drain_s``; receivers go on until nothing came for a
while), each daemon's RSS "at the end", the daemons' own status, the checker.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import wangate
from bench.robustness.soak import checker, plan, schedule
from bench.robustness.soak.inject import Daemons
from bench.robustness.soak.trainers import Book, Control, Receiver, Sender
from bench.runner.gateways import start_gateways, stop_gateways
from bench.tree import Tree, version
from wangate.errors import WangateError
from wangate.lab.lab import Lab
from wangate.lab.scenario import parse_scenario

QUIET_S = 3.0  # receivers stop once nothing came for this long after the senders' drain


@dataclass(frozen=True)
class Options:
    seed: int = 1
    seconds: float = 180.0
    warmup_s: float = 15.0
    drain_s: float = 60.0
    sites: int = 3
    paths: int = 2
    workers: int = 1
    rate_mbps: float = 8.0  # offered per flow
    link_mbps: float = 20.0

    @property
    def topology(self) -> plan.Topology:
        return plan.Topology(self.sites, self.paths, self.link_mbps)

    def faults(self) -> list[schedule.Fault]:
        return schedule.draw_schedule(self.seed, self.seconds, self.topology, self.workers)


def gateway_config(workers: int) -> str:
    return f"[workers]\ncount = {workers}\n"


def _statuses(lab: Lab, sites: tuple[str, ...]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for site in sites:
        try:
            with wangate.Client(lab.gateway_socket(site), timeout=5.0) as gw:
                status = gw.status()
            found[site] = {
                peer: {
                    k: v.get(k)
                    for k in ("state", "messages_sent", "messages_received", "messages_held")
                }
                | {"recent_failures": len(v.get("recent_failures") or [])}
                for peer, v in status.get("peers", {}).items()
            }
        except WangateError as exc:
            found[site] = {"error": str(exc)}
    return found


def _quiesce(senders: list[Sender], control: Control, timeout_s: float) -> float:
    control.set("pause")
    started = time.monotonic()
    for sender in senders:
        sender.idle.wait(max(0.0, started + timeout_s - time.monotonic()))
    return time.monotonic() - started


def _do(fault: schedule.Fault, daemons: Daemons) -> dict[str, Any]:
    """Carry out one process fault; what happened."""
    done: dict[str, Any] = {}
    site = fault.target.split("/")[0]
    try:
        if fault.kind == "stop":
            daemons.stop(site, fault.duration_s)
        elif fault.kind == "kill":
            daemons.kill(site)
            time.sleep(fault.duration_s)
            done["up_after_restart_s"] = round(daemons.restart(site), 2)
        elif fault.kind == "kill_worker":
            index = int(fault.target.split("/w")[1])
            done["pid"] = daemons.kill_worker(site, index)
    except (WangateError, OSError) as exc:
        done["error"] = f"{type(exc).__name__}: {exc}"
    return done


def run_soak(
    opts: Options, tree: Tree, out_dir: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    topology = opts.topology
    faults = opts.faults()
    data = topology.scenario_data(
        opts.seed, opts.seconds, schedule.timeline(faults, topology), gateway_config(opts.workers)
    )
    scenario = parse_scenario(data, "soak")
    logs_dir = out_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    for old in logs_dir.glob("*"):
        old.unlink()
    book, control = Book(), Control()
    record: dict[str, Any] = {
        "started_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "tree": tree.label,
        "gateway_version": version(tree),
        "options": asdict(opts),
        "schedule": [f.as_dict() for f in faults],
    }
    done_faults: list[dict[str, Any]] = []
    with Lab(scenario) as lab:
        configs = lab.write_gateway_configs()
        processes, logs = start_gateways(lab, configs, logs_dir, tree=tree)
        daemons = Daemons(lab, configs, processes, logs, tree)
        say(
            f"lab {lab.run_id}: {len(topology.site_names)} sites, {len(scenario.paths)} paths, "
            f"daemons of {tree.label} up"
        )
        senders = [
            Sender(s, d, lab.gateway_socket(s), opts.seed, opts.rate_mbps, book, control)
            for s, d in topology.flows()
        ]
        receivers = [
            Receiver(s, d, lab.gateway_socket(d), opts.seed, book, control)
            for s, d in topology.flows()
        ]
        try:
            for thread in [*receivers, *senders]:
                thread.start()
            time.sleep(opts.warmup_s)
            record["quiesce_s"] = round(_quiesce(senders, control, opts.drain_s), 2)
            time.sleep(1.0)
            rss_start = {site: daemons.rss(site) for site in topology.site_names}
            warm = len(book.sent)
            say(f"warm-up: {warm} messages; RSS {_rss_text(rss_start)}; {len(faults)} faults next")
            t0 = lab.start_timeline()
            control.set("run")
            for fault in faults:
                if fault.kind in schedule.LINK_KINDS:
                    done_faults.append({**fault.as_dict(), "done_at_s": fault.at_s})
                    continue
                time.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
                at = round(time.monotonic() - t0, 2)
                what = _do(fault, daemons)
                done_faults.append({**fault.as_dict(), "done_at_s": at, **what})
                say(f"  {fault.describe()} (at {at:.2f} s){_extra(what)}")
            time.sleep(max(0.0, t0 + opts.seconds - time.monotonic()))
            drain_started = time.monotonic()
            control.set("drain", drain_started + opts.drain_s)
            for sender in senders:
                sender.join(max(0.0, drain_started + opts.drain_s + 5 - time.monotonic()))
            record["drain_s"] = round(time.monotonic() - drain_started, 2)
            quiet_by = time.monotonic() + opts.drain_s
            while time.monotonic() - book.last_take < QUIET_S and time.monotonic() < quiet_by:
                time.sleep(0.2)
        finally:
            control.receivers_stop.set()
            control.set("drain", 0.0)
            for thread in [*senders, *receivers]:
                thread.join(10.0)
        time.sleep(1.0)
        rss_end = {site: daemons.rss(site) for site in topology.site_names}
        record["gateway_status"] = _statuses(lab, topology.site_names)
        record["restarts"] = dict(daemons.restarts)
        exited = {s: p.returncode for s, p in daemons.processes.items() if p.poll() is not None}
        record["link_stats"] = {
            name: {d: stats[d] for d in ("a_to_b", "b_to_a")}
            for name, stats in lab.link_stats().items()
        }
        stop_gateways(daemons.processes)
    record["faults"] = done_faults
    record["warmup_messages"] = warm
    verdict = checker.check(list(book.sent.values()), book.takes)
    rss = {
        site: {
            "start_mib": round(rss_start[site]["daemon_mib"] + rss_start[site]["workers_mib"], 1),
            "end_mib": round(rss_end[site]["daemon_mib"] + rss_end[site]["workers_mib"], 1),
            "start": rss_start[site],
            "end": rss_end[site],
            "restarted": daemons.restarts[site],
        }
        for site in topology.site_names
    }
    violations = verdict.violations + checker.rss_violations(rss)
    violations += [{"class": "trainer", "detail": e} for e in book.errors]
    violations += [
        {"class": "daemon", "site": site, "detail": f"exited with {code} by itself"}
        for site, code in exited.items()
    ]
    violations += [
        {"class": "fault", "detail": f"{f['kind']} {f['target']}: {f['error']}"}
        for f in done_faults
        if f.get("error")
    ]
    record.update(
        verdict=verdict.as_dict(),
        rss=rss,
        recv_errors=dict(book.recv_errors),
        violations=violations,
        ok=not violations,
    )
    with contextlib.suppress(OSError):
        record["log_lines"] = _log_lines(logs_dir, violations)
    return record


def _rss_text(rss: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{s} {v['daemon_mib'] + v['workers_mib']:.1f} MiB" for s, v in rss.items())


def _extra(what: dict[str, Any]) -> str:
    return "".join(f"; {k} {v}" for k, v in what.items())


def _log_lines(logs_dir: Path, violations: list[dict[str, Any]], limit: int = 40) -> list[str]:
    """Warnings and errors from the daemons' logs when something was violated."""
    if not violations:
        return []
    lines: list[str] = []
    for log in sorted(logs_dir.glob("gateway-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if any(word in line for word in ("ERROR", "Traceback", "CRITICAL")):
                lines.append(f"{log.stem}: {line}")
    return lines[-limit:]
