"""What touching memory costs right after the core slept, on this machine.

    python -m bench localapi cold [--gap-ms 50] [--rounds 40]

``cold_pages.c`` (built with gcc into ``results/build/cold_pages``) reads one byte from
each of 256 pages (1 MiB) back to back (warm) and after sleeping ``--gap-ms`` (cold),
then once more right after the cold pass, in memory backed by 4 KiB pages and by a
transparent huge page (``MADV_HUGEPAGE``). A critical message every 50 ms finds every
process on its way in the cold row: what a step of its hand-over costs is mostly how
many distinct pages (code and objects) it touches, not how much it computes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.common import RESULTS
from bench.transport.floor import build

SOURCE = Path(__file__).resolve().with_name("cold_pages.c")
BINARY = RESULTS / "build" / "cold_pages"


KEYS = (
    "pages",
    "gap_us",
    "rounds",
    "small_warm_us",
    "small_cold_us",
    "small_cold_second_us",
    "huge_warm_us",
    "huge_cold_us",
    "huge_cold_second_us",
    "anon_huge_kb",
)


def run_probe(binary: Path, gap_ms: float, rounds: int) -> dict[str, Any]:
    """The probe's medians (``KEYS``); ``CalledProcessError`` if it failed."""
    done = subprocess.run(
        [str(binary), str(int(gap_ms * 1000)), str(rounds)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench localapi cold")
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args(argv)
    result = run_probe(build(BINARY, SOURCE), args.gap_ms, args.rounds)
    pages = result["pages"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}")
    print(
        f"one byte from each of {pages} pages, median of {result['rounds']} rounds, "
        f"microseconds (per page in brackets); huge pages backing: {result['anon_huge_kb']} kB\n"
    )
    print(f"| memory | warm | after {args.gap_ms:g} ms asleep | right after that |")
    print("|---|---|---|---|")
    for name, key in (("4 KiB pages", "small"), ("a transparent huge page", "huge")):
        cells = [
            f"{result[key + suffix]:.1f} ({result[key + suffix] / pages:.3f})"
            for suffix in ("_warm_us", "_cold_us", "_cold_second_us")
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0
