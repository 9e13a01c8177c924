"""python -m bench collectives lab [--sites 3|4] [--runs 3] [--half] [--methods ...]

Brings up the lab scenario ``coll_3`` / ``coll_4`` (``coll_3_half`` with ``--half``),
gives each site a routable address, and times an allreduce of 8M float32 with Gloo
over TCP cubic and BBR, with the naive all-to-all over wangate and with the wangate
allreduce, in that order, in one lab; writes ``results/collectives/<scenario>.json``
and prints the table. Needs root and /dev/net/tun.
"""

from __future__ import annotations

import argparse
import sys

from bench import tree as trees
from bench.collectives.run import ELEMENTS, run_collectives, table
from wangate.errors import WangateError
from wangate.lab.scenario import load_scenario


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench collectives lab")
    parser.add_argument("--sites", type=int, nargs="+", choices=(3, 4), default=[3, 4])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--half",
        action="store_true",
        help="coll_3_half (gz's links half as fast) instead of coll_3/coll_4",
    )
    parser.add_argument(
        "--methods", nargs="+", default=["gloo-cubic", "gloo-bbr", "alltoall", "rsag", "allreduce"]
    )
    parser.add_argument("--scenario", nargs="+", help="scenario names (instead of --sites)")
    parser.add_argument(
        "--variants",
        nargs="+",
        help="allreduce variants to run (allreduce, allreduce-equal, allreduce-measured)",
    )
    parser.add_argument("--label", default="", help="suffix of the results file name")
    parser.add_argument("--elements", type=int, default=ELEMENTS)
    parser.add_argument("--gloo-timeout", type=float, default=120.0)
    parser.add_argument("--cubic-timeout", type=float, default=300.0)
    parser.add_argument("--cubic-runs", type=int, default=None, help="default: --runs")
    parser.add_argument("--wangate-timeout", type=float, default=60.0)
    parser.add_argument(
        "--alternate",
        action="store_true",
        help="wangate variants in rounds, one run each on fresh gateways, instead of all "
        "runs of one variant then the next",
    )
    parser.add_argument(
        "--warmup-runs",
        type=int,
        default=0,
        help="untimed collectives on each gateway before its timed runs (the measured "
        "plan needs two: the leader uses the reports of the call before)",
    )
    parser.add_argument("--warmup-elements", type=int, default=None, help="default: --elements")
    parser.add_argument(
        "--idle-s",
        type=float,
        default=0.0,
        help="seconds with no traffic between the warm-up collectives and the first run",
    )
    trees.add_argument(parser)  # each wangate method again as <name>@<tree>
    args = parser.parse_args(argv)
    names = ["coll_3_half"] if args.half else [f"coll_{n}" for n in args.sites]
    if args.scenario:
        names = args.scenario
    records = []
    try:
        for name in names:
            scenario = load_scenario(name)
            records.append(
                run_collectives(
                    scenario,
                    runs=args.runs,
                    elements=args.elements,
                    methods=tuple(args.methods),
                    gloo_timeout_s=args.gloo_timeout,
                    cubic_timeout_s=args.cubic_timeout,
                    cubic_runs=args.cubic_runs,
                    wangate_timeout_s=args.wangate_timeout,
                    variants=tuple(args.variants) if args.variants else None,
                    trees=tuple(trees.trees(args)),
                    label=args.label,
                    alternate=args.alternate,
                    warmup_runs=args.warmup_runs,
                    warmup_elements=args.warmup_elements,
                    idle_s=args.idle_s,
                )
            )
    except WangateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(table(records))
    return 0
