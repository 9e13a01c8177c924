"""python -m bench suite NAME... [--report-only]

Each suite measures one subject in the WAN lab (root and /dev/net/tun needed) and
prints its table, also written to ``results/suite_<NAME>.md``:

    loss       64 MiB over one lossy path (0.1 / 1 / 5 % random, bursts) and over three
               paths, one lossy; TCP cubic/BBR beside it; aims on goodput / link rate;
               then the 128 MiB loss_long_* runs beside TCP BBR (each with its budget)
    fair       one TCP cubic flow and a wangate bulk transfer share one path
    critical   critical latency beside bulk, without bulk, under jitter; the lab floor
    failover   critical latency and route when the best path degrades or blackholes
    codecs     one 64 MiB gradient per codec over three paths: bytes sent, time
    baselines  every scenario of rounds (critical + bulk messages) and the multipath
               ones, wangate against TCP cubic, TCP BBR and one aioquic stream

Scenario runs go through the runner (``python -m bench run ...``, one process each) and
are read back from ``results/<scenario>/run.json``; ``--report-only`` skips every run
and rebuilds the tables from the results on disk. ``all`` runs every suite.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.codecs import lab as codecs_lab
from bench.common import RESULTS, ROOT, load_record
from bench.transport import critical, fair, loss

CUBIC_BBR = ("--baseline", "tcp-cubic", "--baseline", "tcp-bbr")
BASELINE_SCENARIOS = (
    "multipath_clean3",
    "multipath_lossy_fast",
    "multipath_congest",
    "failover_blackhole_rounds",
    "failover_degrade_rounds",
    "critical_jitter_rounds",
    "multipath_three_sites",
    "loss_01_rounds",
    "loss_1_rounds",
    "loss_5_rounds",
    "loss_burst_rounds",
)


@dataclass(frozen=True)
class Suite:
    runs: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]  # (scenarios, runner flags)
    table: Callable[[], list[str]]
    floors: tuple[str, ...] = ()  # scenarios whose lab floor is measured after the runs
    drivers: tuple[Callable[[], object], ...] = field(default=())  # Lab API measurements


def _baselines_table() -> list[str]:
    from bench.runner.record import combined_table

    found = {name: load_record(name) for name in BASELINE_SCENARIOS}
    lines = combined_table([r for r in found.values() if r is not None]).splitlines()
    return lines + [f"| {name} | not run | | | | | |" for name, r in found.items() if r is None]


SUITES: dict[str, Suite] = {
    "loss": Suite(
        runs=(
            (loss.SINGLE_PATH, CUBIC_BBR),
            (loss.MULTI_PATH, ("--baseline", "tcp-bbr")),
            (
                loss.REPEATED,
                ("--no-baselines", "--no-plots", "--results", str(RESULTS / loss.REPEAT_DIR)),
            ),
            (loss.LONG, ("--baseline", "tcp-bbr", "--baseline-timeout-s", "50", "--no-plots")),
        ),
        table=loss.rows,
    ),
    "fair": Suite(runs=(), table=fair.rows, drivers=(fair.run,)),
    "critical": Suite(
        runs=((critical.CRITICAL + critical.WORKERS, ("--no-baselines",)),),
        table=lambda: critical.rows(critical.CRITICAL + critical.WORKERS),
        floors=critical.CRITICAL,
    ),
    "failover": Suite(
        runs=((critical.FAILOVER, ("--no-baselines",)),),
        table=lambda: critical.rows(critical.FAILOVER),
        floors=critical.FAILOVER,
    ),
    "codecs": Suite(runs=(), table=codecs_lab.rows, drivers=(codecs_lab.run,)),
    "baselines": Suite(runs=((BASELINE_SCENARIOS, ()),), table=_baselines_table),
}


def _run_runner(names: tuple[str, ...], flags: tuple[str, ...]) -> None:
    for name in names:
        command = [sys.executable, "-m", "bench", "run", *flags, name]
        print("$", " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=ROOT, check=False)


def run_suite(name: str, report_only: bool = False) -> str:
    """Run suite ``name`` (unless ``report_only``); its table as Markdown."""
    suite = SUITES[name]
    if not report_only:
        for names, flags in suite.runs:
            _run_runner(names, flags)
        for scenario in suite.floors:
            critical.measure(scenario)
        for driver in suite.drivers:
            driver()
    text = "\n".join([f"## Suite {name}", "", *suite.table(), ""])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"suite_{name}.md").write_text(text)
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("suite", nargs="+", choices=(*SUITES, "all"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    names = list(SUITES) if "all" in args.suite else list(dict.fromkeys(args.suite))
    for name in names:
        print(run_suite(name, report_only=args.report_only), flush=True)
    return 0
