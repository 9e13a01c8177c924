"""Watching gateways: their path tables every 100 ms, and route changes in their logs.

Trainers cannot see which path carried which bytes, so the runner samples
``paths()`` of every site's gateway (over its Unix socket, which is reachable from
outside the namespace) and keeps the per-path counters and estimates with a
``time.monotonic_ns()`` stamp, the clock the trainers use too.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import wangate
from wangate.errors import WangateError

SAMPLE_INTERVAL_S = 0.1
KEPT_KEYS = (
    "peer",
    "path",
    "state",
    "srtt_ms",
    "min_rtt_ms",
    "jitter_ms",
    "loss",
    "loss_samples",
    "rate_mbps",
    "sent_bytes",
    "acked_bytes",
    "lost_bytes",
    "recv_bytes",
    "inflight_bytes",
    "role",
    "peer_role",
)

# "2025-11-30 04:58:07,123 WARNING wangate.daemon: critical route to sh: a -> b (why)"
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\w+) [\w.]+: (.*)$")
_ROUTE = re.compile(r"^critical route to (\S+): (\S+) -> (\S+) \((.*)\)$")


class PathMonitor:
    """A thread sampling ``paths()`` of every gateway until ``stop()``."""

    def __init__(self, sockets: dict[str, Path], interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.sockets = sockets
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []  # {"t_ns", "site", "rows": [...]}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="path-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        clients: dict[str, wangate.Client] = {}
        try:
            for site, socket in self.sockets.items():
                clients[site] = wangate.Client(socket)
            next_at = time.monotonic()
            while not self._stop.is_set():
                for site, gw in clients.items():
                    try:
                        rows = gw.paths()
                    except WangateError as exc:
                        self.errors.append(f"{site}: {exc}")
                        continue
                    self.samples.append(
                        {
                            "t_ns": time.monotonic_ns(),
                            "site": site,
                            "rows": [{k: row.get(k) for k in KEPT_KEYS} for row in rows],
                        }
                    )
                next_at += self.interval_s
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except WangateError as exc:
            self.errors.append(str(exc))
        finally:
            for gw in clients.values():
                with contextlib.suppress(Exception):
                    gw.close()


def wall_to_monotonic_offset_ns() -> int:
    """``time.time_ns() - time.monotonic_ns()`` now (log lines carry wall-clock times)."""
    return time.time_ns() - time.monotonic_ns()


def read_log_events(log_file: Path, site: str, offset_ns: int) -> list[dict[str, Any]]:
    """WARNING-and-above lines of a gateway log, with monotonic times.

    A "critical route" line becomes ``kind="route"`` with ``peer``, ``previous``,
    ``current`` and ``reason``; other lines keep their text (``kind="log"``).
    The log's times have millisecond resolution and the host's local time zone.
    """
    events: list[dict[str, Any]] = []
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return events
    for line in lines:
        match = _LOG_TIME.match(line)
        if not match or match.group(3) not in ("WARNING", "ERROR", "CRITICAL"):
            continue
        wall = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
        t_ns = int(wall * 1e9) + int(match.group(2)) * 1_000_000 - offset_ns
        text = match.group(4)
        route = _ROUTE.match(text)
        if route:
            events.append(
                {
                    "t_ns": t_ns,
                    "site": site,
                    "kind": "route",
                    "peer": route.group(1),
                    "previous": route.group(2),
                    "current": route.group(3),
                    "reason": route.group(4),
                }
            )
        else:
            events.append(
                {"t_ns": t_ns, "site": site, "kind": "log", "level": match.group(3), "text": text}
            )
    return events
