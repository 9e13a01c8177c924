"""Run the atheris harnesses, a few at a time, and account CPU time and executions.

Usage (from the repository root)::

    .venv/bin/python tests/fuzz/campaign.py --out /tmp/wangate-fuzz --seconds 300 \\
        [--jobs 2] [target[:seconds] ...]

Each target runs ``nice -n 10 python tests/fuzz/fuzz_<target>.py`` for ``--seconds`` of
wall time (or the seconds given after its name) with its working corpus in
``OUT/<target>/corpus`` (seeded from ``tests/fuzz/corpus/<target>``) and crash inputs in
``OUT/<target>/``. CPU seconds come from the kernel's accounting of each finished child
(``wait4``), executions and coverage from libFuzzer's final statistics. One JSON line per
run is appended to ``OUT/runs.jsonl``; ``--report`` sums them up per target.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = sorted(path.stem.removeprefix("fuzz_") for path in HERE.glob("fuzz_*.py"))


def start(target: str, out: Path, seconds: int) -> tuple[subprocess.Popen[bytes], Path]:
    work = out / target
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    log = work / f"run-{time.strftime('%H%M%S')}.log"
    command = [
        "nice",
        "-n",
        "10",
        sys.executable,
        str(HERE / f"fuzz_{target}.py"),
        str(work / "corpus"),
        str(HERE / "corpus" / target),
        f"-max_total_time={seconds}",
        f"-artifact_prefix={work}/",
        "-print_final_stats=1",
        "-rss_limit_mb=2048",
        "-timeout=20",
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    return process, log


def summarise(
    target: str, log: Path, cpu_s: float, wall_s: float, status: int
) -> dict[str, object]:
    text = log.read_text(errors="replace")
    execs = re.findall(r"stat::number_of_executed_units: (\d+)", text)
    cov = re.findall(r"cov: (\d+) ft: (\d+)", text)
    units = re.findall(r"Test unit written to (\S+)", text)
    # libFuzzer also writes inputs that merely took long (slow-unit-*): not crashes.
    crashes = [unit for unit in units if "/slow-unit-" not in unit]
    slow = [unit for unit in units if "/slow-unit-" in unit]
    return {
        "target": target,
        "log": str(log),
        "exit": status,
        "cpu_s": round(cpu_s, 1),
        "wall_s": round(wall_s, 1),
        "execs": int(execs[-1]) if execs else None,
        "cov": int(cov[-1][0]) if cov else None,
        "ft": int(cov[-1][1]) if cov else None,
        "crashes": crashes,
        "slow_units": slow,
    }


def report(runs: Path) -> None:
    """One line per target: runs, CPU seconds, executions, best coverage, crashes."""
    totals: dict[str, dict[str, int | float]] = {}
    for line in runs.read_text().splitlines():
        run = json.loads(line)
        empty = dict.fromkeys(("runs", "cpu_s", "execs", "cov", "ft", "crashes"), 0)
        total = totals.setdefault(run["target"], empty)
        total["runs"] += 1
        total["cpu_s"] += run["cpu_s"]
        total["execs"] += run["execs"] or 0
        total["cov"] = max(total["cov"], run["cov"] or 0)
        total["ft"] = max(total["ft"], run["ft"] or 0)
        total["crashes"] += sum("/slow-unit-" not in unit for unit in run["crashes"])
    print("| target | runs | CPU h | executions | cov (edges) | ft | crashes |")
    print("|---|---|---|---|---|---|---|")
    for target, t in sorted(totals.items()):
        print(
            f"| {target} | {t['runs']} | {t['cpu_s'] / 3600:.2f} | {t['execs']:,} | {t['cov']} "
            f"| {t['ft']} | {t['crashes']} |"
        )
    cpu_s = sum(t["cpu_s"] for t in totals.values())
    execs = sum(t["execs"] for t in totals.values())
    runs_total = sum(t["runs"] for t in totals.values())
    print(f"| total | {runs_total} | {cpu_s / 3600:.2f} | {execs:,} | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="sum up OUT/runs.jsonl")
    parser.add_argument("targets", nargs="*", default=TARGETS)
    args = parser.parse_args()
    if args.report:
        report(args.out / "runs.jsonl")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    queue = [item.partition(":") for item in args.targets]
    running: dict[int, tuple[str, Path, float]] = {}
    while queue or running:
        while queue and len(running) < args.jobs:
            target, _, seconds = queue.pop(0)
            process, log = start(target, args.out, int(seconds or args.seconds))
            running[process.pid] = (target, log, time.monotonic())
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        target, log, began = running.pop(pid)
        cpu_s = usage.ru_utime + usage.ru_stime
        record = summarise(target, log, cpu_s, time.monotonic() - began, status)
        with (args.out / "runs.jsonl").open("a") as sink:
            sink.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
