"""python -m bench run SCENARIO... | all [--runs N] [--tree PATH_OR_COMMIT ...]

Each scenario (a name in wangate/lab/scenarios/ or a file) through the runner: real
gateways in the WAN lab, the baselines after them in the same lab, a record and plots.
With ``--runs N`` or ``--tree``, rounds: in each round every scenario with this tree's
gateways (and the baselines), then with each other tree's (without), so that all of them
see the same machine; the records go to ``RESULTS/<tree>/run<i>/<scenario>/``. Otherwise
to ``RESULTS/<scenario>/``, where the suites read them.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import tree as trees
from bench.common import RESULTS
from bench.runner.record import combined_table
from bench.runner.run import BASELINE_NAMES, run_scenario
from bench.tree import Tree
from wangate.lab.scenario import SCENARIO_DIR, Scenario, load_scenario


def command_line(argv: list[str]) -> str:
    return "python -m bench " + " ".join(shlex.quote(a) for a in argv)


def result_dir(results: Path, tree: Tree, index: int, rounds: bool) -> Path:
    return results / tree.slug / f"run{index}" if rounds else results


def run_rounds(
    scenarios: list[Scenario],
    trees_: list[Tree],
    runs: int,
    results: Path,
    baselines: Callable[[Scenario], tuple[str, ...]],
    command: Callable[[Scenario, Tree], str],
    **options: Any,
) -> list[dict[str, Any]]:
    """Every scenario ``runs`` times with each tree's gateways, alternately; only this
    tree's runs have baselines."""
    rounds = runs > 1 or len(trees_) > 1
    records = []
    for index in range(1, runs + 1):
        for scenario in scenarios:
            for tree in trees_:
                record = run_scenario(
                    scenario,
                    result_dir(results, tree, index, rounds),
                    baselines=baselines(scenario) if tree.is_this else (),
                    tree=tree,
                    command=command(scenario, tree),
                    **options,
                )
                records.append(record)
                if rounds:
                    wangate = record["wangate"]
                    print(
                        f"run {index} {scenario.name} ({tree.label}): wangate "
                        f"{wangate['time_s'] or '> timeout'} s, load {wangate['load_average']}",
                        flush=True,
                    )
    return records


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench run", description=__doc__)
    parser.add_argument(
        "scenario",
        nargs="+",
        help="names in wangate/lab/scenarios/, files, or 'all' (every one with a [workload])",
    )
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, help="time wangate gets for the workload")
    parser.add_argument("--baseline-timeout-s", type=float, help="time each baseline gets")
    parser.add_argument(
        "--baseline",
        action="append",
        help="only these (repeatable): tcp-cubic, tcp-bbr, aioquic-stream",
    )
    parser.add_argument("--no-baselines", action="store_true")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--run-id", help="lab run id (1-6 of [0-9a-z]); random by default")
    trees.add_argument(parser)
    args = parser.parse_args(argv)
    names = list(args.scenario)
    if names == ["all"]:
        names = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
    # every file is checked before anything runs
    scenarios = [load_scenario(name) for name in names]
    if args.scenario == ["all"]:
        for scenario in scenarios:
            if not scenario.flows:
                print(f"skipping {scenario.name}: no [workload] (another tool drives it)")
        scenarios = [s for s in scenarios if s.flows]
    chosen = () if args.no_baselines else tuple(args.baseline or BASELINE_NAMES)
    flags = [a for a in argv if a not in args.scenario]

    def command(scenario: Scenario, tree: Tree) -> str:
        return command_line(["run", *flags, scenario.name])

    records = run_rounds(
        scenarios,
        trees.trees(args),
        args.runs,
        Path(args.results),
        lambda scenario: chosen,
        command,
        timeout_s=args.timeout_s,
        baseline_timeout_s=args.baseline_timeout_s,
        run_id=args.run_id,
        plots=not args.no_plots,
    )
    print()
    print("time for the workload (ratio to the ideal bound):")
    print(combined_table(records))
    complete = all(
        r["wangate"]["complete"] and r["wangate"]["intact"] == r["wangate"]["messages"]
        for r in records
    )
    return 0 if complete else 1
