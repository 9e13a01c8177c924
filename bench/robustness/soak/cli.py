"""python -m bench robustness soak [--seed N] [--seconds S] [--workers 2] [--tree REV] ...

A randomized, seeded fault soak in the WAN lab (bench/robustness/soak/__init__.py says
what it does and checks). With ``--tree`` (repeatable) each run is done again with that
tree's daemons, alternately with this tree's (bench/tree.py); ``--runs N`` repeats the
round. Every run has the same seed, so the same fault schedule. Records go to
``results/soak/<tree>/seed<N>[-w<workers>]/<date>-<time>[-run<i>]/`` (run.json,
summary.md, the daemons' logs); the table to stdout, or the records as JSON with
``--json``. Exits 1 if an invariant failed in any run. Needs root and /dev/net/tun.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import tree as trees
from bench.common import RESULTS
from bench.robustness.soak import report, schedule
from bench.robustness.soak.run import Options, run_soak
from bench.runner.run import machine_description
from bench.tree import Tree


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench robustness soak", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=180.0, help="the faulted phase")
    parser.add_argument("--warmup-s", type=float, default=15.0)
    parser.add_argument("--drain-s", type=float, default=60.0, help="at most, after the faults")
    parser.add_argument("--sites", type=int, default=3, choices=(2, 3))
    parser.add_argument("--paths", type=int, default=2, choices=(2, 3), help="per pair of sites")
    parser.add_argument("--workers", type=int, default=1, help="[workers] count of every daemon")
    parser.add_argument("--rate-mbps", type=float, default=8.0, help="offered per flow")
    parser.add_argument("--link-mbps", type=float, default=20.0, help="every path's rate")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--results", type=Path, default=RESULTS / "soak")
    parser.add_argument("--schedule", action="store_true", help="print the faults and exit")
    parser.add_argument("--json", action="store_true", help="the records as JSON on stdout")
    trees.add_argument(parser)
    return parser.parse_args(argv)


def options(args: argparse.Namespace) -> Options:
    return Options(
        seed=args.seed,
        seconds=args.seconds,
        warmup_s=args.warmup_s,
        drain_s=args.drain_s,
        sites=args.sites,
        paths=args.paths,
        workers=args.workers,
        rate_mbps=args.rate_mbps,
        link_mbps=args.link_mbps,
    )


def out_dir(results: Path, tree: Tree, opts: Options, index: int, runs: int) -> Path:
    """``<tree>/seed<N>[-w<workers>]/<date>-<time>[-run<i>]``: a run never overwrites another."""
    name = f"seed{opts.seed}" + (f"-w{opts.workers}" if opts.workers > 1 else "")
    when = datetime.now().strftime("%Y%m%d-%H%M%S")
    return results / tree.slug / name / (when + (f"-run{index}" if runs > 1 else ""))


def summary(record: dict[str, Any]) -> str:
    lines = [
        f"# Fault soak: {report.column_name(record)}",
        "",
        f"    {record['command']}",
        "",
        f"Machine: {record['machine']}; load average {record['load_average']}.",
        f"Gateway: {record['gateway_version']}; started {record['started_at']}.",
        "",
        report.table([record]),
        "",
        "Faults:",
        "",
        *(f"    {schedule.Fault(**_fault_fields(f)).describe()}" for f in record["faults"]),
    ]
    if record["violations"]:
        lines += ["", "Violations:", "", report.violations_text(record)]
    return "\n".join(lines) + "\n"


def _fault_fields(fault: dict[str, Any]) -> dict[str, Any]:
    return {k: fault[k] for k in ("at_s", "kind", "target", "duration_s", "loss")}


def main(argv: list[str]) -> int:
    args = parse(argv)
    opts = options(args)
    if args.schedule:
        for fault in opts.faults():
            print(fault.describe())
        print(schedule.count_by_kind(opts.faults()))
        return 0
    compared = trees.trees(args)
    log = sys.stderr if args.json else sys.stdout

    def say(text: str) -> None:
        print(text, file=log, flush=True)

    records: list[dict[str, Any]] = []
    for index in range(1, args.runs + 1):
        for tree in compared:
            directory = out_dir(args.results, tree, opts, index, args.runs)
            say(f"soak {index}/{args.runs}, {tree.label}, seed {opts.seed} -> {directory}")
            load = os.getloadavg()[0]
            record = run_soak(opts, tree, directory, say)
            record["command"] = "python -m bench robustness soak " + shlex.join(argv)
            record["machine"] = f"{machine_description()}, {platform.node()}"
            record["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]
            (directory / "run.json").write_text(json.dumps(record, indent=1))
            (directory / "summary.md").write_text(summary(record))
            records.append(record)
            if record["violations"]:
                say(report.violations_text(record))
    if args.json:
        print(json.dumps(records, indent=1))
    else:
        print()
        print(report.table(records))
    return 0 if all(r["ok"] for r in records) else 1
