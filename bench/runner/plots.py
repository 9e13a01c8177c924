"""PNG plots of a runner record (``results/<scenario>/run.json``).

    python -m bench plots results/multipath_clean3/run.json

``goodput.png``: goodput per path per second, per direction, timeline changes marked;
``latency.png``: each message's latency (scheduled hand-over to delivery) over time,
critical ones highlighted, critical-route changes marked; ``paths.png``: smoothed RTT
and loss estimate per path. Without matplotlib nothing is drawn and an empty list is
returned (the runner says so).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _mark_timeline(ax: Any, record: dict[str, Any]) -> None:
    seen: set[float] = set()
    for event in record.get("timeline", []):
        if event["at_s"] in seen or len(seen) > 40:
            continue
        seen.add(event["at_s"])
        ax.axvline(event["at_s"], color="0.6", linestyle=":", linewidth=0.8)
        if len(record["timeline"]) <= 6:
            text = f"{event['path']}: " + ", ".join(f"{k}={v}" for k, v in event["set"].items())
            ax.annotate(
                text,
                (event["at_s"], 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color="0.4",
                rotation=90,
                va="top",
                ha="right",
            )


def _goodput(plt: Any, record: dict[str, Any], file: Path) -> None:
    directions = record["paths"]
    fig, axes = plt.subplots(
        len(directions), 1, figsize=(9, 3.2 * len(directions)), squeeze=False, sharex=True
    )
    for ax, (direction, paths) in zip(axes[:, 0], directions.items(), strict=True):
        total = None
        edges: list[float] = []
        for name, series in paths.items():
            # one value per whole second [k, k+1): draw each as a flat step to k+1
            edges = [*series["t_s"], len(series["t_s"])]
            values = series["goodput_mbps"]
            ax.stairs(
                values,
                edges,
                label=f"{name} ({series['nominal']['rate_mbps']:g} Mbit/s, "
                f"{series['nominal']['delay_ms']:g} ms)",
            )
            total = values if total is None else [a + b for a, b in zip(total, values, strict=True)]
        if total is not None and len(paths) > 1:
            ax.stairs(total, edges, color="k", linewidth=1.0, linestyle="--", label="sum")
        _mark_timeline(ax, record)
        ax.set_ylabel("Mbit/s received")
        ax.set_title(f"{record['scenario']}: wangate goodput per path, {direction}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("seconds after start")
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)


def _latency(plt: Any, record: dict[str, Any], file: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for critical, style in (
        (False, {"color": "tab:gray", "marker": ".", "label": "bulk"}),
        (True, {"color": "tab:red", "marker": "o", "label": "critical"}),
    ):
        points = [
            (m["scheduled_s"], m["latency_s"] * 1e3)
            for m in record["messages"]
            if m["critical"] == critical and m["latency_s"] is not None
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(
                xs, ys, linestyle="-" if critical else "none", linewidth=0.8, markersize=4, **style
            )
    directions = set(record["paths"])
    changes = [
        c
        for c in record["route_changes"]
        if c["source"] == "log" and c["t_s"] >= 0 and f"{c['site']}->{c['peer']}" in directions
    ]
    several = len(directions) > 1
    for number, change in enumerate(changes):
        ax.axvline(
            change["t_s"],
            color="tab:blue",
            linewidth=0.8,
            alpha=0.7,
            label="critical route change" if number == 0 else None,
        )
        if len(changes) <= 12:
            where = f"{change['site']}->{change['peer']}: " if several else ""
            ax.annotate(
                f"{where}{change['previous']}\u2192{change['current']}",
                (change["t_s"], 0.98),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color="tab:blue",
                rotation=90,
                va="top",
                ha="right",
            )
    _mark_timeline(ax, record)
    ax.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter

    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlim(left=0)
    ax.set_xlabel("scheduled hand-over, seconds after start")
    ax.set_ylabel("latency to delivery, ms")
    ax.set_title(f"{record['scenario']}: wangate message latency")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)


def _paths(plt: Any, record: dict[str, Any], file: Path) -> None:
    directions = record["paths"]
    fig, axes = plt.subplots(len(directions), 2, figsize=(11, 3.0 * len(directions)), squeeze=False)
    for row, (direction, paths) in enumerate(directions.items()):
        for name, series in paths.items():
            middles = [t + 0.5 for t in series["t_s"]]  # per-second values, at mid-second
            axes[row, 0].plot(middles, series["srtt_ms"], marker=".", label=name)
            loss = [None if v is None else v * 100 for v in series["loss"]]
            axes[row, 1].plot(middles, loss, marker=".", label=name)
        axes[row, 0].set_ylabel("srtt, ms")
        axes[row, 1].set_ylabel("loss estimate (max in second), %")
        for ax in axes[row]:
            _mark_timeline(ax, record)
            ax.set_title(f"{direction}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("seconds after start")
    fig.suptitle(f"{record['scenario']}: path estimates of the sending gateway")
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)


def write_plots(record: dict[str, Any], directory: Path) -> list[Path]:
    """Write the PNGs into ``directory``; [] when matplotlib is not installed."""
    plt = _pyplot()
    if plt is None:
        return []
    files = [directory / "goodput.png", directory / "latency.png", directory / "paths.png"]
    _goodput(plt, record, files[0])
    _latency(plt, record, files[1])
    _paths(plt, record, files[2])
    return files


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench plots", description=__doc__)
    parser.add_argument("run_json", nargs="+", type=Path, help="results/SCENARIO/run.json")
    args = parser.parse_args(argv)
    for file in args.run_json:
        written = write_plots(json.loads(file.read_text()), file.parent)
        if not written:
            print("matplotlib is not installed: .venv/bin/pip install matplotlib", file=sys.stderr)
            return 1
        print("\n".join(str(p) for p in written))
    return 0
