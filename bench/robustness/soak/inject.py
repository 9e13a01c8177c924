"""The soak's hands on the daemons: SIGSTOP/SIGCONT, SIGKILL and restart, a worker's
SIGKILL, and their memory (Linux /proc).

Daemons are started in their site's namespace by ``Lab.run_in`` (``ip netns exec``
execs the daemon, so the process started is the daemon) with the tree's environment,
logging to one file per site that a restart appends to. Restarts must come from the
thread that started the lab's processes: a child started from a thread is sent
SIGTERM when that thread ends (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.runner.gateways import wait_paths_up
from bench.tree import Tree
from wangate.lab.lab import Lab

MiB = 1 << 20


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (a coordinator's workers)."""
    found: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.extend(int(c) for c in listing.read_text().split())
    return found


def worker_pid(daemon_pid: int, index: int) -> int | None:
    """The pid of worker ``index`` of a coordinator (by its ``--index`` argument)."""
    for pid in children(daemon_pid):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if (
                b"wangate.workers.worker" in argv
                and argv[argv.index(b"--index") + 1] == str(index).encode()
            ):
                return pid
    return None


def rss_mib(pid: int) -> float:
    """VmRSS of a live process, MiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Daemons:
    """Each site's daemon in the lab: the process, its log, how often it was restarted."""

    def __init__(
        self,
        lab: Lab,
        configs: dict[str, Path],
        processes: dict[str, subprocess.Popen[bytes]],
        logs: dict[str, Path],
        tree: Tree,
    ) -> None:
        self.lab, self.configs, self.processes, self.logs, self.tree = (
            lab,
            configs,
            processes,
            logs,
            tree,
        )
        self.restarts = dict.fromkeys(processes, 0)

    def pid(self, site: str) -> int:
        return self.processes[site].pid

    def rss(self, site: str) -> dict[str, float]:
        """The daemon's RSS and its workers' together, MiB."""
        pid = self.pid(site)
        workers = [p for p in children(pid)]
        return {
            "daemon_mib": round(rss_mib(pid), 1),
            "workers_mib": round(sum(rss_mib(p) for p in workers), 1),
            "workers": len(workers),
        }

    def stop(self, site: str, seconds: float) -> None:
        """SIGSTOP the daemon and its workers (a host held up), SIGCONT ``seconds`` later."""
        pids = [self.pid(site), *children(self.pid(site))]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def kill(self, site: str) -> None:
        """SIGKILL the daemon (its workers die with it) and reap it."""
        process = self.processes[site]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def restart(self, site: str) -> float:
        """Start the site's daemon again; returns the seconds until its paths were up (or
        raises after the runner's timeout)."""
        started = time.monotonic()
        with self.logs[site].open("ab") as log:
            self.processes[site] = self.lab.run_in(
                site,
                [sys.executable, "-m", "wangate", "run", "-c", str(self.configs[site])],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.tree.environ(),
            )
        self.restarts[site] += 1
        wait_paths_up(self.lab, {site: self.processes[site]}, {site: self.logs[site]})
        return time.monotonic() - started

    def kill_worker(self, site: str, index: int) -> int | None:
        """SIGKILL worker ``index`` of the site; its pid, or None if it has none now."""
        pid = worker_pid(self.pid(site), index)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pid
