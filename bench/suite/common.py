"""What the suites share: where results live, reading the runner's records, the number
formats of the tables, and the sites' gateways for the drivers that use the Lab API."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "results"


class Gateways:
    """The sites' gateways in a lab, started the way the runner starts them."""

    def __init__(self, lab: Any, logs_dir: Path, gateway_src: Path | None = None) -> None:
        """``gateway_src``: a folder holding another ``wangate`` package to run (a
        baseline tree, e.g. ``git archive main wangate | tar -x -C DIR``)."""
        import wangate
        from wangate.errors import WangateError

        self.lab = lab
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        logs_dir.mkdir(parents=True, exist_ok=True)
        self.logs = {}
        for site, config in lab.write_gateway_configs().items():
            self.logs[site] = logs_dir / f"gateway-{site}.log"
            with self.logs[site].open("wb") as log:
                self.processes[site] = lab.run_in(
                    site,
                    [sys.executable, "-m", "wangate", "run", "-c", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ, PYTHONUNBUFFERED="1"),
                    **({} if gateway_src is None else {"cwd": str(gateway_src)}),
                )
        deadline = time.monotonic() + 20.0
        for site in self.processes:
            expected = len(lab.site_addresses(site))
            while True:
                try:
                    with wangate.Client(lab.gateway_socket(site)) as gw:
                        if sum(1 for r in gw.paths() if r["state"] != "down") == expected:
                            break
                except (WangateError, OSError):
                    pass
                if time.monotonic() > deadline or self.processes[site].poll() is not None:
                    raise RuntimeError(f"gateway {site}: paths not up; see {self.logs[site]}")
                time.sleep(0.1)

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def sent_bytes(gw: Any, peer: str) -> dict[str, int]:
    return {r["path"]: int(r["sent_bytes"] or 0) for r in gw.paths() if r["peer"] == peer}


def link_bytes(lab: Any, direction: str = "a_to_b") -> dict[str, int]:
    return {name: int(s[direction]["delivered_bytes"]) for name, s in lab.link_stats().items()}


def pushed_bytes(lab: Any, direction: str = "a_to_b") -> dict[str, int]:
    return {name: int(s[direction]["pushed_bytes"]) for name, s in lab.link_stats().items()}


def load_record(name: str) -> dict[str, Any] | None:
    file = RESULTS / name / "run.json"
    return json.loads(file.read_text()) if file.exists() else None


def fec_overhead(record: dict[str, Any], src: str = "bj", dst: str = "sh") -> dict[str, Any]:
    status = record.get("gateway_status") or record["wangate"].get("gateway_status", {})
    peer = status.get(src, {}).get("peers", {}).get(dst, {})
    rx = status.get(dst, {}).get("peers", {}).get(src, {})
    source = peer.get("source_bytes") or 0
    fec, repair = peer.get("fec_bytes") or 0, peer.get("repair_bytes") or 0
    return {
        "source_bytes": source,
        "fec_bytes": fec,
        "repair_bytes": repair,
        "overhead": (fec + repair) / source if source else None,
        "fec_repair_per_block": peer.get("fec_repair_per_block"),
        "blocks_decoded": rx.get("blocks_decoded"),
    }


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def fmt(value: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def met(ok: bool | None) -> str:
    return "?" if ok is None else ("yes" if ok else "**no**")
