"""The soak's trainers: a sending and a receiving thread per flow, each with its own
``wangate.Client``, reconnecting whenever its gateway is gone, recording everything in
one ``Book`` for the checker.

A sender keeps at most ``window`` messages open: it sends while it may (paced to its
flow's rate) and otherwise waits on its oldest open message. One connection is one
daemon instance, so when the connection breaks every open message of it becomes
``unknown`` (the daemon that accepted it is gone) and the sender connects again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path

import numpy as np

import wangate
from bench.robustness.soak import plan
from bench.robustness.soak.checker import Sent, Take, reason_of
from wangate.errors import (
    GatewayError,
    GatewayUnavailable,
    PeerUnreachable,
    RecvTimeout,
    WangateError,
)

CONNECT_TIMEOUT_S = 2.0
RETRY_S = 0.2
RECV_TIMEOUT_S = 0.5


class Book:
    """What was sent and what was taken, shared by the threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[tuple[str, int], Sent] = {}
        self.takes: list[Take] = []
        self.errors: list[str] = []  # a trainer thread's unexpected exception
        self.recv_errors: dict[str, int] = {}  # recv failures other than timeouts
        self.last_take = time.monotonic()

    def attempt(self, spec: plan.MessageSpec) -> Sent:
        sent = Sent(spec.flow, spec.step, spec.size, spec.critical)
        with self.lock:
            self.sent[(spec.flow, spec.step)] = sent
        return sent

    def take(self, take: Take) -> None:
        with self.lock:
            self.takes.append(take)
            self.last_take = time.monotonic()

    def recv_error(self, key: str) -> None:
        with self.lock:
            self.recv_errors[key] = self.recv_errors.get(key, 0) + 1


def resolve(sent: Sent, outcome: str, exc: WangateError | None = None, during: str = "") -> None:
    sent.outcome = outcome
    if exc is not None:
        code = str(getattr(exc, "code", ""))
        sent.reason = reason_of(type(exc).__name__, code, str(exc), during)
        sent.detail = f"{type(exc).__name__}: {exc}"


class Control:
    """The phase the senders are in: ``run``, ``pause`` (send nothing new, resolve the
    open messages) or ``drain`` (the same, then stop; what is open at ``deadline`` stays
    unresolved)."""

    def __init__(self) -> None:
        self.phase = "run"
        self.deadline = float("inf")
        self.receivers_stop = threading.Event()

    def set(self, phase: str, deadline: float = float("inf")) -> None:
        self.deadline = deadline
        self.phase = phase


def _connect(path: Path) -> wangate.Client | None:
    try:
        return wangate.Client(path, timeout=CONNECT_TIMEOUT_S)
    except (WangateError, OSError):
        time.sleep(RETRY_S)
        return None


class Sender(threading.Thread):
    def __init__(
        self,
        src: str,
        dst: str,
        socket_path: Path,
        seed: int,
        rate_mbps: float,
        book: Book,
        control: Control,
        window: int = 16,
    ) -> None:
        super().__init__(name=f"send {src}>{dst}", daemon=True)
        self.dst, self.path, self.seed = dst, socket_path, seed
        self.flow = plan.flow_name(src, dst)
        self.tag = plan.flow_tag(self.flow)
        self.rate_bps = rate_mbps * 1e6
        self.book, self.control, self.window = book, control, window
        self.open: deque[Sent] = deque()
        self.idle = threading.Event()  # paused or draining with nothing open
        self.step = 0

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the checker must hear of it
            with self.book.lock:
                self.book.errors.append(f"{self.name}: {type(exc).__name__}: {exc}")
        finally:
            self.idle.set()

    def _loop(self) -> None:
        client: wangate.Client | None = None
        next_at = time.monotonic()
        while True:
            phase = self.control.phase
            now = time.monotonic()
            if phase != "run" and not self.open:
                self.idle.set()
                if phase == "drain":
                    break
                time.sleep(0.05)
                continue
            self.idle.clear()
            if phase == "drain" and now > self.control.deadline:
                break  # what is still open stays unresolved: the checker's to judge
            if client is None:
                client = _connect(self.path)
                continue
            if phase == "run" and len(self.open) < self.window and now >= next_at:
                spec = plan.message_spec(self.seed, self.flow, self.step)
                self.step += 1
                next_at = max(next_at, now - 1.0) + spec.size * 8 / self.rate_bps
                if not self._send(client, spec):
                    self._lost(client)
                    client = None
                continue
            if not self.open:
                time.sleep(min(0.2, max(0.005, next_at - now)))
                continue
            room = phase == "run" and len(self.open) < self.window
            timeout = max(0.05, min(1.0, next_at - now)) if room else 1.0
            if not self._wait(client, timeout):
                self._lost(client)
                client = None

    def _send(self, client: wangate.Client, spec: plan.MessageSpec) -> bool:
        """Send one message; False when the connection is lost."""
        sent = self.book.attempt(spec)
        data = plan.payload(self.seed, spec)
        try:
            sent.msg_id = client.send(
                self.dst,
                self.tag,
                data,
                step=spec.step,
                critical=spec.critical,
                deadline_s=spec.deadline_s,
            )
        except GatewayUnavailable as exc:
            resolve(sent, "unknown", exc, "send")
            return False
        except WangateError as exc:
            resolve(sent, "failed", exc, "send")
            time.sleep(RETRY_S)  # a peer unreachable refuses at once: no spinning
            return True
        self.open.append(sent)
        return True

    def _wait(self, client: wangate.Client, timeout: float) -> bool:
        """Wait on the oldest open message; False when the connection is lost."""
        sent = self.open[0]
        assert sent.msg_id is not None
        try:
            client.wait(self.dst, sent.msg_id, timeout=timeout)
        except RecvTimeout:
            return True
        except PeerUnreachable:  # still open: a done message waits for the peer
            time.sleep(RETRY_S)
            return True
        except GatewayUnavailable:
            return False
        except GatewayError as exc:
            self.open.popleft()
            resolve(sent, "failed", exc, "wait")
            return True
        self.open.popleft()
        resolve(sent, "taken")
        return True

    def _lost(self, client: wangate.Client) -> None:
        """The connection (its daemon) is gone: every open message is ``unknown``."""
        lost = GatewayUnavailable("the sender's gateway was lost with the message open")
        for sent in self.open:
            resolve(sent, "unknown", lost, "wait")
        self.open.clear()
        client.close()


class Receiver(threading.Thread):
    """Takes every message of a flow and checks it byte for byte."""

    def __init__(
        self, src: str, dst: str, socket_path: Path, seed: int, book: Book, control: Control
    ) -> None:
        super().__init__(name=f"recv {src}>{dst}", daemon=True)
        self.src, self.path, self.seed = src, socket_path, seed
        self.flow = plan.flow_name(src, dst)
        self.tag = plan.flow_tag(self.flow)
        self.book, self.control = book, control

    def run(self) -> None:
        client: wangate.Client | None = None
        try:
            while not self.control.receivers_stop.is_set():
                if client is None:
                    client = _connect(self.path)
                    continue
                try:
                    data = client.recv(self.tag, source=self.src, timeout=RECV_TIMEOUT_S)
                except RecvTimeout:
                    continue
                except PeerUnreachable:
                    time.sleep(RETRY_S)
                    continue
                except GatewayUnavailable:
                    client.close()
                    client = None
                    continue
                except GatewayError as exc:
                    self.book.recv_error(f"{self.flow}: {exc.code}")
                    continue
                self.book.take(self.check(data))
                del data  # a large message's segment goes back now
        except BaseException as exc:
            with self.book.lock:
                self.book.errors.append(f"{self.name}: {type(exc).__name__}: {exc}")
        finally:
            if client is not None:
                client.close()

    def check(self, data: np.ndarray) -> Take:
        named = plan.identify(data)
        if named is None:
            return Take(self.flow, None, False, f"no header ({data.dtype}, {data.shape})")
        step, crc = named
        if crc != plan.flow_crc(self.flow):
            return Take(self.flow, step, False, f"header names another flow (crc {crc:#x})")
        spec = plan.message_spec(self.seed, self.flow, step)
        if data.size != spec.size:
            return Take(self.flow, step, False, f"{data.size} bytes, not {spec.size}")
        expected = plan.payload(self.seed, spec)
        if not np.array_equal(data, expected):
            bad = int(np.flatnonzero(data != expected)[0])
            return Take(self.flow, step, False, f"bytes differ from offset {bad}")
        return Take(self.flow, step, True)
