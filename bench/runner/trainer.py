"""One end of one workload flow, run inside a site's namespace against its gateway.

    python -m bench.runner.trainer SPEC_JSON

SPEC: ``role`` ("send" or "recv"), ``socket``, ``src``, ``dst``, ``flow`` (index),
``seed``, ``timeout_s`` and ``messages``: ``[[step, index, name, size_bytes,
critical, at_s], ...]`` in send order.

Every payload is deterministic (seeded by scenario seed, flow, step and message
index), so the receiver checks each one bit for bit against a digest of what the
sender must have sent. Times are ``time.monotonic_ns()``, one clock for every process
on the machine.

Protocol on the pipes: the trainer prints ``{"ready": true}`` once connected (and,
for a sender, once every payload is built); a sender then waits for ``go T0_NS`` on
stdin and hands message ``i`` to its gateway at ``T0 + at_s``; a receiver finishes
when everything arrived or on ``stop``. Both end with one JSON line of records.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import threading
import time
from typing import Any

import numpy as np

import wangate
from wangate.errors import WangateError

RECV_WINDOW = 48  # outstanding recv calls; the gateway allows 64 requests per connection


def payload(seed: int, flow: int, step: int, index: int, size_bytes: int) -> np.ndarray:
    """The message's bytes as a uint8 array; the same on every process and run."""
    rng = np.random.Generator(np.random.PCG64([seed, flow, step, index]))
    words = rng.integers(
        0, np.iinfo(np.uint64).max, (size_bytes + 7) // 8, dtype=np.uint64, endpoint=True
    )
    return words.view(np.uint8)[:size_bytes]


def digest(data: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(data).tobytes(), digest_size=16).hexdigest()


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# -- sender -------------------------------------------------------------------------------
def run_sender(spec: dict[str, Any]) -> dict[str, Any]:
    messages = spec["messages"]
    arrays = [
        payload(spec["seed"], spec["flow"], step, index, size)
        for step, index, _, size, _, _ in messages
    ]
    records: list[dict[str, Any]] = []
    error = None
    with wangate.Client(spec["socket"]) as gw:
        _emit({"ready": True})
        line = sys.stdin.readline().split()
        if len(line) != 2 or line[0] != "go":
            return {"records": [], "error": f"expected 'go T0_NS', got {line!r}"}
        t0_ns = int(line[1])
        deadline_ns = t0_ns + int(spec["timeout_s"] * 1e9)
        for (step, index, name, _, critical, at_s), array in zip(messages, arrays, strict=True):
            due_ns = t0_ns + int(at_s * 1e9)
            wait_s = (due_ns - time.monotonic_ns()) / 1e9
            if wait_s > 0:
                time.sleep(wait_s)
            call_ns = time.monotonic_ns()
            if call_ns > deadline_ns:
                error = "deadline passed before every message was handed over"
                break
            try:
                message_id = gw.send(spec["dst"], name, array, step=step, critical=critical)
            except WangateError as exc:
                error = f"send {name} step {step}: {exc}"
                break
            records.append(
                {
                    "step": step,
                    "index": index,
                    "call_ns": call_ns,
                    "accepted_ns": time.monotonic_ns(),
                    "message_id": message_id,
                }
            )
    return {"records": records, "error": error}


# -- receiver -----------------------------------------------------------------------------
async def _receive(spec: dict[str, Any], expected: list[str]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:
        for text in sys.stdin:
            if text.strip() == "stop":
                break
        loop.call_soon_threadsafe(stop.set)

    records: list[dict[str, Any]] = []
    errors: list[str] = []
    messages = spec["messages"]
    window = asyncio.Semaphore(RECV_WINDOW)

    async with wangate.AsyncClient(spec["socket"]) as gw:

        async def one(position: int) -> None:
            step, index, name, size, _, _ = messages[position]
            try:
                try:
                    array = await gw.recv(name, source=spec["src"], step=step)
                except WangateError as exc:
                    errors.append(f"recv {name} step {step}: {exc}")
                    return
                delivered_ns = time.monotonic_ns()
            finally:
                window.release()
            intact = (
                array.dtype == np.uint8
                and array.shape == (size,)
                and await asyncio.to_thread(digest, array) == expected[position]
            )
            records.append(
                {
                    "step": step,
                    "index": index,
                    "delivered_ns": delivered_ns,
                    "intact": bool(intact),
                    "received_bytes": int(array.nbytes),
                }
            )

        async def all_of_them() -> None:
            tasks = []
            for position in range(len(messages)):
                await window.acquire()
                tasks.append(asyncio.ensure_future(one(position)))
            await asyncio.gather(*tasks)

        _emit({"ready": True})
        threading.Thread(target=watch_stdin, daemon=True).start()
        work = asyncio.ensure_future(all_of_them())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait(
            [work, stopper], timeout=spec["timeout_s"] + 30, return_when=asyncio.FIRST_COMPLETED
        )
        for task in (work, stopper):
            task.cancel()
        await asyncio.gather(work, stopper, return_exceptions=True)
    missing = len(messages) - len(records)
    error = "; ".join(errors[:3]) or (f"{missing} messages not received" if missing else None)
    return {"records": records, "error": error}


def run_receiver(spec: dict[str, Any]) -> dict[str, Any]:
    expected = [
        digest(payload(spec["seed"], spec["flow"], step, index, size))
        for step, index, _, size, _, _ in spec["messages"]
    ]
    return asyncio.run(_receive(spec, expected))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(args[0])
    try:
        result = run_sender(spec) if spec["role"] == "send" else run_receiver(spec)
    except WangateError as exc:
        result = {"records": [], "error": str(exc)}
    result["cpu_s"] = time.process_time()
    _emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
