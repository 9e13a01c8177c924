"""The trainers of one site for ``python -m bench jobs``, run inside the site's namespace.

    python -m bench.jobs.worker SOCKET

Prints ``{"ready": true}``, then reads one JSON phase per line on stdin and answers each
with one JSON line; a line ``stop`` while a phase runs ends its ``recv`` and ``hold``
roles (the bench sends it once the senders are done: every bulk message was taken). A
phase is ``{"t0": T, "end": T, "roles": [ROLE, ...]}`` (times on ``time.monotonic()``,
one clock for every namespace of the machine); each role is one trainer, a thread with
its own ``wangate.Client(SOCKET, job=ROLE["job"])``:

- ``bulk``: from ``t0`` to ``end``, 1 MiB messages (``size``) to ``peer`` with at most
  ``window`` of them not yet taken at the peer (``Client.wait`` on the oldest): the
  job always has several MiB queued and never more;
- ``critical``: a ``size`` message with ``critical=True`` every ``interval_s`` from
  ``t0`` to ``end``;
- ``burst``: ``count`` messages handed over at once at ``t0``, then waited for;
- ``flood``: ``count`` messages handed over at once at ``t0``, never waited for (the
  job whose receiver does not read);
- ``recv``: takes every message of ``tag`` from ``source`` until ``stop`` (at most
  ``hard_s`` after ``end``), or until it has ``count`` of them;
- ``hold``: connects to the job and reads nothing until ``stop``.

Every payload is random bytes whose first 16 are the step and ``time.monotonic_ns()``
at the send call, so a receiver knows each message's send time. A sender's events are
``[t_call_s, nbytes, step]``; a receiver's ``[t_received_s, nbytes, step, t_sent_s]``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from typing import Any

import numpy as np

import wangate
from wangate.errors import RecvTimeout, WangateError

HEAD_BYTES = 16
WAIT_TIMEOUT_S = 30.0
RECV_POLL_S = 0.25  # a receiver looks at the stop flag this often while nothing comes


def _payload(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _stamp(array: np.ndarray, step: int) -> None:
    array[:HEAD_BYTES].view(np.uint64)[:] = (step, time.monotonic_ns())


def _sleep_until(t: float) -> None:
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


def _send_role(sock: str, role: dict[str, Any], t0: float, end: float) -> dict[str, Any]:
    kind, peer, tag = role["role"], role["peer"], role["tag"]
    array = _payload(role["size"], role.get("seed", 1))
    events: list[list[float]] = []
    with wangate.Client(sock, job=role["job"]) as gw:
        _sleep_until(t0)
        step = 0

        def send(critical: bool = False) -> int:
            nonlocal step
            _stamp(array, step)
            events.append([time.monotonic(), int(array.nbytes), step])
            message_id = gw.send(peer, tag, array, step=step, critical=critical)
            step += 1
            return message_id

        if kind == "bulk":
            outstanding: deque[int] = deque()
            while time.monotonic() < end:
                if len(outstanding) >= role["window"]:
                    gw.wait(peer, outstanding.popleft(), timeout=WAIT_TIMEOUT_S)
                    continue
                outstanding.append(send())
            for message_id in outstanding:
                gw.wait(peer, message_id, timeout=WAIT_TIMEOUT_S)
        elif kind == "critical":
            while True:
                due = t0 + step * role["interval_s"]
                if due >= end:
                    break
                _sleep_until(due)
                send(critical=True)
        elif kind in ("burst", "flood"):
            ids = [send() for _ in range(role["count"])]
            if kind == "burst":
                for message_id in ids:
                    gw.wait(peer, message_id, timeout=WAIT_TIMEOUT_S + role["count"])
        else:
            raise ValueError(f"no sender role {kind!r}")
    return {"events": events}


def _recv_role(
    sock: str, role: dict[str, Any], end: float, stop: threading.Event
) -> dict[str, Any]:
    events: list[list[float]] = []
    count = role.get("count")
    last = end + role.get("hard_s", 60.0)
    with wangate.Client(sock, job=role["job"]) as gw:
        if role["role"] == "hold":
            stop.wait(max(0.0, last - time.monotonic()))
            return {"events": events}
        while count is None or len(events) < count:
            if stop.is_set() or time.monotonic() >= last:
                break
            try:
                array = gw.recv(role["tag"], source=role["source"], timeout=RECV_POLL_S)
            except RecvTimeout:
                continue
            received = time.monotonic()
            step, sent_ns = (int(v) for v in array[:HEAD_BYTES].view(np.uint64))
            events.append([received, int(array.nbytes), step, sent_ns / 1e9])
    return {"events": events}


def run_phase(sock: str, phase: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
    results: list[dict[str, Any]] = [{} for _ in phase["roles"]]

    def one(index: int, role: dict[str, Any]) -> None:
        try:
            if role["role"] in ("recv", "hold"):
                results[index] = _recv_role(sock, role, phase["end"], stop)
            else:
                results[index] = _send_role(sock, role, phase["t0"], phase["end"])
        except (WangateError, OSError, ValueError) as exc:
            results[index] = {"events": [], "error": f"{role['job']} {role['role']}: {exc!r}"}

    threads = [
        threading.Thread(target=one, args=(i, role), daemon=True)
        for i, role in enumerate(phase["roles"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pairs = zip(phase["roles"], results, strict=True)
    return {"roles": [{**role, **result} for role, result in pairs]}


def main(argv: list[str]) -> int:
    sock = argv[0]
    print(json.dumps({"ready": True}), flush=True)
    running: threading.Thread | None = None
    stop = threading.Event()

    def answer(phase: dict[str, Any], stop: threading.Event) -> None:
        print(json.dumps(run_phase(sock, phase, stop)), flush=True)

    for line in sys.stdin:
        if line.strip() == "stop":
            stop.set()
        elif line.strip():
            if running is not None:
                running.join()
            stop = threading.Event()
            running = threading.Thread(target=answer, args=(json.loads(line), stop))
            running.start()
    stop.set()
    if running is not None:
        running.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
