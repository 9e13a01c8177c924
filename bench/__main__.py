"""python -m bench {run,suite,cpu,plots,lab}

    python -m bench run multipath_clean3 [loss_1 ...]   # or: run all
    python -m bench suite loss [critical ...]           # or: suite all (python -m bench suite -h)
    python -m bench cpu                        # gateway vs plain aioquic, CPU per byte
    python -m bench workers                    # CPU per GiB with 1, 2, 4 worker processes
    python -m bench plots results/multipath_clean3/run.json
    python -m bench lab ...                    # the same as python -m bench.lab ...

The other benchmarks keep their own modules: python -m bench.loopback, bench.codecs,
bench.fec, bench.convergence, bench.collectives, bench.probe (the link probe against the lab).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wangate.errors import WangateError


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.lab.scenario import SCENARIO_DIR, load_scenario
    from bench.runner.record import combined_table
    from bench.runner.run import BASELINE_NAMES, command_line, run_scenario

    names = list(args.scenario)
    if names == ["all"]:
        names = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
    # every file is checked before anything runs
    scenarios = [(name, load_scenario(name)) for name in names]
    if args.scenario == ["all"]:
        for name, scenario in scenarios:
            if not scenario.flows:
                print(f"skipping {name}: no [workload] (another tool drives it)")
        scenarios = [(name, scenario) for name, scenario in scenarios if scenario.flows]
    baselines = () if args.no_baselines else tuple(args.baseline or BASELINE_NAMES)
    records = []
    extra = [a for a in argv if a not in args.scenario]
    for name, scenario in scenarios:
        records.append(
            run_scenario(
                scenario,
                Path(args.results),
                baselines=baselines,
                timeout_s=args.timeout_s,
                baseline_timeout_s=args.baseline_timeout_s,
                run_id=args.run_id,
                plots=not args.no_plots,
                gateway_src=args.gateway_src,
                command=command_line(["run", *extra, name]),
            )
        )
    print()
    print("time for the workload (ratio to the ideal bound):")
    print(combined_table(records))
    return (
        0
        if all(
            r["wangate"]["complete"] and r["wangate"]["intact"] == r["wangate"]["messages"]
            for r in records
        )
        else 1
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lab"]:
        from bench.lab.__main__ import main as lab_main

        return int(lab_main(argv[1:]))
    if argv[:1] == ["cpu"]:
        from bench.cpu import main as cpu_main

        return cpu_main(argv[1:])
    if argv[:1] == ["workers"]:
        from bench.workers import main as workers_main

        return workers_main(argv[1:])
    if argv[:1] == ["suite"]:
        from bench.suite.run import main as suite_main

        return suite_main(argv[1:])
    if argv[:1] == ["plots"]:
        from bench.plots import main as plots_main

        return plots_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="real gateways in the WAN lab, baselines, results/")
    run.add_argument(
        "scenario",
        nargs="+",
        help="names in bench/scenarios/, files, or 'all' (every scenario there with a [workload])",
    )
    run.add_argument("--results", default=str(Path(__file__).resolve().parent.parent / "results"))
    run.add_argument("--timeout-s", type=float, help="time wangate gets for the workload")
    run.add_argument("--baseline-timeout-s", type=float, help="time each baseline gets")
    run.add_argument(
        "--baseline",
        action="append",
        help="only these (repeatable): tcp-cubic, tcp-bbr, aioquic-stream",
    )
    run.add_argument("--no-baselines", action="store_true")
    run.add_argument("--no-plots", action="store_true")
    run.add_argument(
        "--gateway-src",
        type=Path,
        help="folder with the wangate package the "
        "gateways run (e.g. git archive HEAD wangate | tar -x -C DIR)",
    )
    run.add_argument("--run-id", help="lab run id (1-6 of [0-9a-z]); random by default")
    sub.add_parser("suite", help="named suites by subject (python -m bench suite -h)")
    sub.add_parser("cpu", help="gateway vs plain aioquic on loopback (python -m bench cpu -h)")
    sub.add_parser("workers", help="CPU per GiB with worker processes (python -m bench workers -h)")
    sub.add_parser("plots", help="redraw PNGs from results/<scenario>/run.json")
    sub.add_parser("lab", help="the WAN lab (python -m bench lab -h)")
    args = parser.parse_args(argv)
    try:
        return _run(args, argv[1:])
    except WangateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
