"""Drive a sans-IO collective run over a client: sends, then recvs in the run's order.

The blocking driver asks for one expected message at a time (the run lists them in the
order they become useful) while every send is already in the gateway, so the network
is never idle waiting for the trainer; a run that passes chunks on (all-gather routes)
also has them looked for between waits of at most ``RELAY_POLL_S``. The asyncio
driver keeps one recv per peer outstanding, so a slow peer does not hold up the
others' chunks. Both give every recv the time left until the call's deadline and turn
a gateway timeout into a ``CollectiveTimeout`` that names the sites that never answered
and what arrived.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

import numpy as np

from wangate.errors import GatewayError, GatewayUnavailable, RecvTimeout

from .exchange import Arrivals, CollectiveTimeout, Expected, Outgoing


class Run(Protocol):
    arrivals: Arrivals

    @property
    def done(self) -> bool: ...

    def start(self) -> list[Outgoing]: ...

    def wanted(self) -> list[Expected]: ...

    def receive(self, source: str, tag: str, array: np.ndarray) -> list[Outgoing]: ...


@runtime_checkable
class Relaying(Protocol):
    """A run some of whose messages this site passes on (``AllreduceRun`` with routes)."""

    def relayed(self) -> list[Expected]: ...


# A blocking driver with chunks to pass on waits at most this long for the next message
# before it looks for them: a relayed chunk leaves at most this late.
RELAY_POLL_S = 0.02


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


class Deadline:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())


def _peer_failed(exc: GatewayError) -> bool:
    """A failure of one peer (unreachable, unknown), not of this site's own gateway."""
    return not isinstance(exc, GatewayUnavailable)


def send_all(
    gw: SyncTransport, messages: list[Outgoing], step: int, best_effort: bool = False
) -> None:
    for out in messages:
        for peer in out.peers:
            try:
                gw.send_encoded(
                    peer, out.tag, out.meta, out.payload, out.checksum,
                    step=step, critical=out.critical,
                )  # fmt: skip
            except GatewayError as exc:
                if not (best_effort and _peer_failed(exc)):
                    raise


async def send_all_async(
    gw: AsyncTransport, messages: list[Outgoing], step: int, best_effort: bool = False
) -> None:
    for out in messages:
        for peer in out.peers:
            try:
                await gw.send_encoded(
                    peer, out.tag, out.meta, out.payload, out.checksum,
                    step=step, critical=out.critical,
                )  # fmt: skip
            except GatewayError as exc:
                if not (best_effort and _peer_failed(exc)):
                    raise


def drive(gw: SyncTransport, run: Run, step: int, deadline: Deadline, what: str, site: str) -> None:
    send_all(gw, run.start(), step)
    while not run.done:
        want = run.wanted()[0]
        relayed = run.relayed() if isinstance(run, Relaying) else []
        for other in relayed:  # pass on what has come, waiting for nothing
            if other != want:
                _take(gw, run, other, step, 0.0)
        # with chunks to pass on, wait in slices and look for them in between
        wait_s = min(deadline.left(), RELAY_POLL_S) if relayed else deadline.left()
        if want in run.wanted() and not _take(gw, run, want, step, wait_s):
            if deadline.left() > 0:
                continue
            _take_what_is_there(gw, run, step)
            raise run.arrivals.timeout(what, site, deadline.timeout_s, run.wanted()) from None


def _take(gw: SyncTransport, run: Run, want: Expected, step: int, timeout_s: float) -> bool:
    try:
        array = gw.recv(want.tag, source=want.source, step=step, timeout=timeout_s)
    except RecvTimeout:
        return False
    send_all(gw, run.receive(want.source, want.tag, array), step)
    return True


def _take_what_is_there(gw: SyncTransport, run: Run, step: int) -> None:
    """After a timeout: take what did arrive (waiting for nothing), so the error counts
    the messages that came behind the one the driver was waiting for."""
    for want in run.wanted():
        try:
            array = gw.recv(want.tag, source=want.source, step=step, timeout=0)
        except RecvTimeout:
            continue
        run.receive(want.source, want.tag, array)


async def drive_async(
    gw: AsyncTransport, run: Run, step: int, deadline: Deadline, what: str, site: str
) -> None:
    await send_all_async(gw, run.start(), step)

    async def pump(source: str) -> None:
        while True:
            want = next((w for w in run.wanted() if w.source == source), None)
            if want is None:
                return
            array = await gw.recv(want.tag, source=source, step=step, timeout=deadline.left())
            await send_all_async(gw, run.receive(source, want.tag, array), step)

    sources = sorted({w.source for w in run.wanted()})
    tasks = [asyncio.ensure_future(pump(s)) for s in sources]
    try:
        await asyncio.gather(*tasks)
    except RecvTimeout:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise run.arrivals.timeout(what, site, deadline.timeout_s, run.wanted()) from None
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def collect_joins(
    gw: SyncTransport, wanted: list[Expected], step: int, window: Deadline
) -> list[str]:
    """The sources of ``wanted`` joins that arrive before ``window`` closes."""
    present = []
    for want in wanted:
        try:
            gw.recv(want.tag, source=want.source, step=step, timeout=window.left())
        except GatewayError as exc:  # a timeout, or that peer is unreachable
            if _peer_failed(exc):
                continue
            raise
        present.append(want.source)
    return present


async def collect_joins_async(
    gw: AsyncTransport, wanted: list[Expected], step: int, window: Deadline
) -> list[str]:
    async def one(want: Expected) -> str | None:
        try:
            await gw.recv(want.tag, source=want.source, step=step, timeout=window.left())
        except GatewayError as exc:  # a timeout, or that peer is unreachable
            if _peer_failed(exc):
                return None
            raise
        return want.source

    found = await asyncio.gather(*(one(w) for w in wanted))
    return [s for s in found if s is not None]


def timeout_error(what: str, site: str, timeout_s: float, missing: list[str]) -> CollectiveTimeout:
    return CollectiveTimeout(
        f"{what} at {site} timed out after {timeout_s:g} s: nothing arrived from "
        f"{', '.join(missing)} (did those sites call it with the same tag, step and sites?)",
        tuple(missing),
        {},
    )
