"""The per-path forwarder process: two TUN fds, one LinkEmulator per direction.

Started by the Lab with the TUN fds inherited and a JSON spec as its argument. It
reads packets from each TUN end, pushes them through that direction's emulator and
writes them to the other end when due. Control lines on stdin:

  ``start T0``  reset both directions to the initial parameters and play the
                timeline with t = 0 at monotonic time T0 (seconds)
  ``stats``     print one JSON line with counters and the CPU time used so far
  ``quit``      print the stats line and exit

Run directly only through the Lab: ``python -m wangate.lab.forwarder SPEC_JSON``.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any

from wangate.lab.link import LinkEmulator, LinkParams

_READ_BATCH = 256  # packets read from one fd before serving the other
_MAX_PACKET = 65536


class _Stop(Exception):
    pass


def _on_term(signum: int, frame: object) -> None:
    raise _Stop


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Forwarder:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.path = str(spec["path"])
        self.fd_a = int(spec["fd_a"])
        self.fd_b = int(spec["fd_b"])
        self.initial = {
            "a_to_b": LinkParams(**spec["a_to_b"]),
            "b_to_a": LinkParams(**spec["b_to_a"]),
        }
        seed = spec["seed"]
        self.links = {
            "a_to_b": LinkEmulator(self.initial["a_to_b"], f"{seed}/{self.path}/a_to_b"),
            "b_to_a": LinkEmulator(self.initial["b_to_a"], f"{seed}/{self.path}/b_to_a"),
        }
        # (at_s, direction, changes); applied in order once the timeline starts.
        self.timeline: list[tuple[float, str, dict[str, Any]]] = [
            (float(at), str(direction), dict(changes))
            for at, direction, changes in spec["timeline"]
        ]
        self.timeline_t0: float | None = None
        self.timeline_next = 0
        self.write_errors = 0
        self.started_at = time.monotonic()
        self.cpu_at_start = cpu_seconds()

    def start_timeline(self, t0: float) -> None:
        for direction, link in self.links.items():
            link.apply(self.initial[direction], t0)
        self.timeline_t0 = t0
        self.timeline_next = 0

    def _play_timeline(self, now: float) -> float | None:
        """Apply due changes; return when the next one is due."""
        if self.timeline_t0 is None:
            return None
        while self.timeline_next < len(self.timeline):
            at_s, direction, changes = self.timeline[self.timeline_next]
            due = self.timeline_t0 + at_s
            if due > now:
                return due
            for name in ("a_to_b", "b_to_a") if direction == "both" else (direction,):
                link = self.links[name]
                link.apply(link.params.updated(changes), now)
            self.timeline_next += 1
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "cpu_s": cpu_seconds() - self.cpu_at_start,
            "wall_s": time.monotonic() - self.started_at,
            "write_errors": self.write_errors,
            "a_to_b": self.links["a_to_b"].stats.as_dict(),
            "b_to_a": self.links["b_to_a"].stats.as_dict(),
        }

    def _control(self, line: str) -> bool:
        """Handle one control line; False means quit."""
        words = line.split()
        if not words or words[0] == "quit":
            return False
        if words[0] == "start":
            self.start_timeline(float(words[1]) if len(words) > 1 else time.monotonic())
            print(json.dumps({"started": self.timeline_t0}), flush=True)
        elif words[0] == "stats":
            print(json.dumps(self.stats()), flush=True)
        return True

    def run(self) -> None:
        fd_a, fd_b = self.fd_a, self.fd_b
        ctrl = sys.stdin.fileno()
        os.set_blocking(ctrl, False)
        poller = select.epoll()
        poller.register(fd_a, select.EPOLLIN)
        poller.register(fd_b, select.EPOLLIN)
        poller.register(ctrl, select.EPOLLIN)
        # packets read from fd X enter the emulator towards the other end
        inbound = {fd_a: self.links["a_to_b"], fd_b: self.links["b_to_a"]}
        outbound = ((self.links["a_to_b"], fd_b), (self.links["b_to_a"], fd_a))
        read, write, monotonic = os.read, os.write, time.monotonic
        pending_ctrl = b""
        next_change: float | None = None
        while True:
            deadlines = [
                d
                for d in (
                    outbound[0][0].next_deadline(),
                    outbound[1][0].next_deadline(),
                    next_change,
                )
                if d is not None
            ]
            timeout = max(0.0, min(deadlines) - monotonic()) if deadlines else -1.0
            events = poller.poll(timeout)
            now = monotonic()
            for fd, _mask in events:
                if fd == ctrl:
                    chunk = read(ctrl, 4096)
                    if not chunk:
                        return
                    pending_ctrl += chunk
                    while b"\n" in pending_ctrl:
                        line, pending_ctrl = pending_ctrl.split(b"\n", 1)
                        if not self._control(line.decode()):
                            return
                    next_change = self._play_timeline(now)
                    continue
                link = inbound[fd]
                push = link.push
                for _ in range(_READ_BATCH):
                    try:
                        push(read(fd, _MAX_PACKET), now)
                    except BlockingIOError:
                        break
            now = monotonic()
            if next_change is not None and next_change <= now:
                next_change = self._play_timeline(now)
            for link, out_fd in outbound:
                for packet in link.pop_ready(now):
                    try:
                        write(out_fd, packet)
                    except OSError:
                        self.write_errors += 1


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the Lab decides when we stop
    forwarder = Forwarder(spec)
    with contextlib.suppress(_Stop):
        forwarder.run()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(json.dumps(forwarder.stats()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
