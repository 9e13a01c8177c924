"""Checked traffic between two loopback sites while something hostile happens to them.

Bulk messages both ways (256 KiB every 50 ms by default, or as fast as the receivers
keep up) and a small critical message from bj to sh every 20 ms; every message is
checked byte for byte and every critical one timed. Used by the flood test and the
flood benchmark to show that real traffic goes on, intact, under attack.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from wangate.errors import RecvTimeout
from wangate.loopback import LoopbackSites

BULK_BYTES = 256 * 1024
BULK_EVERY_S = 0.05  # 40 Mbit/s each way: well within what both daemons and checks keep up with
CRITICAL_EVERY_S = 0.02
CRITICAL_LOST_S = 10.0  # a critical message this late counts as lost, and the next is due


def bulk_payload(step: int) -> np.ndarray:
    return np.random.default_rng(step).integers(0, 256, BULK_BYTES, dtype=np.uint8)


@dataclass
class TrafficResult:
    messages: int = 0
    bytes: int = 0
    critical_latency_s: list[float] = field(default_factory=list)
    critical_lost: list[int] = field(default_factory=list)  # steps that never arrived
    errors: list[str] = field(default_factory=list)


class Traffic:
    """Bulk both ways and critical bj -> sh, every message checked, until stopped."""

    def __init__(
        self, lab: LoopbackSites, bulk_every_s: float = BULK_EVERY_S, critical: bool = True
    ) -> None:
        self.lab = lab
        self.critical = critical
        self.bulk_every_s = bulk_every_s  # 0: as fast as the receiver keeps up
        self.result = TrafficResult()
        self._received: dict[str, int] = {"sh": 0, "bj": 0}
        self._sent_so_far: dict[str, int] = {}  # messages whose send() returned, by sender
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sent: dict[str, int] = {}
        self._sent_at: dict[int, float] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for src, dst in (("sh", "bj"), ("bj", "sh")):
            self._threads.append(threading.Thread(target=self._send_bulk, args=(src, dst)))
            self._threads.append(threading.Thread(target=self._recv_bulk, args=(src, dst)))
        if self.critical:
            self._threads.append(threading.Thread(target=self._send_critical))
            self._threads.append(threading.Thread(target=self._recv_critical))
        for thread in self._threads:
            thread.start()

    def stop(self) -> TrafficResult:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        return self.result

    def take_latencies(self) -> list[float]:
        with self._lock:
            taken, self.result.critical_latency_s = self.result.critical_latency_s, []
        return taken

    def _sender(self, key: str, work: Callable[[], None]) -> None:
        """Run a sender; whatever happens, its receiver learns how many it sent."""
        try:
            self._guard(work)
        finally:
            with self._lock:
                self._sent[key] = self._sent_so_far.get(key, 0)

    def _wait_sent(self, key: str, step: int) -> bool:
        """Wait until message ``step`` of ``key`` was handed to the gateway; False if it
        never will be (its sender stopped before it)."""
        while self._sent_so_far.get(key, 0) <= step:
            with self._lock:
                final = self._sent.get(key)
            if final is not None and step >= final:
                return False
            time.sleep(0.002)
        return True

    def _guard(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:
            with self._lock:
                self.result.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.set()

    def _send_bulk(self, src: str, dst: str) -> None:
        def work() -> None:
            with self.lab[src].client() as gw:
                step = 0
                started = time.monotonic()
                while not self._stop.is_set():
                    gw.send(dst, "bulk", bulk_payload(step), step=step)
                    step += 1
                    self._sent_so_far[src] = step
                    ahead_s = started + step * self.bulk_every_s - time.monotonic()
                    if ahead_s > 0:
                        time.sleep(ahead_s)
                    # at most a few messages ahead of the checks: no backlog in any inbox
                    while step - self._received[src] > 8 and not self._stop.is_set():
                        time.sleep(0.001)

        self._sender(src, work)

    def _recv_bulk(self, src: str, dst: str) -> None:
        def work() -> None:
            with self.lab[dst].client() as gw:
                step = 0
                while self._wait_sent(src, step):
                    got = gw.recv("bulk", source=src, step=step, timeout=30)
                    if got.tobytes() != bulk_payload(step).tobytes():
                        raise AssertionError(f"bulk {src}->{dst} step {step} arrived damaged")
                    with self._lock:
                        self.result.messages += 1
                        self.result.bytes += BULK_BYTES
                    step += 1
                    self._received[src] = step

        self._guard(work)

    def _send_critical(self) -> None:
        def work() -> None:
            with self.lab["bj"].client() as gw:
                step = 0
                while not self._stop.is_set():
                    with self._lock:
                        self._sent_at[step] = time.monotonic()
                    gw.send("sh", "crit", np.full(256, step, np.int32), step=step, critical=True)
                    step += 1
                    self._sent_so_far["crit"] = step
                    time.sleep(CRITICAL_EVERY_S)

        self._sender("crit", work)

    def _recv_critical(self) -> None:
        def work() -> None:
            with self.lab["sh"].client() as gw:
                step = 0
                while self._wait_sent("crit", step):
                    try:
                        got = gw.recv("crit", source="bj", step=step, timeout=CRITICAL_LOST_S)
                    except RecvTimeout:
                        with self._lock:
                            self.result.critical_lost.append(step)
                        step += 1
                        continue
                    arrived = time.monotonic()
                    if got.tobytes() != np.full(256, step, np.int32).tobytes():
                        raise AssertionError(f"critical step {step} arrived damaged")
                    with self._lock:
                        self.result.critical_latency_s.append(arrived - self._sent_at[step])
                        self.result.messages += 1
                    step += 1

        self._guard(work)
