"""How long the daemon's event loop stalls, as systemd's watchdog sees it.

Two loopback sites; each daemon pings a notify socket of ours every 50 ms
(``WATCHDOG_USEC=100000``). The gaps between pings are the loop's stalls plus 50 ms:
measured idle, then while one site sends bulk messages to the other. The largest gap
under load is what ``WatchdogSec=`` must exceed with room to spare. Also: how long a
SIGHUP reload takes from the signal to the new path being up.

    .venv/bin/python -m bench robustness watchdog [--mib 32] [--messages 4]
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from wangate.errors import WangateError
from wangate.loopback import SiteProcess, write_site_configs

INTERVAL_S = 0.05


class Pings:
    def __init__(self) -> None:
        self.name = f"@wangate-bench-{secrets.token_hex(6)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.settimeout(0.1)
        self.at: list[float] = []
        self.stop = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self.stop:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            if data == b"WATCHDOG=1":
                self.at.append(time.monotonic())

    def gaps_ms(self, start: float, end: float) -> list[float]:
        times = [t for t in self.at if start <= t <= end]
        return [(b - a) * 1000 for a, b in itertools.pairwise(times)]


def start(site: SiteProcess, pings: Pings) -> subprocess.Popen[bytes]:
    env = dict(os.environ, NOTIFY_SOCKET=pings.name, WATCHDOG_USEC=str(int(INTERVAL_S * 2e6)))
    with site.log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "wangate", "run", "-c", str(site.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )


def paths_up(site: SiteProcess) -> int:
    try:
        with site.client() as gw:
            return sum(1 for row in gw.paths() if row["state"] != "down")
    except (WangateError, OSError):
        return -1


def wait(condition: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.01)


def summary(gaps: list[float]) -> str:
    if not gaps:
        return "no pings"
    ordered = sorted(gaps)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    median = ordered[len(ordered) // 2]
    return f"{len(gaps)} gaps, median {median:.0f} ms, p99 {p99:.0f} ms, max {ordered[-1]:.0f} ms"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench robustness watchdog",
    )
    parser.add_argument("--mib", type=int, default=32, help="size of each message")
    parser.add_argument("--messages", type=int, default=4)
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="wangate-wd-"))
    bj, sh = write_site_configs(directory, 2, 2, mtu=9000)
    full = sh.config_path.read_text()
    head, _, rest = full.partition("[[peers.paths]]\n")
    one_path = head + "[[peers.paths]]\n" + rest.split("[[peers.paths]]\n")[0]
    sh.config_path.write_text(one_path)  # sh dials one path; the second comes by reload
    pings = {"bj": Pings(), "sh": Pings()}
    processes = [start(bj, pings["bj"]), start(sh, pings["sh"])]
    try:
        wait(lambda: paths_up(sh) == 1)
        idle_from = time.monotonic()
        time.sleep(3)
        idle_to = time.monotonic()

        sh.config_path.write_text(full)
        hup_at = time.monotonic()
        processes[1].send_signal(signal.SIGHUP)
        wait(lambda: paths_up(sh) == 2)
        reload_s = time.monotonic() - hup_at

        array = np.random.default_rng(1).standard_normal(args.mib << 18, dtype=np.float32)
        load_from = time.monotonic()
        with bj.client() as sender, sh.client() as receiver:
            for step in range(args.messages):
                sender.send("sh", "bulk", array, step=step)
            for step in range(args.messages):
                got = receiver.recv("bulk", source="bj", step=step, timeout=120)
                assert got.tobytes() == array.tobytes()
        load_to = time.monotonic()
        megabits = args.messages * array.nbytes * 8 / 1e6
        print(f"watchdog pinged every {INTERVAL_S * 1000:.0f} ms; gaps between pings:")
        for name, ping in pings.items():
            print(f"  {name} idle: {summary(ping.gaps_ms(idle_from, idle_to))}")
            print(f"  {name} bulk: {summary(ping.gaps_ms(load_from, load_to))}")
        print(
            f"bulk: {args.messages} x {args.mib} MiB in {load_to - load_from:.1f} s "
            f"({megabits / (load_to - load_from):.0f} Mbit/s)"
        )
        print(f"reload: SIGHUP to the added path up in {reload_s * 1000:.0f} ms")
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)
        for ping in pings.values():
            ping.stop = True
