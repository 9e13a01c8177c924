"""Jobs in the WAN lab: weighted sharing, critical beside bulk, a stuck job, placement.

    python -m bench jobs                      # all four, ~7 min; needs root, /dev/net/tun
    python -m bench jobs --only share,stuck   # some of them (share critical stuck placement)
    python -m bench jobs --report-only        # the table from results/jobs/*.json

Two sites, bj -> sh. Trainers are ``bench.jobs.worker`` processes inside the site
namespaces, one thread and one ``wangate.Client(job=...)`` per job; every comparison is
made in one lab and one gateway run, its sides alternating (each two or three times,
after one unmeasured warm-up phase), and every rate is taken over a common window that
leaves each phase's start-up out. bj's ``late_timers`` (its event loop woke late: the
shared cores were taken) and the gateways' CPU are recorded for every phase.

``jobs_one_path`` (one path, 50 Mbit/s, 10 ms one-way; [jobs] a, b, crit, bulk, live,
stuck; a 32 MiB peer window, so each job's default cap is 16 MiB):

1. **share**: jobs a (weight 3) and b (weight 1) each keep 8 x 1 MiB messages not yet
   taken at sh (``Client.wait`` on the oldest), the receivers read everything; a's
   delivered bytes over b's in the window (aim 3 +- 15 %). Alternately a alone the
   same way: (a + b) together over a alone (aim >= 0.95).
2. **critical**: job crit sends a 64 KiB critical message every 50 ms (the send time is
   in its first bytes; one monotonic clock for every namespace); alternately alone and
   beside job bulk saturating the path; p50 / p99 send -> received at sh, and the p99
   with bulk over the p99 alone.
3. **stuck**: job stuck hands over 24 x 1 MiB that its receiver never takes (it is
   connected and reads nothing) while job live saturates the path as in 1; live's
   goodput after stuck has filled its cap, over live alone (aim >= 0.9), and stuck's
   ``held_bytes`` at sh (from bj's ``status()["jobs"]``) against its cap. Then stuck's
   messages are read and the pair runs again.

``jobs_three_paths`` (three paths of 20 Mbit/s, 10 ms; jobs x, y, z of equal weight):

4. **placement**: each job hands over 24 x 1 MiB at once; each job's completion time
   (hand-over to its last message received) and the total, with ``placement = "share"``
   and ``"spread"``: a gateway run each, alternately, three times (the bench rewrites the
   placement line of the written configs). Then the same on ``jobs_three_paths_uneven``
   (30/15/15 Mbit/s, the same sum), twice each: what spread costs when paths differ.

Results: ``results/jobs/{share,critical,stuck,placement,placement_uneven}.json``; the
table is printed and written to ``results/jobs/table.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import wangate
from bench.common import RESULTS, fmt, met, quantile
from bench.runner.gateways import process_cpu_s, start_gateways, stop_gateways
from bench.tree import THIS, Tree, version
from bench.tree import add_argument as add_tree_argument
from bench.tree import trees as chosen_trees
from wangate.lab.lab import Lab
from wangate.lab.scenario import load_scenario

ONE_PATH = "jobs_one_path"
THREE_PATHS = "jobs_three_paths"
UNEVEN = "jobs_three_paths_uneven"
MEASUREMENTS = ("share", "critical", "stuck", "placement")
OUT = RESULTS / "jobs"
MIB = 1 << 20

REPEATS = 2  # each side of every comparison, alternately
SHARE_REPEATS = 3
WARM_UP_S = 4.0  # one unmeasured bulk phase first: the paths' controllers ramp up
WINDOW = 8  # 1 MiB messages a bulk job has not yet had taken at the peer
SHARE_S, SHARE_WARM_S = 14.0, 3.0
CRIT_S, CRIT_WARM_S = 10.0, 2.0
CRIT_INTERVAL_S, CRIT_BYTES = 0.05, 64 * 1024
LIVE_S, STUCK_S, STUCK_WARM_S = 10.0, 16.0, 2.0
STUCK_MESSAGES = 24  # 1 MiB each: its cap (16 MiB) held at sh, the rest waiting at bj
PLACEMENT_MESSAGES = 24  # 1 MiB each, per job
PLACEMENTS = {THREE_PATHS: "placement", UNEVEN: "placement_uneven"}  # scenario -> record
PLACEMENT_REPEATS = {THREE_PATHS: 3, UNEVEN: 2}
POLL_S = 0.5
SENDERS = ("bulk", "critical", "burst", "flood")
STOP_GRACE_S = 1.0
AIM_RATIO, AIM_RATIO_TOL = 3.0, 0.15
AIM_TOTAL, AIM_LIVE = 0.95, 0.9


# ---------------------------------------------------------------- the lab side


class Trainers:
    """A worker process per site (``bench.jobs.worker``) and the gateways' status."""

    def __init__(self, lab: Lab, sites: tuple[str, ...] = ("bj", "sh")) -> None:
        self.lab = lab
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        for site in sites:
            worker = lab.run_in(
                site,
                [
                    sys.executable,
                    "-m",
                    "bench.jobs.worker",
                    str(lab.gateway_socket(site)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert worker.stdout is not None
            if not worker.stdout.readline():
                raise RuntimeError(f"jobs worker in {site} exited")
            self.workers[site] = worker
        self.gateways: dict[str, subprocess.Popen[bytes]] = {}

    def close(self) -> None:
        for worker in self.workers.values():
            if worker.stdin is not None:
                worker.stdin.close()
        for worker in self.workers.values():
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()

    def phase(
        self,
        roles: dict[str, list[dict[str, Any]]],
        duration_s: float,
        watch: tuple[str, ...] = (),
        lead_s: float = 0.5,
    ) -> dict[str, Any]:
        """Run ``roles`` (site -> worker roles) from now + ``lead_s`` for ``duration_s``;
        bj's per-job status of ``watch`` and the link counters are sampled meanwhile."""
        t0 = time.monotonic() + lead_s
        end = t0 + duration_s
        replies: dict[str, Any] = {}

        def ask(site: str, spec: dict[str, Any]) -> None:
            worker = self.workers[site]
            assert worker.stdout is not None
            self._tell(site, json.dumps(spec))
            line = worker.stdout.readline()
            replies[site] = json.loads(line) if line else {"roles": [], "error": "exited"}

        threads = {
            site: threading.Thread(target=ask, args=(site, {"t0": t0, "end": end, "roles": r}))
            for site, r in roles.items()
        }
        for thread in threads.values():
            thread.start()
        # receivers stop once every sender is done (each bulk message taken) and a moment
        # more for what critical senders sent last; phases without senders end by count
        senders = [site for site, r in roles.items() if any(x["role"] in SENDERS for x in r)]
        stop_at: float | None = None
        samples = []
        while any(thread.is_alive() for thread in threads.values()):
            samples.append(self.sample(watch))
            now = time.monotonic()
            if senders and stop_at is None and not any(threads[s].is_alive() for s in senders):
                stop_at = max(now, end) + STOP_GRACE_S
            if stop_at is not None and now >= stop_at:
                for site in threads:
                    if site not in senders:
                        self._tell(site, "stop")
                stop_at = float("inf")
            for thread in threads.values():
                thread.join(timeout=POLL_S / len(threads))
        samples.append(self.sample(watch))
        errors = [
            r["error"] for reply in replies.values() for r in reply["roles"] if r.get("error")
        ]
        return {"t0": t0, "end": end, "sites": replies, "samples": samples, "errors": errors}

    def _tell(self, site: str, line: str) -> None:
        stdin = self.workers[site].stdin
        assert stdin is not None
        stdin.write((line + "\n").encode())
        stdin.flush()

    def sample(self, watch: tuple[str, ...]) -> dict[str, Any]:
        """bj's status of the jobs in ``watch`` towards sh, the link's delivered bytes
        bj -> sh, the gateways' CPU seconds."""
        t = time.monotonic()
        jobs: dict[str, Any] = {}
        late = None
        if watch:
            try:
                with wangate.Client(self.lab.gateway_socket("bj")) as gw:
                    status = gw.status()
                jobs = {job: status["jobs"][job]["peers"]["sh"] for job in watch}
                late = status["peers"]["sh"].get("late_timers", 0)
            except (wangate.WangateError, OSError, KeyError) as exc:
                jobs = {"error": repr(exc)}
        stats = self.lab.link_stats()
        link = {name: int(s["a_to_b"]["delivered_bytes"]) for name, s in stats.items()}
        cpu = {site: process_cpu_s(p.pid) for site, p in self.gateways.items()}
        cpu |= {f"link {name}": s["cpu_s"] for name, s in stats.items()}
        return {"t": t, "jobs": jobs, "link": link, "cpu": cpu, "late_timers": late}


def _role(site: str, **role: Any) -> dict[str, Any]:
    return role | ({"peer": "sh"} if site == "bj" else {"source": "bj"})


def bulk(job: str, tag: str) -> dict[str, list[dict[str, Any]]]:
    return {
        "bj": [_role("bj", role="bulk", job=job, tag=tag, window=WINDOW, size=MIB)],
        "sh": [_role("sh", role="recv", job=job, tag=tag)],
    }


def merge(*parts: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    merged: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        for site, roles in part.items():
            merged.setdefault(site, []).extend(roles)
    return merged


# ---------------------------------------------------------------- reading a phase


def received(phase: dict[str, Any], job: str) -> list[list[float]]:
    for role in phase["sites"].get("sh", {}).get("roles", []):
        if role["job"] == job and role["role"] == "recv":
            return list(role["events"])
    return []


def bytes_in(events: list[list[float]], start: float, end: float) -> float:
    """Bytes of messages received in ``[start, end]``, each message's bytes spread
    evenly since the message before it (one message is 1 MiB: a step function would
    quantise a 10 s window of 25 Mbit/s by 3 %)."""
    if not events:
        return 0.0
    times = np.array([e[0] for e in events])
    total = np.cumsum([e[1] for e in events])
    # a cumulative counter through (t_i, total_i), starting from 0 one message earlier
    first = times[0] - (times[1] - times[0] if len(times) > 1 else 0.0)
    times = np.concatenate([[first], times])
    total = np.concatenate([[0.0], total])
    return float(np.interp(end, times, total) - np.interp(start, times, total))


def mbps(events: list[list[float]], start: float, end: float) -> float:
    return bytes_in(events, start, end) * 8 / (end - start) / 1e6


def per_second(events: list[list[float]], t0: float, end: float) -> list[float]:
    return [round(mbps(events, t0 + k, t0 + k + 1), 1) for k in range(int(end - t0))]


def link_mbps(phase: dict[str, Any], start: float, end: float) -> float | None:
    """The emulated link's delivered IP rate bj -> sh in ``[start, end]`` (samples)."""
    inside = [s for s in phase["samples"] if start <= s["t"] <= end]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    return (sum(b["link"].values()) - sum(a["link"].values())) * 8 / (b["t"] - a["t"]) / 1e6


def late_timers(phase: dict[str, Any]) -> int | None:
    """bj's ``late_timers`` over the phase: its event loop woke late (the CPU was
    taken, on these shared cores)."""
    counts = [s["late_timers"] for s in phase["samples"] if s.get("late_timers") is not None]
    return counts[-1] - counts[0] if counts else None


def cpu_share(phase: dict[str, Any]) -> dict[str, float | None]:
    """Each gateway's CPU over the phase as a share of one core."""
    a, b = phase["samples"][0], phase["samples"][-1]
    span = b["t"] - a["t"]
    return {
        site: None
        if a["cpu"].get(site) is None or b["cpu"].get(site) is None or span <= 0
        else round((b["cpu"][site] - a["cpu"][site]) / span, 3)
        for site in b["cpu"]
    }


def latencies(phase: dict[str, Any], job: str, start: float, end: float) -> list[float]:
    """Send -> received (s) of ``job``'s messages sent in ``[start, end]``."""
    return sorted(e[0] - e[3] for e in received(phase, job) if start <= e[3] <= end)


def sent_count(phase: dict[str, Any], job: str, start: float, end: float) -> int:
    for role in phase["sites"].get("bj", {}).get("roles", []):
        if role["job"] == job:
            return sum(1 for e in role["events"] if start <= e[0] <= end)
    return 0


def _slim(phase: dict[str, Any]) -> dict[str, Any]:
    """A phase for the record: no per-message events, the samples kept."""
    return {
        "t0": phase["t0"],
        "end": phase["end"],
        "errors": phase["errors"],
        "cpu_share": cpu_share(phase),
        "late_timers": late_timers(phase),
        "samples": phase["samples"],
    }


# ---------------------------------------------------------------- the measurements


def measure_share(trainers: Trainers) -> dict[str, Any]:
    runs = []
    for rep in range(SHARE_REPEATS):
        for kind in ("together", "alone"):
            tag = f"share{rep}{kind[0]}"
            roles = merge(bulk("a", tag), bulk("b", tag)) if kind == "together" else bulk("a", tag)
            phase = trainers.phase(roles, SHARE_S, watch=("a", "b"))
            start, end = phase["t0"] + SHARE_WARM_S, phase["end"]
            a, b = received(phase, "a"), received(phase, "b")
            runs.append(
                {
                    "kind": kind,
                    "rep": rep,
                    "window_s": [SHARE_WARM_S, SHARE_S],
                    "a_mbps": mbps(a, start, end),
                    "b_mbps": mbps(b, start, end) if kind == "together" else None,
                    "link_mbps": link_mbps(phase, start, end),
                    "a_per_second_mbps": per_second(a, phase["t0"], end),
                    "b_per_second_mbps": per_second(b, phase["t0"], end),
                    "a_messages": len(a),
                    "b_messages": len(b),
                    "phase": _slim(phase),
                }
            )
            print(_share_line(runs[-1]), flush=True)
    together = [r for r in runs if r["kind"] == "together"]
    alone = [r for r in runs if r["kind"] == "alone"]
    a_sum, b_sum = sum(r["a_mbps"] for r in together), sum(r["b_mbps"] for r in together)
    alone_mean = sum(r["a_mbps"] for r in alone) / len(alone)
    together_total = (a_sum + b_sum) / len(together)
    return {
        "runs": runs,
        "ratio": a_sum / b_sum if b_sum else None,
        "ratios": [r["a_mbps"] / r["b_mbps"] if r["b_mbps"] else None for r in together],
        # each together phase over the alone phase right after it
        "total_over_alone_pairs": [
            (t["a_mbps"] + t["b_mbps"]) / a["a_mbps"] if a["a_mbps"] else None
            for t, a in zip(together, alone, strict=True)
        ],
        "together_mbps": together_total,
        "alone_mbps": alone_mean,
        "total_over_alone": together_total / alone_mean if alone_mean else None,
    }


def _share_line(run: dict[str, Any]) -> str:
    b = f", b {run['b_mbps']:.1f}" if run["b_mbps"] is not None else ""
    return (
        f"share {run['kind']} #{run['rep']}: a {run['a_mbps']:.1f}{b} Mbit/s "
        f"(link {fmt(run['link_mbps'], '.1f')}); errors {run['phase']['errors']}"
    )


def measure_critical(trainers: Trainers) -> dict[str, Any]:
    runs = []
    for rep in range(REPEATS):
        for kind in ("alone", "with_bulk"):
            tag = f"crit{rep}{kind[0]}"
            crit = {
                "bj": [
                    _role(
                        "bj",
                        role="critical",
                        job="crit",
                        tag=tag,
                        size=CRIT_BYTES,
                        interval_s=CRIT_INTERVAL_S,
                    )
                ],
                "sh": [_role("sh", role="recv", job="crit", tag=tag)],
            }
            roles = merge(crit, bulk("bulk", tag)) if kind == "with_bulk" else crit
            phase = trainers.phase(roles, CRIT_S, watch=("crit", "bulk"))
            start, end = phase["t0"] + CRIT_WARM_S, phase["end"]
            times = latencies(phase, "crit", start, end)
            runs.append(
                {
                    "kind": kind,
                    "rep": rep,
                    "window_s": [CRIT_WARM_S, CRIT_S],
                    "sent": sent_count(phase, "crit", start, end),
                    "latencies_s": times,
                    "bulk_mbps": mbps(received(phase, "bulk"), start, end),
                    "link_mbps": link_mbps(phase, start, end),
                    "phase": _slim(phase),
                }
            )
            print(
                f"critical {kind} #{rep}: {len(times)} of {runs[-1]['sent']} received, p50 "
                f"{fmt(_ms(quantile(times, 0.5)), '.1f')} p99 "
                f"{fmt(_ms(quantile(times, 0.99)), '.1f')} ms; bulk "
                f"{runs[-1]['bulk_mbps']:.1f} Mbit/s; errors {phase['errors']}",
                flush=True,
            )
    summary: dict[str, Any] = {"runs": runs}
    for kind in ("alone", "with_bulk"):
        times = sorted(t for r in runs if r["kind"] == kind for t in r["latencies_s"])
        summary[kind] = {
            "received": len(times),
            "sent": sum(r["sent"] for r in runs if r["kind"] == kind),
            "p50_s": quantile(times, 0.5),
            "p99_s": quantile(times, 0.99),
            "max_s": times[-1] if times else None,
        }
    alone_p99, bulk_p99 = summary["alone"]["p99_s"], summary["with_bulk"]["p99_s"]
    summary["p99_ratio"] = bulk_p99 / alone_p99 if alone_p99 and bulk_p99 else None
    summary["bulk_mbps"] = [r["bulk_mbps"] for r in runs if r["kind"] == "with_bulk"]
    return summary


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def measure_stuck(trainers: Trainers, cap_bytes: int) -> dict[str, Any]:
    runs = []
    for rep in range(REPEATS):
        tag = f"live{rep}"
        phase = trainers.phase(bulk("live", tag), LIVE_S, watch=("live", "stuck"))
        start, end = phase["t0"] + STUCK_WARM_S, phase["end"]
        live = received(phase, "live")
        runs.append(
            {
                "kind": "alone",
                "rep": rep,
                "live_mbps": mbps(live, start, end),
                "window_s": [STUCK_WARM_S, LIVE_S],
                "live_per_second_mbps": per_second(live, phase["t0"], end),
                "link_mbps": link_mbps(phase, start, end),
                "phase": _slim(phase),
            }
        )
        print(f"stuck: live alone #{rep}: {runs[-1]['live_mbps']:.1f} Mbit/s", flush=True)
        stuck_tag = f"stuck{rep}"
        stuck = {
            "bj": [
                _role(
                    "bj", role="flood", job="stuck", tag=stuck_tag, size=MIB, count=STUCK_MESSAGES
                )
            ],
            "sh": [_role("sh", role="hold", job="stuck")],
        }
        phase = trainers.phase(
            merge(bulk("live", f"beside{rep}"), stuck), STUCK_S, watch=("live", "stuck")
        )
        live = received(phase, "live")
        stuck_rows = [(s["t"], s["jobs"].get("stuck", {})) for s in phase["samples"]]
        held = [(t, row.get("held_bytes", 0)) for t, row in stuck_rows]
        most = max((h for _, h in held), default=0)
        # held_bytes counts a message from its start, so stuck's share of the path ends
        # once it has sent what it holds
        sent_before = stuck_rows[0][1].get("bytes_sent", 0)  # a counter since start-up
        full_at = next(
            (t for t, row in stuck_rows if most and row.get("bytes_sent", 0) - sent_before >= most),
            phase["end"],
        )
        start = max(full_at + 1.0, phase["t0"] + STUCK_WARM_S)
        end = phase["end"]
        last = phase["samples"][-1]["jobs"].get("stuck", {})
        runs.append(
            {
                "kind": "beside_stuck",
                "rep": rep,
                "live_mbps": mbps(live, start, end) if end - start >= 3 else None,
                "live_mbps_whole": mbps(live, phase["t0"] + STUCK_WARM_S, end),
                "window_s": [start - phase["t0"], end - phase["t0"]],
                "stuck_full_at_s": full_at - phase["t0"],
                "stuck_held_max_bytes": most,
                "stuck_at_end": last,
                "live_per_second_mbps": per_second(live, phase["t0"], end),
                "stuck_held_series": [[round(t - phase["t0"], 2), h] for t, h in held],
                "link_mbps": link_mbps(phase, start, end),
                "phase": _slim(phase),
            }
        )
        print(
            f"stuck: live beside stuck #{rep}: {fmt(runs[-1]['live_mbps'], '.1f')} Mbit/s "
            f"from t={start - phase['t0']:.1f} s; stuck held at most {most / MIB:.1f} MiB "
            f"(cap {cap_bytes / MIB:.0f}), at the end {last}; errors {phase['errors']}",
            flush=True,
        )
        # the stuck receiver reads at last, so the next pair starts clean
        drain = trainers.phase(
            {
                "sh": [
                    _role(
                        "sh",
                        role="recv",
                        job="stuck",
                        tag=stuck_tag,
                        count=STUCK_MESSAGES,
                        hard_s=30.0,
                    )
                ]
            },
            0.0,
        )
        runs[-1]["stuck_drained"] = len(received(drain, "stuck"))
    alone = [r["live_mbps"] for r in runs if r["kind"] == "alone"]
    beside = [r["live_mbps"] for r in runs if r["kind"] == "beside_stuck" and r["live_mbps"]]
    alone_mean = sum(alone) / len(alone)
    beside_mean = sum(beside) / len(beside) if beside else None
    return {
        "runs": runs,
        "cap_bytes": cap_bytes,
        "live_alone_mbps": alone_mean,
        "live_beside_stuck_mbps": beside_mean,
        "live_ratio": beside_mean / alone_mean if beside_mean and alone_mean else None,
        "stuck_held_max_bytes": max(
            r["stuck_held_max_bytes"] for r in runs if r["kind"] == "beside_stuck"
        ),
    }


def run_one_path(tree: Tree, which: set[str]) -> None:
    scenario = load_scenario(ONE_PATH)
    out = OUT / ("" if tree.is_this else tree.slug)
    with Lab(scenario) as lab:
        configs = lab.write_gateway_configs()
        gateways, _ = start_gateways(lab, configs, out / "logs", prefix="one-", tree=tree)
        trainers = Trainers(lab)
        trainers.gateways = gateways
        cap = _cap_bytes(configs["bj"], "stuck")
        common = {
            "scenario": ONE_PATH,
            "tree": tree.label,
            "version": version(tree),
            "link_rate_mbps": scenario.paths[0].a_to_b.rate_mbps,
            "delay_ms": scenario.paths[0].a_to_b.delay_ms,
        }
        try:
            lab.start_timeline()
            trainers.phase(bulk("bulk", "warm-up"), WARM_UP_S)
            for name, measure in (
                ("share", lambda: measure_share(trainers)),
                ("critical", lambda: measure_critical(trainers)),
                ("stuck", lambda: measure_stuck(trainers, cap)),
            ):
                if name in which:
                    _write(out / f"{name}.json", common | measure())
        finally:
            trainers.close()
            stop_gateways(gateways)


def _cap_bytes(config: Path, job: str) -> int:
    from wangate.config import load_config

    loaded = load_config(config)
    spec = loaded.job(job)
    assert spec is not None
    cap = loaded.jobs.inflight_cap(spec, loaded.limits.peer_inbox_bytes)
    assert cap is not None
    return cap


def measure_placement(tree: Tree, name: str, repeats: int) -> dict[str, Any]:
    """Placement share against spread on scenario ``name``, ``repeats`` times each,
    alternately; the record goes to ``results/jobs/<PLACEMENTS[name]>.json``."""
    scenario = load_scenario(name)
    out = OUT / ("" if tree.is_this else tree.slug)
    jobs = ("x", "y", "z")
    runs = []
    with Lab(scenario) as lab:
        trainers: Trainers | None = None
        try:
            configs = lab.write_gateway_configs()
            written = {site: config.read_text() for site, config in configs.items()}
            for site, text in written.items():
                assert text.count('placement = "share"') == 1, configs[site]
            for rep in range(repeats):
                for placement in ("share", "spread"):
                    for site, config in configs.items():
                        config.write_text(
                            written[site].replace(
                                'placement = "share"', f'placement = "{placement}"'
                            )
                        )
                    placed = _placed_paths(configs["bj"], [p.name for p in scenario.paths])
                    gateways, _ = start_gateways(
                        lab, configs, out / "logs", prefix=f"{placement}{rep}-", tree=tree
                    )
                    try:
                        if trainers is None:
                            trainers = Trainers(lab)
                        trainers.gateways = gateways
                        lab.start_timeline()
                        with wangate.Client(lab.gateway_socket("bj")) as gw:
                            before = {r["path"]: int(r["sent_bytes"] or 0) for r in gw.paths()}
                        roles = merge(
                            *(
                                {
                                    "bj": [
                                        _role(
                                            "bj",
                                            role="burst",
                                            job=job,
                                            tag="fixed",
                                            size=MIB,
                                            count=PLACEMENT_MESSAGES,
                                            seed=i + 2,
                                        )
                                    ],
                                    "sh": [
                                        _role(
                                            "sh",
                                            role="recv",
                                            job=job,
                                            tag="fixed",
                                            count=PLACEMENT_MESSAGES,
                                            hard_s=90.0,
                                        )
                                    ],
                                }
                                for i, job in enumerate(jobs)
                            )
                        )
                        phase = trainers.phase(roles, 0.0, watch=jobs)
                        with wangate.Client(lab.gateway_socket("bj")) as gw:
                            after = {r["path"]: int(r["sent_bytes"] or 0) for r in gw.paths()}
                    finally:
                        stop_gateways(gateways)
                    done = {}
                    for job in jobs:
                        events = received(phase, job)
                        complete = len(events) == PLACEMENT_MESSAGES
                        done[job] = events[-1][0] - phase["t0"] if complete else None
                    runs.append(
                        {
                            "placement": placement,
                            "paths_by_job": placed,
                            "rep": rep,
                            "completion_s": done,
                            "total_s": None if None in done.values() else max(done.values()),
                            "mean_s": None
                            if None in done.values()
                            else sum(done.values()) / len(done),
                            "per_second_mbps": {
                                job: per_second(
                                    received(phase, job),
                                    phase["t0"],
                                    phase["t0"] + max(v or 0 for v in done.values()) + 1,
                                )
                                for job in jobs
                            },
                            "path_sent_bytes": {p: after[p] - before.get(p, 0) for p in after},
                            "link_mbps": link_mbps(
                                phase,
                                phase["t0"] + 1,
                                phase["t0"] + min(v or 1e9 for v in done.values()),
                            ),
                            "phase": _slim(phase),
                        }
                    )
                    r = runs[-1]
                    print(
                        f"placement {placement} #{rep}: "
                        + ", ".join(f"{j} {fmt(v, '.2f', ' s')}" for j, v in done.items())
                        + f"; total {fmt(r['total_s'], '.2f', ' s')}; gateway CPU "
                        f"{r['phase']['cpu_share']}, late timers {r['phase']['late_timers']}; "
                        f"errors {phase['errors']}",
                        flush=True,
                    )
        finally:
            if trainers is not None:
                trainers.close()
    summary: dict[str, Any] = {
        "scenario": name,
        "tree": tree.label,
        "version": version(tree),
        "path_rates_mbps": [p.a_to_b.rate_mbps for p in scenario.paths],
        "messages_per_job": PLACEMENT_MESSAGES,
        # every byte over the sum of the path rates (IP and QUIC overhead left out)
        "bound_s": len(jobs)
        * PLACEMENT_MESSAGES
        * MIB
        * 8
        / 1e6
        / sum(p.a_to_b.rate_mbps for p in scenario.paths),
        "runs": runs,
    }
    for placement in ("share", "spread"):
        mine = [r for r in runs if r["placement"] == placement]
        totals = [r["total_s"] for r in mine if r["total_s"] is not None]
        means = [r["mean_s"] for r in mine if r["mean_s"] is not None]
        summary[placement] = {
            "total_s": sum(totals) / len(totals) if totals else None,
            "mean_job_s": sum(means) / len(means) if means else None,
            "first_job_s": _mean([min(r["completion_s"].values()) for r in mine if r["total_s"]]),
            "complete_runs": len(totals),
        }
    share, spread = summary["share"]["total_s"], summary["spread"]["total_s"]
    summary["spread_over_share_total"] = spread / share if share and spread else None
    ms_, mp_ = summary["share"]["mean_job_s"], summary["spread"]["mean_job_s"]
    summary["spread_over_share_mean"] = mp_ / ms_ if ms_ and mp_ else None
    _write(out / f"{PLACEMENTS[name]}.json", summary)
    return summary


def _placed_paths(config: Path, paths: list[str]) -> dict[str, list[str] | None]:
    """The paths each job may use towards sh under this config, as the gateway works
    them out (``Config.job_policies``; ``default`` included, as it is always there)."""
    from wangate.config import load_config

    policies = load_config(config).job_policies(paths)
    return {
        job: None if policy.paths is None else sorted(policy.paths)
        for job, policy in policies.items()
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _write(file: Path, record: dict[str, Any]) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(record, indent=1))


# ---------------------------------------------------------------- the table


def _load(name: str, tree: Tree = THIS) -> dict[str, Any] | None:
    file = OUT / ("" if tree.is_this else tree.slug) / f"{name}.json"
    return json.loads(file.read_text()) if file.exists() else None


def rows(tree: Tree = THIS) -> list[str]:
    lines = ["| measurement | metric | measured | aim | met? |", "|---|---|---|---|---|"]
    share = _load("share", tree)
    if share is None:
        lines.append("| share | not run | | | |")
    else:
        together = [r for r in share["runs"] if r["kind"] == "together"]
        ratio = share["ratio"]
        each = ", ".join(fmt(x, ".2f") for x in share["ratios"])
        lines.append(
            f"| share | a (weight 3) over b (weight 1), delivered bytes, t={SHARE_WARM_S:g}.."
            f"{SHARE_S:g} s of each run | **{fmt(ratio, '.2f')}** (runs: {each}); a "
            f"{_mean([r['a_mbps'] for r in together]):.1f}, b "
            f"{_mean([r['b_mbps'] for r in together]):.1f} Mbit/s | "
            f"{AIM_RATIO:g} +- {AIM_RATIO_TOL:.0%} | "
            f"{met(ratio is not None and abs(ratio / AIM_RATIO - 1) <= AIM_RATIO_TOL)} |"
        )
        pairs = ", ".join(fmt(x, ".2f") for x in share["total_over_alone_pairs"])
        lines.append(
            f"| share | a + b together over a alone (same path, alternately) | "
            f"**{fmt(share['total_over_alone'], '.3f')}** ({share['together_mbps']:.1f} / "
            f"{share['alone_mbps']:.1f} Mbit/s; link {share['link_rate_mbps']:g}; pairs: "
            f"{pairs}) | "
            f">= {AIM_TOTAL} | {met((share['total_over_alone'] or 0) >= AIM_TOTAL)} |"
        )
    crit = _load("critical", tree)
    if crit is None:
        lines.append("| critical | not run | | | |")
    else:
        for kind, what in (("alone", "crit alone"), ("with_bulk", "crit beside bulk")):
            c = crit[kind]
            lines.append(
                f"| critical | {what}: 64 KiB every 50 ms, send -> received p50 / p99 / max "
                f"(ms), {c['received']} of {c['sent']} | {fmt(_ms(c['p50_s']), '.1f')} / "
                f"**{fmt(_ms(c['p99_s']), '.1f')}** / {fmt(_ms(c['max_s']), '.1f')} | | |"
            )
        bulk_rates = ", ".join(f"{x:.1f}" for x in crit["bulk_mbps"])
        lines.append(
            f"| critical | p99 beside bulk over p99 alone (bulk {bulk_rates} Mbit/s) | "
            f"**{fmt(crit['p99_ratio'], '.2f')}** | | |"
        )
    stuck = _load("stuck", tree)
    if stuck is None:
        lines.append("| stuck | not run | | | |")
    else:
        ratio = stuck["live_ratio"]
        lines.append(
            f"| stuck | live's goodput beside a stuck job (after stuck filled its cap) over "
            f"live alone | **{fmt(ratio, '.3f')}** ({fmt(stuck['live_beside_stuck_mbps'], '.1f')}"
            f" / {stuck['live_alone_mbps']:.1f} Mbit/s) | >= {AIM_LIVE} | "
            f"{met(ratio is not None and ratio >= AIM_LIVE)} |"
        )
        beside = [r for r in stuck["runs"] if r["kind"] == "beside_stuck"]
        filling = [
            x
            for r in beside
            for x in r["live_per_second_mbps"][1 : int(r["stuck_full_at_s"])]
            if r.get("stuck_full_at_s")
        ]
        full_at = ", ".join(fmt(r.get("stuck_full_at_s"), ".1f") for r in beside)
        lines.append(
            f"| stuck | while stuck sends what it may hold (until t = {full_at} s): live's "
            f"rate per second | {fmt(min(filling) if filling else None, '.1f')}.."
            f"{fmt(max(filling) if filling else None, '.1f')} Mbit/s (equal weights: half) "
            f"| | |"
        )
        most, cap = stuck["stuck_held_max_bytes"], stuck["cap_bytes"]
        lines.append(
            f"| stuck | stuck's held_bytes at sh, most seen, against its cap | "
            f"{most / MIB:.1f} MiB of {cap / MIB:.0f} MiB | <= cap | {met(most <= cap)} |"
        )
    placements = {file: _load(file, tree) for file in PLACEMENTS.values()}
    for file, placement in placements.items():
        lines += _placement_rows(file, placement)
    lines += _cpu_rows({"share": share, "critical": crit, "stuck": stuck, **placements})
    return lines


def _placement_rows(file: str, placement: dict[str, Any] | None) -> list[str]:
    if placement is None:
        return [f"| {file} | not run | | | |"]
    lines = []
    rates = "/".join(f"{r:g}" for r in placement["path_rates_mbps"])
    for name in ("share", "spread"):
        p = placement[name]
        runs = [r for r in placement["runs"] if r["placement"] == name]
        each = "; ".join(", ".join(fmt(v, ".1f") for v in r["completion_s"].values()) for r in runs)
        where = ""
        if name == "spread" and runs and runs[0].get("paths_by_job"):
            placed = runs[0]["paths_by_job"]
            where = "; paths " + ", ".join(f"{j} {'+'.join(placed[j])}" for j in "xyz")
        lines.append(
            f"| {file} | {name}: 3 jobs x {placement['messages_per_job']} MiB at once on "
            f"{rates} Mbit/s; total / mean job / first job (s) | "
            f"**{fmt(p['total_s'], '.2f')}** / {fmt(p['mean_job_s'], '.2f')} / "
            f"{fmt(p['first_job_s'], '.2f')} (x, y, z per run: {each}{where}) | | |"
        )
    pairs = []
    for share, spread in zip(
        [r for r in placement["runs"] if r["placement"] == "share"],
        [r for r in placement["runs"] if r["placement"] == "spread"],
        strict=True,
    ):
        if share["total_s"] and spread["total_s"]:
            pairs.append(spread["total_s"] / share["total_s"])
    lines.append(
        f"| {file} | spread over share: total (per pair); mean job (bound: every byte "
        f"over the paths' sum, {placement['bound_s']:.2f} s) | "
        f"**{fmt(placement['spread_over_share_total'], '.3f')}** "
        f"({', '.join(f'{x:.2f}' for x in pairs)}); "
        f"{fmt(placement['spread_over_share_mean'], '.3f')} | | |"
    )
    return lines


def _cpu_rows(records: dict[str, dict[str, Any] | None]) -> list[str]:
    """Per measurement: the gateways' CPU and bj's late timers over its phases."""
    lines = []
    for name, record in records.items():
        if record is None:
            continue
        phases = [r["phase"] for r in record["runs"]]
        shares = [p["cpu_share"] for p in phases]
        cpu = [c for p in shares for k, c in p.items() if c is not None and k in ("bj", "sh")]
        links = [c for p in shares for k, c in p.items() if c is not None and k.startswith("link")]
        late = [p["late_timers"] for p in phases if p.get("late_timers") is not None]
        if not cpu:
            continue
        link_text = f"; link forwarders {min(links):.2f}..{max(links):.2f}" if links else ""
        lines.append(
            f"| {name} | gateway CPU per phase, share of a core (bj and sh; the link "
            f"forwarders); bj's late timers per phase | {min(cpu):.2f}..{max(cpu):.2f}"
            f"{link_text}; "
            f"{fmt(min(late) if late else None, '.0f')}..{fmt(max(late) if late else None, '.0f')}"
            " | | |"
        )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench jobs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only",
        default=",".join(MEASUREMENTS),
        help=f"comma-separated, of {', '.join(MEASUREMENTS)} (default: all)",
    )
    parser.add_argument("--report-only", action="store_true", help="only the table from disk")
    add_tree_argument(parser)
    args = parser.parse_args(argv)
    which = {w.strip() for w in args.only.split(",") if w.strip()}
    if which - set(MEASUREMENTS):
        parser.error(f"--only: unknown {', '.join(sorted(which - set(MEASUREMENTS)))}")
    trees = chosen_trees(args)
    if not args.report_only:
        for tree in trees:  # one tree after the other, each its own labs
            started = time.monotonic()
            if which & {"share", "critical", "stuck"}:
                run_one_path(tree, which)
            if "placement" in which:
                for name, repeats in PLACEMENT_REPEATS.items():
                    measure_placement(tree, name, repeats)
            print(f"{tree.label}: {time.monotonic() - started:.0f} s", flush=True)
    text = []
    for tree in trees:
        text += [f"## Jobs ({tree.label}: {version(tree)})", "", *rows(tree), ""]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.md").write_text("\n".join(text))
    print("\n".join(text))
    return 0
