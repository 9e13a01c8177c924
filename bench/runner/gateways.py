"""The sites' gateway daemons in a lab: started from a tree, up on every path, stopped.

One way for every lab benchmark (the runner, the suites' drivers, the collectives, the
training runs) to start gateways, so that ``--tree`` means the same in all of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import wangate
from bench.tree import THIS, Tree
from wangate.errors import WangateError
from wangate.lab import netns
from wangate.lab.lab import Lab

PATHS_UP_TIMEOUT_S = 20.0


def start_gateways(
    lab: Lab, configs: dict[str, Path], logs_dir: Path, prefix: str = "", tree: Tree = THIS
) -> tuple[dict[str, subprocess.Popen[bytes]], dict[str, Path]]:
    """``wangate run -c CONFIG`` of ``tree`` in each site of ``configs``, logging to
    ``logs_dir/gateway-<prefix><site>.log``; returns once every path of every site is up
    (the processes, the logs)."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    for site, config in configs.items():
        logs[site] = logs_dir / f"gateway-{prefix}{site}.log"
        with logs[site].open("wb") as log:
            processes[site] = lab.run_in(
                site,
                [sys.executable, "-m", "wangate", "run", "-c", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=tree.environ(),
            )
    try:
        wait_paths_up(lab, processes, logs)
    except BaseException:
        stop_gateways(processes)
        raise
    return processes, logs


def wait_paths_up(
    lab: Lab, gateways: dict[str, subprocess.Popen[bytes]], logs: dict[str, Path]
) -> None:
    expected = {site: len(lab.site_addresses(site)) for site in gateways}
    deadline = time.monotonic() + PATHS_UP_TIMEOUT_S
    for site, process in gateways.items():
        up = 0
        while True:
            rows: list[dict[str, object]] = []
            try:
                with wangate.Client(lab.gateway_socket(site)) as gw:
                    rows = gw.paths()
            except (WangateError, OSError):
                pass
            up = sum(1 for row in rows if row["state"] != "down")
            # with [workers] count = N a path has a row per worker: every one up
            if up == len(rows) >= expected[site]:
                break
            if process.poll() is not None:
                raise WangateError(
                    f"gateway {site} exited ({process.returncode}): {log_tail(logs[site])}"
                )
            if time.monotonic() > deadline:
                raise WangateError(
                    f"gateway {site}: {up} of {expected[site]} paths up after "
                    f"{PATHS_UP_TIMEOUT_S:.0f} s: {log_tail(logs[site])}"
                )
            time.sleep(0.1)


def stop_gateways(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    netns.terminate(list(processes.values()), grace_s=10.0)


def log_tail(file: Path, lines: int = 15) -> str:
    try:
        return "\n".join(file.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def process_cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of a live process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
