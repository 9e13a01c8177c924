"""What a collective asks of a client, and the two ways of doing it.

The collectives (``api.py``, ``driver.py``) are written once, as generators (a
``Script``) that yield these steps and are sent the outcome; a step's error is thrown
in at the ``yield`` (``wangate.stepper``). ``run_sync`` carries the steps out over a
blocking client, ``run_async`` over an asyncio one. The two differ where the I/O
does: a blocking client can wait for one message at a time, so ``NextArrivals`` asks
for the first one wanted, after looking (waiting for nothing) for the chunks the run
passes on, in slices of at most ``RELAY_POLL_S``; an asyncio client keeps one recv
per peer outstanding, so a slow peer does not hold up the others' chunks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from wangate.errors import GatewayError, RecvTimeout
from wangate.rows import PathRow
from wangate.stepper import run_steps, run_steps_async

from .exchange import Expected, Outgoing

T = TypeVar("T")

# A blocking driver with chunks to pass on waits at most this long for the next message
# before it looks for them: a relayed chunk leaves at most this late.
RELAY_POLL_S = 0.02


class Deadline:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())


@dataclass(frozen=True)
class SendOne:  # -> the message id; raises the gateway's error
    peer: str
    message: Outgoing
    step: int


@dataclass(frozen=True)
class RecvOne:  # -> the array, or None when nothing came in ``timeout_s``
    want: Expected
    step: int | None
    timeout_s: float


@dataclass(frozen=True)
class PathRows:  # -> the gateway's ``paths()`` rows, as ``PathRow``s
    pass


@dataclass(frozen=True)
class RecvEach:  # -> per want, its array or the ``GatewayError`` its recv raised
    wants: list[Expected]
    step: int
    window: Deadline  # each recv waits until it closes


@dataclass(frozen=True)
class NextArrivals:
    """-> (want, array) for what came of ``wanted`` (empty: ask again), or None once
    ``deadline`` passed with nothing; ``relayed``: those the run passes on."""

    wanted: list[Expected]
    relayed: list[Expected]
    step: int
    deadline: Deadline


@dataclass(frozen=True)
class Claim:  # -> None; raises the gateway's ``collision``
    """Enter the call before sending anything for it (proto/collective.md, "Claims")."""

    call: str  # kind/tag
    step: int


Step = SendOne | RecvOne | PathRows | RecvEach | NextArrivals | Claim
Script = Generator[Step, Any, T]
Arrival = tuple[Expected, np.ndarray]


class SyncTransport(Protocol):
    def send_encoded(
        self,
        peer: str,
        tag: str,
        meta: bytes,
        payload: memoryview,
        checksum: int,
        *,
        step: int,
        critical: bool,
    ) -> int: ...

    def recv(
        self, tag: str, *, source: str | None, step: int | None, timeout: float | None
    ) -> np.ndarray: ...

    def paths(self) -> list[dict[str, Any]]: ...

    def claim(self, call: str, step: int) -> None: ...


class AsyncTransport(Protocol):
    async def send_encoded(
        self,
        peer: str,
        tag: str,
        meta: bytes,
        payload: memoryview,
        checksum: int,
        *,
        step: int,
        critical: bool,
    ) -> int: ...

    async def recv(
        self, tag: str, *, source: str | None, step: int | None, timeout: float | None
    ) -> np.ndarray: ...

    async def paths(self) -> list[dict[str, Any]]: ...

    async def claim(self, call: str, step: int) -> None: ...


# ---------------------------------------------------------------- blocking


def run_sync(gw: SyncTransport, script: Script[T]) -> T:
    return run_steps(script, lambda todo: _blocking(gw, todo))


def _recv_or_none(gw: SyncTransport, want: Expected, step: int | None, timeout_s: float) -> Any:
    try:
        return gw.recv(want.tag, source=want.source, step=step, timeout=timeout_s)
    except RecvTimeout:
        return None


def _blocking(gw: SyncTransport, todo: Step) -> Any:
    if isinstance(todo, SendOne):
        out = todo.message
        return gw.send_encoded(
            todo.peer, out.tag, out.meta, out.payload, out.checksum,
            step=todo.step, critical=out.critical,
        )  # fmt: skip
    if isinstance(todo, RecvOne):
        return _recv_or_none(gw, todo.want, todo.step, todo.timeout_s)
    if isinstance(todo, PathRows):
        return PathRow.from_dicts(gw.paths())
    if isinstance(todo, Claim):
        return gw.claim(todo.call, todo.step)
    if isinstance(todo, RecvEach):
        outcomes: list[np.ndarray | GatewayError] = []
        for want in todo.wants:
            try:
                outcomes.append(
                    gw.recv(
                        want.tag, source=want.source, step=todo.step, timeout=todo.window.left()
                    )
                )
            except GatewayError as exc:
                outcomes.append(exc)
        return outcomes
    return _next_blocking(gw, todo)


def _next_blocking(gw: SyncTransport, todo: NextArrivals) -> list[Arrival] | None:
    want, step, deadline = todo.wanted[0], todo.step, todo.deadline
    came = []
    for other in todo.relayed:  # pass on what has come, waiting for nothing
        if other != want and (array := _recv_or_none(gw, other, step, 0.0)) is not None:
            came.append((other, array))
    if came:
        return came
    # with chunks to pass on, wait in slices and look for them in between
    wait_s = min(deadline.left(), RELAY_POLL_S) if todo.relayed else deadline.left()
    array = _recv_or_none(gw, want, step, wait_s)
    if array is not None:
        return [(want, array)]
    return [] if deadline.left() > 0 else None


# ---------------------------------------------------------------- asyncio

# the recv outstanding for each source, while a run waits for its messages
Outstanding = dict[str, tuple[Expected, "asyncio.Future[np.ndarray]"]]


async def run_async(gw: AsyncTransport, script: Script[T]) -> T:
    outstanding: Outstanding = {}
    try:
        return await run_steps_async(script, lambda todo: _asyncio(gw, todo, outstanding))
    finally:
        await _cancel(outstanding)


async def _asyncio(gw: AsyncTransport, todo: Step, outstanding: Outstanding) -> Any:
    if isinstance(todo, SendOne):
        out = todo.message
        return await gw.send_encoded(
            todo.peer, out.tag, out.meta, out.payload, out.checksum,
            step=todo.step, critical=out.critical,
        )  # fmt: skip
    if isinstance(todo, RecvOne):
        w = todo.want
        try:
            return await gw.recv(w.tag, source=w.source, step=todo.step, timeout=todo.timeout_s)
        except RecvTimeout:
            return None
    if isinstance(todo, PathRows):
        return PathRow.from_dicts(await gw.paths())
    if isinstance(todo, Claim):
        return await gw.claim(todo.call, todo.step)
    if isinstance(todo, RecvEach):

        async def one(want: Expected) -> np.ndarray | GatewayError:
            timeout = todo.window.left()
            try:
                return await gw.recv(want.tag, source=want.source, step=todo.step, timeout=timeout)
            except GatewayError as exc:
                return exc

        return list(await asyncio.gather(*(one(w) for w in todo.wants)))
    return await _next_asyncio(gw, todo, outstanding)


async def _next_asyncio(
    gw: AsyncTransport, todo: NextArrivals, outstanding: Outstanding
) -> list[Arrival] | None:
    for want in todo.wanted:  # the first wanted of each source
        if want.source not in outstanding:
            recv = gw.recv(
                want.tag, source=want.source, step=todo.step, timeout=todo.deadline.left()
            )
            outstanding[want.source] = (want, asyncio.ensure_future(recv))
    await asyncio.wait([task for _, task in outstanding.values()], return_when="FIRST_COMPLETED")
    came, late = [], False
    for source, (want, task) in list(outstanding.items()):
        if task.done():
            del outstanding[source]
            try:
                came.append((want, task.result()))
            except RecvTimeout:
                late = True
    if late and not came:
        await _cancel(outstanding)
        return None
    return came


async def _cancel(outstanding: Outstanding) -> None:
    tasks = [task for _, task in outstanding.values()]
    outstanding.clear()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
