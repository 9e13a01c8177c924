"""Loss: one lossy path (random loss, bursts), and three paths with one lossy.

    sudo .venv/bin/python -m bench suite loss          # the table below, from the runner
    sudo .venv/bin/python -m bench transport loss run --runs 3 [--tree REV] [NAME ...]
    .venv/bin/python -m bench transport loss report [results/loss_long]
    .venv/bin/python -m bench transport loss trade     # sans-IO, fake link and clock, ~5 min
    .venv/bin/python -m bench transport loss sim [--tree REV]   # the controller alone

**The suite's table** (``rows``): each 64 MiB scenario runs through the runner
(``python -m bench run``) with TCP baselines; ``loss_01``, ``loss_1`` and
``loss_3paths`` run a second time without baselines into ``results/loss_repeat/``. The
table reads the records on disk: wangate's goodput as a share of the link rate against
its aim, against each baseline, the FEC overhead, the emulator's drop counters and the
gateways' CPU.

**Where the link rate goes, against TCP BBR.** ``run`` plays each 128 MiB scenario
(default: every ``loss_long_*``, ``loss_long_3paths`` last) ``--runs`` times in the WAN
lab: this tree's gateways with TCP BBR in the same lab right after (single-path
scenarios), then each ``--tree``'s gateways without baselines, alternately, so that all
see the same machine. Records go to ``RESULTS/<tree>/run<i>/<scenario>/run.json``.
``report`` prints, per scenario, goodput as a share of the link rate (median, range over
runs), BBR's, their ratio per run, the aim, each other tree's share, and the median loss
budget (``bench.runner.budget``) of each tree.

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

``sim`` runs the congestion controller alone on the tests' fake bottleneck, with this
tree's code and each ``--tree``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import tree as trees
from bench.common import RESULTS, ROOT, fec_overhead, fmt, load_record, met
from bench.runner.budget import PARTS, loss_budget
from wangate.lab.scenario import SCENARIO_DIR, load_scenario

SINGLE_PATH = ("loss_01", "loss_1", "loss_5", "loss_burst")
MULTI_PATH = ("loss_3paths",)
REPEATED = ("loss_01", "loss_1", "loss_3paths")
REPEAT_DIR = "loss_repeat"
# 128 MiB against TCP BBR, with the loss budget in each record (``run`` below compares
# trees alternately and tabulates them)
LONG = ("loss_long_01", "loss_long_1", "loss_long_2", "loss_long_5", "loss_long_burst",
        "loss_long_3paths")  # fmt: skip
AIMS = {  # wangate goodput / link rate
    "loss_01": 0.85,
    "loss_1": 0.75,
    "loss_5": 0.50,
    "loss_burst": 0.65,
    "loss_3paths": 0.80,
}


def rows() -> list[str]:
    """The table of the last runs on disk."""
    lines = ["| scenario | metric | measured | aim | met? |", "|---|---|---|---|---|"]
    for name in (*SINGLE_PATH, *MULTI_PATH):
        record = load_record(name)
        if record is None:
            lines.append(f"| {name} | not run | | | |")
            continue
        wg = record["wangate"]
        total = record["total_bytes"]
        rate = sum(p["nominal"]["rate_mbps"] for d in record["paths"].values() for p in d.values())
        if wg["complete"]:
            goodput = total * 8 / wg["time_s"] / 1e6
            done = f"{wg['time_s']:.2f} s"
        else:
            goodput = wg["delivered_bytes"] * 8 / wg["timeout_s"] / 1e6
            done = (
                f"not done: {wg['delivered_bytes'] / 2**20:.0f} of {total / 2**20:.0f} MiB "
                f"in {wg['timeout_s']:.0f} s"
            )
        aim = AIMS[name]
        ratio = goodput / rate
        lines.append(
            f"| {name} | wangate goodput / link rate ({rate:g} Mbit/s) | "
            f"{goodput:.1f} Mbit/s = **{ratio:.3f}** ({done}; intact "
            f"{wg['intact']}/{wg['messages']}) | >= {aim:.2f} | "
            f"{met(wg['complete'] and ratio >= aim)} |"
        )
        repeat = load_record(f"{REPEAT_DIR}/{name}")
        if repeat is not None and repeat["wangate"]["complete"]:
            again = total * 8 / repeat["wangate"]["time_s"] / 1e6
            lines.append(
                f"| {name} | the same, second run (results/{REPEAT_DIR}/{name}, no "
                f"baselines) | {again:.1f} Mbit/s = **{again / rate:.3f}**; FEC "
                f"overhead {fmt(fec_overhead(repeat)['overhead'], '.3f')} | >= {aim:.2f} | "
                f"{met(again / rate >= aim)} |"
            )
        for base in (record.get("baselines") or {}).get("baselines", []):
            timeout = record["baselines"]["timeout_s"]
            if base["time_s"] is not None:
                b_goodput = total * 8 / base["time_s"] / 1e6
                b_note = f"{base['time_s']:.2f} s, {b_goodput:.1f} Mbit/s"
                rel = f"{goodput / b_goodput:.2f}"
            else:
                b_goodput = base["delivered_bytes"] * 8 / timeout / 1e6
                b_note = (
                    f"capped at {timeout:.0f} s: {base['delivered_bytes'] / 2**20:.0f} of "
                    f"{total / 2**20:.0f} MiB done, <= {b_goodput:.1f} Mbit/s"
                )
                rel = f">= {goodput / b_goodput:.1f}" if b_goodput else "inf (0 bytes done)"
            lines.append(f"| {name} | wangate / {base['name']} goodput | {rel} ({b_note}) | | |")
        fec = fec_overhead(record)
        lines.append(
            f"| {name} | FEC overhead (fec+repair)/source | "
            f"{fmt(fec['overhead'], '.3f')} (fec {fec['fec_bytes'] / 1e6:.1f} MB, "
            f"repair {fec['repair_bytes'] / 1e6:.2f} MB, "
            f"source {fec['source_bytes'] / 1e6:.1f} MB, "
            f"{fec['fec_repair_per_block']} repair/block at the end, "
            f"{fec['blocks_decoded']} blocks decoded) | | |"
        )
        links = record["link_stats"]["wangate_run"]
        drops = {
            k: sum(p["a_to_b"][k] for p in links.values())
            for k in ("pushed_packets", "dropped_queue", "dropped_loss", "dropped_burst")
        }
        cpu = record["wangate"].get("gateway_cpu", {})
        lines.append(
            f"| {name} | emulator bj->sh: packets, queue drops, random/burst loss drops; "
            f"gateway CPU | {drops['pushed_packets']}, {drops['dropped_queue']}, "
            f"{drops['dropped_loss']}/{drops['dropped_burst']}; "
            + ", ".join(f"{s} {c['cpu_s']:.1f} s ({c['core_share']:.0%})" for s, c in cpu.items())
            + " | | |"
        )
    return lines


DEFAULT_RESULTS = RESULTS / "loss_long"
AIM_SHARE = 0.92  # of (1 - loss) x rate, one path
AIM_MULTIPATH = 0.88  # of the sum of the path rates


def default_scenarios() -> list[str]:
    names = sorted(p.stem for p in SCENARIO_DIR.glob("loss_long_*.toml"))
    return [*(n for n in names if n != "loss_long_3paths"), "loss_long_3paths"]  # once, last


def _run(args: argparse.Namespace) -> int:
    from bench.runner.cli import command_line, run_rounds

    names = args.scenario or default_scenarios()
    results = Path(args.results)
    run_rounds(
        [load_scenario(n) for n in names],
        trees.trees(args),
        args.runs,
        results,
        lambda scenario: ("tcp-bbr",) if len(scenario.paths) == 1 else (),
        lambda scenario, tree: command_line(
            ["transport", "loss", "run", *(f"--tree={t}" for t in args.tree), scenario.name]
        ),
        baseline_timeout_s=args.baseline_timeout_s,
        plots=False,
        quiet=True,
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
    """The tables of the records under ``results/<tree>/run<i>/``: this tree's ("after")
    against the other trees' together ("before"); a single run of this tree alone
    writes ``results/<scenario>/`` instead (``run_rounds``)."""
    by_scenario: dict[str, dict[str, list[dict[str, Any]]]] = {}
    on_disk = [(p, p.parents[2].name == trees.THIS.slug) for p in results.glob("*/run*/*/run.json")]
    on_disk += [(p, True) for p in results.glob("*/run.json")]
    for run_json, this in sorted(on_disk):
        side = "after" if this else "before"
        record = json.loads(run_json.read_text())
        by_scenario.setdefault(record["scenario"], {}).setdefault(side, []).append(record)
    lines = [
        "| scenario | aim | wangate (median, range) | TCP BBR, same runs "
        "| wangate / BBR per run | other trees (median, range) | load avg |",
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

    import wangate.core.sending as sending_module
    from tests.fakelink import LinkProfile, SimulatedPair, make_header
    from wangate.core.events import MessageDelivered
    from wangate.core.outbound import CodingPolicy, OutboundQueue

    horizon = sending_module.repair_horizon_bytes
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
                mock.patch.object(sending_module, "repair_horizon_bytes", tail),
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
                mock.patch.object(sending_module, "repair_horizon_bytes", tail),
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
    seeds 1-3, t = 2-12 s): goodput / link rate and datagrams lost, per buffer and loss,
    of the ``wangate`` package this process imports."""
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


def _sim(args: argparse.Namespace) -> int:
    """``controller_sim`` of each tree, each in a process of its own: that tree's
    ``wangate``, this tree's tests and bench."""
    for tree in trees.trees(args):
        env = tree.environ({**os.environ, "PYTHONPATH": str(ROOT)})
        code = "from bench.transport.loss import controller_sim; print(controller_sim())"
        table = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        )
        print(f"{tree.label}:\n{table.stdout}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench transport loss",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the 128 MiB scenarios beside TCP BBR, in the lab")
    run.add_argument("scenario", nargs="*")
    run.add_argument("--runs", type=int, default=3)
    run.add_argument("--results", default=str(DEFAULT_RESULTS))
    run.add_argument("--baseline-timeout-s", type=float, default=50.0)
    trees.add_argument(run)
    rep = sub.add_parser("report", help="the tables of the runs on disk")
    rep.add_argument("results", nargs="?", default=str(DEFAULT_RESULTS))
    sub.add_parser("trade", help="bytes spent against time saved (sans-IO)")
    sim = sub.add_parser("sim", help="the congestion controller on the tests' fake bottleneck")
    trees.add_argument(sim)
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "sim":
        return _sim(args)
    if args.command == "trade":
        print(trade())
    else:
        print(report(Path(args.results)))
    return 0
