"""`wangate probe` against lab paths of known rate, delay and loss: readings vs truth.

    sudo .venv/bin/python -m bench transport probe [--runs 3] [--tree main] [--duration 10]

Each setting is one lab (two sites, one path, the emulator's loss seeded); inside it the
probe of this tree and that of each ``--tree`` (bench/tree.py) run alternately, each
against its own responder, ``--runs`` times.
Prints a markdown table and writes every report to ``results/probe/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import tree as trees
from bench.common import RESULTS as BENCH_RESULTS
from bench.tree import Tree
from wangate.lab.lab import Lab
from wangate.lab.selftest import two_site_scenario

RESULTS = BENCH_RESULTS / "probe"


@dataclass(frozen=True)
class Setting:
    label: str
    rate_mbps: float
    delay_ms: float
    loss: float
    cap_mbps: float


SETTINGS = (
    Setting("20 Mbit/s, 12 ms, 0.5 % each way", 20.0, 12.0, 0.005, 100.0),
    Setting("50 Mbit/s, 40 ms, 1 % each way", 50.0, 40.0, 0.01, 100.0),
    Setting("100 Mbit/s, 5 ms, clean", 100.0, 5.0, 0.0, 400.0),
)


def _probe_once(
    lab: Lab, tree: Tree, setting: Setting, duration_s: float, port: int
) -> dict[str, Any]:
    path = lab.scenario.path("a")
    responder = lab.run_in(
        "sh",
        [sys.executable, "-m", "wangate", "probe", "--serve", "--listen",
         f"{path.address_b}:{port}", "--forever"],
        env=tree.environ(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert responder.stdout is not None
        responder.stdout.readline()  # "probe responder on ..."
        prober = lab.run_in(
            "bj",
            [sys.executable, "-m", "wangate", "probe", f"{path.address_b}:{port}",
             "--local", path.address_a, "--duration", str(duration_s),
             "--rate-mbps", str(setting.cap_mbps), "--json"],
            env=tree.environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        before = lab.link_stats()["a"]["a_to_b"]
        out, err = prober.communicate(timeout=duration_s * 4 + 30)
        after = lab.link_stats()["a"]["a_to_b"]
        if not out:
            raise RuntimeError(f"probe printed nothing: {err.decode()[-2000:]}")
        report: dict[str, Any] = json.loads(out)
        # What the emulator itself did this run (prober -> responder): packets it was
        # given, dropped at random, dropped at its queue. Packets the prober sent that
        # never reached it were lost in the hosts (a stalled forwarder's TUN queue).
        report["emulator"] = {k: after[k] - before[k] for k in after if isinstance(after[k], int)}
        steps = (report["rate"] or {}).get("steps", [])
        sent = report["latency"]["sent"] + sum(s["packets_sent"] for s in steps)
        report["emulator"]["host_drops_at_least"] = max(
            0, sent - report["emulator"]["pushed_packets"]
        )
        return report
    finally:
        responder.terminate()
        responder.wait(timeout=10)


def _row(setting: Setting, tree: str, run: int, report: dict[str, Any]) -> str:
    rate = report["rate"] or {}
    fwd = rate.get("loss")  # this tree: the rate phase's loss with its interval
    if fwd:
        lo, hi = fwd["ci95"]
        fwd_text = f"{fwd['fraction'] * 100:.2f} % ({lo * 100:.2f}-{hi * 100:.2f}) of {fwd['sent']}"
    else:
        fwd_text = "-"
    lat = report["latency"]
    emu = report["emulator"]
    emu_loss = emu["dropped_loss"] / max(1, emu["pushed_packets"] - emu["dropped_queue"])
    return (
        f"| {setting.label} | {tree} | {run} | {lat['rtt_ms']['min']:.2f} "
        f"| {rate.get('achievable_mbps', 0.0):.2f} | {fwd_text} | {emu_loss * 100:.2f} % "
        f"({emu['host_drops_at_least']}) "
        f"| {lat['loss'] * 100:.2f} % of {lat['sent']} | {report['verdict']['text']} |"
    )


def summarize(results: list[tuple[int, str, dict[str, Any]]]) -> list[str]:
    """Per setting and probe: achievable / truth, one-way loss vs truth, verdicts."""
    lines = ["| setting | probe | achievable / truth (min-max) | one-way loss (min-max) "
             "| truth inside the 95 % CI | verdicts |", "|---|---|---|---|---|---|"]  # fmt: skip
    keys = sorted({(i, name) for i, name, _ in results}, key=lambda k: (k[0], k[1] != "this"))
    for index, name in keys:
        setting = SETTINGS[index]
        reports = [r for i, n, r in results if (i, n) == (index, name)]
        ratios = [(r["rate"] or {}).get("achievable_mbps", 0.0) / setting.rate_mbps
                  for r in reports]  # fmt: skip
        losses = [r["rate"]["loss"] for r in reports if r["rate"] and r["rate"].get("loss")]
        loss_text = (
            f"{min(x['fraction'] for x in losses) * 100:.2f}-"
            f"{max(x['fraction'] for x in losses) * 100:.2f} %"
            if losses
            else "-"
        )
        inside = sum(x["ci95"][0] <= setting.loss <= x["ci95"][1] for x in losses)
        verdicts = ", ".join(sorted(r["verdict"]["kind"] for r in reports))
        lines.append(
            f"| {setting.label} | {name} | {min(ratios):.3f}-{max(ratios):.3f} | {loss_text} "
            f"| {f'{inside} of {len(losses)}' if losses else '-'} | {verdicts} |"
        )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench transport probe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="probe --duration (10)")
    trees.add_argument(parser)  # and each tree's probe, alongside this tree's
    parser.add_argument("--only", type=int, action="append", help="setting index (0, 1, 2)")
    parser.add_argument("--summarize", nargs="+", type=Path, help="only summarise these reports")
    args = parser.parse_args(argv)
    if args.summarize:
        loaded = []
        for file in args.summarize:  # written as STAMP-sINDEX-PROBE-rRUN.json
            _stamp, index, rest = file.stem.split("-", 2)
            name = rest.rsplit("-", 1)[0]
            loaded.append((int(index[1:]), name, json.loads(file.read_text())))
        print("\n".join(summarize(loaded)))
        return 0
    results: list[tuple[int, str, dict[str, Any]]] = []
    RESULTS.mkdir(parents=True, exist_ok=True)
    settings = [SETTINGS[i] for i in args.only] if args.only else list(SETTINGS)
    compared = {tree.slug: tree for tree in trees.trees(args)}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    print("| setting | probe | run | min RTT ms | achievable Mbit/s | loss (rate phase, "
          "95 % CI, packets) | emulator's random loss (host drops) | loss (echoes, round trip) "
          "| verdict |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for index, setting in enumerate(settings):
        scenario = two_site_scenario(
            [{"name": "a", "rate_mbps": setting.rate_mbps, "delay_ms": setting.delay_ms,
              "loss": setting.loss}],
            seed=index + 1,
        )  # fmt: skip
        with Lab(scenario) as lab:
            lab.start_timeline()
            for run in range(1, args.runs + 1):
                for port, (name, tree) in enumerate(compared.items(), start=7444):
                    report = _probe_once(lab, tree, setting, args.duration, port)
                    stamp = time.strftime("%Y%m%dT%H%M%S")
                    out = RESULTS / f"{stamp}-s{index}-{name}-r{run}.json"
                    out.write_text(json.dumps(report, indent=1))
                    print(_row(setting, name, run, report), flush=True)
                    results.append((SETTINGS.index(setting), name, report))
    print(f"load average at end: {os.getloadavg()}", flush=True)
    print("\n".join(summarize(results)))
    return 0
