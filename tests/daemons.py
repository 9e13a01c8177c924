"""Real daemons as subprocesses, and a notify socket like systemd's, for the tests."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from wangate.errors import WangateError
from wangate.loopback import SiteProcess


class NotifySocket:
    """What systemd's notify socket would receive: (monotonic time, message) pairs."""

    def __init__(self) -> None:
        self.name = f"@wangate-test-{secrets.token_hex(8)}"  # abstract: no path limits
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.settimeout(0.1)
        self.received: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            with self._lock:
                self.received.append((time.monotonic(), data.decode()))

    def messages(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self.received)

    def lines(self, prefix: str) -> list[tuple[float, str]]:
        """Every ``prefix...`` line of every message, in order."""
        return [
            (at, line)
            for at, message in self.messages()
            for line in message.split("\n")
            if line.startswith(prefix)
        ]

    def wait_for(self, what: Callable[[], bool], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not what():
            if time.monotonic() > deadline:
                raise AssertionError(f"not received in {timeout_s} s: {self.messages()[-10:]}")
            time.sleep(0.02)

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


def start_daemon(site: SiteProcess, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with site.log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "wangate", "-v", "run", "-c", str(site.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )


def wait_serving(site: SiteProcess, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            with site.client() as gw:
                gw.ping()
            return
        except (WangateError, OSError):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(site.log_path.read_text()) from None
            time.sleep(0.05)


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


async def poll_until(
    condition: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.01
) -> None:
    """In an event loop running gateways: return once ``condition()`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(interval_s)
