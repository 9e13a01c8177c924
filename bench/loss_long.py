"""Lossy paths: wangate against TCP BBR, and where the link rate goes.

    sudo .venv/bin/python -m bench.loss_long run --runs 3 [--before DIR] [--after DIR] [NAME ...]
    .venv/bin/python -m bench.loss_long report results/loss_long
    .venv/bin/python -m bench.loss_long trade        # sans-IO, fake link and clock, ~5 min
    .venv/bin/python -m bench.loss_long sim          # the controller alone, fake bottleneck

``run`` plays each scenario (default: every ``loss_long_*`` and
``loss_long_3paths``) ``--runs`` times in the WAN lab: this tree's gateways with
TCP BBR in the same lab right after (single-path scenarios), then, with ``--before
DIR`` (a folder holding another ``wangate`` package, e.g. ``git archive main wangate |
tar -x -C DIR``), that gateway without baselines, alternately, so that both see the
same machine. Records go to ``RESULTS/after<i>/<scenario>/run.json`` and
``RESULTS/before<i>/...``. ``report`` prints, per scenario, goodput as a share of the
link rate (median, range over runs), BBR's, their ratio per run, the aim, and the
median loss budget (``bench.runner.budget``) of each side.

``trade`` shows what up-front repair symbols buy, over the tests' seeded fake link
under a fake clock (two sessions, no I/O): 1 MiB messages handed over one at a time
on a 50 Mbit/s, 40 ms one-way path with random loss, each sent alone (so its time is
its own), with repair symbols up front on (a) no bulk block, (b) every message's tail
and the end of the backlog, (c) the tails whose round trip outweighs the wait they add
to the messages behind (the gateway's policy) and (d) every block. It prints the
repair bytes per source byte and each message's time from hand-over to the receiver's
confirmation. A second table hands 16 x 4 MiB over at once (a bulk transfer) and gives
the time for all of it as a share of the link rate (the fake link has no congestion
control, headers or CPU: what is left is the repair policy's cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.lab.scenario import SCENARIO_DIR, load_scenario
from bench.runner.budget import PARTS, loss_budget

DEFAULT_RESULTS = Path(__file__).resolve().parent.parent / "results" / "loss_long"
AIM_SHARE = 0.92  # of (1 - loss) x rate, one path
AIM_MULTIPATH = 0.88  # of the sum of the path rates


def default_scenarios() -> list[str]:
    names = sorted(p.stem for p in SCENARIO_DIR.glob("loss_long_*.toml"))
    return [*(n for n in names if n != "loss_long_3paths"), "loss_long_3paths"]  # once, last


def _run(args: argparse.Namespace) -> int:
    from bench.runner.run import command_line, run_scenario

    names = args.scenario or default_scenarios()
    scenarios = [(n, load_scenario(n)) for n in names]
    results = Path(args.results)
    for i in range(1, args.runs + 1):
        for name, scenario in scenarios:
            single = len(scenario.paths) == 1
            sides: list[tuple[str, Path | None]] = [
                ("after", Path(args.after) if args.after else None)
            ]
            if args.before:
                sides.append(("before", Path(args.before)))
            for side, src in sides:
                record = run_scenario(
                    scenario,
                    results / f"{side}{i}",
                    baselines=("tcp-bbr",) if single and side == "after" else (),
                    baseline_timeout_s=args.baseline_timeout_s,
                    plots=False,
                    quiet=True,
                    gateway_src=src,
                    command=command_line(["run", "--no-plots", name])
                    + ("" if src is None else f" --gateway-src {src}"),
                )
                wg = record["wangate"]
                print(
                    f"{side}{i} {name}: wangate {wg['time_s'] or '> timeout'} s, "
                    f"load {wg.get('load_average')}",
                    flush=True,
                )
    print(report(results))
    return 0


def _share(record: dict[str, Any], time_s: float | None) -> float | None:
    if not time_s:
        return None
    scenario = load_scenario(record["scenario"])
    flow = scenario.flows[0]
    rate_bps = sum(
        p.params_from(flow.src).rate_bps for p in scenario.paths_between(flow.src, flow.dst)
    )
    return float(record["total_bytes"]) * 8 / time_s / rate_bps


def _bbr_time(record: dict[str, Any]) -> float | None:
    for baseline in (record.get("baselines") or {}).get("baselines", []):
        if baseline["name"] == "tcp-bbr":
            return baseline["time_s"]
    return None


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f}, n={len(values)})"


def report(results: Path) -> str:
    by_scenario: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run_json in sorted(results.glob("*/*/run.json")):
        side = run_json.parent.parent.name.rstrip("0123456789")
        record = json.loads(run_json.read_text())
        by_scenario.setdefault(record["scenario"], {}).setdefault(side, []).append(record)
    lines = [
        "| scenario | aim | wangate (median, range) | TCP BBR, same runs "
        "| wangate / BBR per run | before (median, range) | load avg |",
        "|---|---|---|---|---|---|---|",
    ]
    budgets: list[str] = []
    for name, sides in by_scenario.items():
        scenario = load_scenario(name)
        after = sides.get("after", [])
        before = sides.get("before", [])
        multipath = len(scenario.paths) > 1
        if multipath:
            aim = f">= {AIM_MULTIPATH} of the sum"
        else:
            loss = scenario.paths[0].params_from(scenario.flows[0].src).loss
            ge = scenario.paths[0].params_from(scenario.flows[0].src)
            average = loss or (
                ge.ge_p / (ge.ge_p + ge.ge_r) * ge.ge_loss_in_bad if ge.ge_p else 0.0
            )
            aim = f">= {AIM_SHARE * (1 - average):.3f}, >= BBR"
        shares = [s for r in after if (s := _share(r, r["wangate"]["time_s"])) is not None]
        bbr = [s for r in after if (s := _share(r, _bbr_time(r))) is not None]
        ratios = [
            f"{(_bbr_time(r) or 0) / r['wangate']['time_s']:.2f}"
            for r in after
            if r["wangate"]["time_s"] and _bbr_time(r)
        ]
        old = [s for r in before if (s := _share(r, r["wangate"]["time_s"])) is not None]
        old_unfinished = f", {len(before) - len(old)} unfinished" if len(before) > len(old) else ""
        incomplete = sum(1 for r in after if not r["wangate"]["time_s"])
        loads = [v for r in after + before for v in r["wangate"].get("load_average") or []]
        unfinished = f", {incomplete} unfinished" if incomplete else ""
        lines.append(
            f"| {name} | {aim} | {_spread(shares)}{unfinished} | "
            f"{_spread(bbr) if not multipath else '-'} | {', '.join(ratios) or '-'} | "
            f"{_spread(old)}{old_unfinished} | "
            f"{f'{min(loads):.1f}-{max(loads):.1f}' if loads else '-'} |"
        )
        cols = []
        for side, records in (("before", before), ("after", after)):
            found = [b for r in records if (b := loss_budget(r, scenario)) is not None]
            if found:
                cols.append((side, found))
        if cols:
            budgets.append(f"\n{name}: median share of rate x time (runs)\n")
            budgets.append("| part | " + " | ".join(f"{s} ({len(f)})" for s, f in cols) + " |")
            budgets.append("|---" * (len(cols) + 1) + "|")
            for key, label in PARTS:
                cells = [f"{statistics.median(b['shares'][key] for b in f):.3f}" for _, f in cols]
                budgets.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines + budgets)


def _run_until_delivered(pair: Any, count: int) -> bool:
    from wangate.core.events import MessageDelivered

    return bool(pair.run_until(lambda: len(pair.events_of("bj", MessageDelivered)) >= count, 30.0))


def trade(seed: int = 1, messages: int = 24) -> str:
    """Bytes spent against time saved by up-front repair symbols (see the module notes)."""
    import random
    from unittest import mock

    import wangate.core.session as session_module
    from tests.fakelink import LinkProfile, SimulatedPair, make_header
    from wangate.core.events import MessageDelivered
    from wangate.core.outbound import CodingPolicy, OutboundQueue

    horizon = session_module.repair_horizon_bytes
    weighed = OutboundQueue._tail_repair_pays
    # (tail sizing, whether a message's own tail pays) per policy
    policies: dict[str, tuple[Any, Any]] = {
        "none up front": (lambda sender: 0, weighed),
        "every message's tail": (horizon, lambda queue, message: True),
        "tails weighed (the policy)": (horizon, weighed),
        "every block": (lambda sender: 1 << 60, weighed),
    }
    bulk = [
        "| loss | repair symbols up front on | repair / source bytes | 16 x 4 MiB: goodput / "
        "link rate |",
        "|---|---|---|---|",
    ]
    for loss in (0.01, 0.02, 0.05):
        link = LinkProfile(delay_s=0.040, drop_rate=loss, rate_bps=50e6)
        for label, (tail, pays) in policies.items():
            with (
                mock.patch.object(session_module, "repair_horizon_bytes", tail),
                mock.patch.object(OutboundQueue, "_tail_repair_pays", pays),
            ):
                pair = SimulatedPair(
                    {"a": link},
                    seed=seed,
                    coding=CodingPolicy(),
                    datagram_bytes=1432,
                    inbox_window_bytes=256 << 20,
                )
                rng = random.Random(seed)
                for i in range(16):
                    payload = rng.randbytes(4 << 20)
                    pair.submit("bj", make_header(f"m{i}", payload, step=i), payload)
                start_s = pair.now
                if not _run_until_delivered(pair, 16):
                    raise RuntimeError(f"{label}, loss {loss}: bulk transfer not delivered")
            status = pair.sessions["bj"].status()
            repair = (status["fec_bytes"] + status["repair_bytes"]) / status["source_bytes"]
            share = 16 * (4 << 20) * 8 / (pair.now - start_s) / link.rate_bps
            bulk.append(f"| {loss:.0%} | {label} | {repair:.3f} | {share:.3f} |")
    lines = [
        "| loss | repair symbols up front on | repair / source bytes | message time p50 / p95 "
        "/ max (ms) |",
        "|---|---|---|---|",
    ]
    for loss in (0.01, 0.05):
        link = LinkProfile(delay_s=0.040, drop_rate=loss, rate_bps=50e6)
        for label, (tail, pays) in policies.items():
            with (
                mock.patch.object(session_module, "repair_horizon_bytes", tail),
                mock.patch.object(OutboundQueue, "_tail_repair_pays", pays),
            ):
                pair = SimulatedPair(
                    {"a": link}, seed=seed, coding=CodingPolicy(), datagram_bytes=1432
                )
                rng = random.Random(seed)
                for i in range(messages):
                    payload = rng.randbytes(1 << 20)
                    pair.submit("bj", make_header(f"m{i}", payload, step=i), payload)
                    if not _run_until_delivered(pair, i + 1):
                        raise RuntimeError(f"{label}, loss {loss}: message {i} not delivered")
                    pair.run_for(0.2)  # the next message starts on an idle path
            times = sorted(e.elapsed_s * 1e3 for e in pair.events_of("bj", MessageDelivered))
            status = pair.sessions["bj"].status()
            repair = (status["fec_bytes"] + status["repair_bytes"]) / status["source_bytes"]
            p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
            lines.append(
                f"| {loss:.0%} | {label} | {repair:.3f} | "
                f"{statistics.median(times):.0f} / {p95:.0f} / {times[-1]:.0f} |"
            )
    return "\n".join([*lines, "", *bulk])


def controller_sim() -> str:
    """The congestion controller alone on the tests' fake bottleneck (``Simulation`` of
    tests/test_congestion.py: 20 Mbit/s, 40 ms, a drop-tail buffer, then random loss;
    seeds 1-3, t = 2-12 s): goodput / link rate and datagrams lost, per buffer and loss.
    Measures the ``wangate`` package first on ``sys.path`` (run it with another tree
    first on PYTHONPATH, from a folder without one, for a before/after)."""
    import tests.test_congestion as sim

    lines = [
        "| buffer | random loss | goodput / link rate | sent / link rate | datagrams lost |",
        "|---|---|---|---|---|",
    ]
    for buffer_bdp in (0.1, 0.5, 1.25):
        for loss in (0.0, 0.01, 0.05):
            runs = []
            for seed in (1, 2, 3):
                cc = sim._wangate()
                flow = sim.Flow(cc)
                link = sim.Link(buffer_bytes=buffer_bdp * sim.BDP, loss=loss, seed=seed)
                simulation = sim.Simulation(link, [flow])
                simulation.run(2.0)
                delivered, sent, lost = flow.delivered_bytes, flow.sent, flow.lost
                simulation.run(12.0)
                runs.append(
                    (
                        (flow.delivered_bytes - delivered) / 10.0 / sim.RATE_BPS,
                        (flow.sent - sent) * sim.MSS / 10.0 / sim.RATE_BPS,
                        flow.lost - lost,
                    )
                )
            good, busy, lost_n = zip(*runs, strict=True)
            lines.append(
                f"| {buffer_bdp:g} BDP | {loss:.0%} | {min(good):.3f}-{max(good):.3f} | "
                f"{min(busy):.3f}-{max(busy):.3f} | {min(lost_n)}-{max(lost_n)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loss_long",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("scenario", nargs="*")
    run.add_argument("--runs", type=int, default=3)
    run.add_argument("--before", help="folder with the wangate package to compare against")
    run.add_argument(
        "--after", help="folder with the wangate package to measure (default: this tree)"
    )
    run.add_argument("--results", default=str(DEFAULT_RESULTS))
    run.add_argument("--baseline-timeout-s", type=float, default=50.0)
    rep = sub.add_parser("report")
    rep.add_argument("results", nargs="?", default=str(DEFAULT_RESULTS))
    sub.add_parser("trade")
    sub.add_parser("sim", help="the congestion controller on the tests' fake bottleneck")
    args = parser.parse_args(argv)
    if args.command == "sim":
        print(controller_sim())
        return 0
    if args.command == "run":
        return _run(args)
    if args.command == "trade":
        print(trade())
        return 0
    print(report(Path(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
