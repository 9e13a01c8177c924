"""Drive a sans-IO collective run: sends, then recvs in the run's order, written once.

Every send of a step is already in the gateway while the driver waits, so the network
is never idle waiting for the trainer. Each wait is for the time left until the call's
deadline; how a client waits for several messages at once is its own
(``steps.NextArrivals``). A deadline that passes becomes a ``CollectiveTimeout`` that
names the sites that never answered and counts what did arrive, including what came
behind the message waited for (taken then, waiting for nothing).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from wangate.errors import GatewayError, GatewayUnavailable, RecvTimeout

from .exchange import Arrivals, CollectiveTimeout, Expected, Outgoing
from .steps import Deadline, NextArrivals, RecvEach, Script, SendOne, SyncTransport, run_sync


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


def _peer_failed(exc: GatewayError) -> bool:
    """A failure of one peer (unreachable, unknown), not of this site's own gateway."""
    return not isinstance(exc, GatewayUnavailable)


def send_all(messages: list[Outgoing], step: int, best_effort: bool = False) -> Script[None]:
    """Hand every message to the gateway; ``best_effort`` skips a peer that fails."""
    for out in messages:
        for peer in out.peers:
            try:
                yield SendOne(peer, out, step)
            except GatewayError as exc:
                if not (best_effort and _peer_failed(exc)):
                    raise


def drive_steps(run: Run, step: int, deadline: Deadline, what: str, site: str) -> Script[None]:
    yield from send_all(run.start(), step)
    while not run.done:
        relayed = run.relayed() if isinstance(run, Relaying) else []
        came = yield NextArrivals(run.wanted(), relayed, step, deadline)
        if came is None:
            yield from _take_what_is_there(run, step)
            raise run.arrivals.timeout(what, site, deadline.timeout_s, run.wanted())
        for want, array in came:
            yield from send_all(run.receive(want.source, want.tag, array), step)


def _take_what_is_there(run: Run, step: int) -> Script[None]:
    """After a timeout: take what did arrive (waiting for nothing), so the error counts
    the messages that came behind the one the driver was waiting for."""
    wanted = run.wanted()
    for want, outcome in zip(wanted, (yield RecvEach(wanted, step, Deadline(0.0))), strict=True):
        if isinstance(outcome, RecvTimeout):
            continue
        if isinstance(outcome, GatewayError):
            raise outcome
        run.receive(want.source, want.tag, outcome)


def drive(gw: SyncTransport, run: Run, step: int, deadline: Deadline, what: str, site: str) -> None:
    """``drive_steps`` over a blocking transport."""
    run_sync(gw, drive_steps(run, step, deadline, what, site))


def collect_joins(wanted: list[Expected], step: int, window: Deadline) -> Script[list[str]]:
    """The sources of ``wanted`` joins that arrive before ``window`` closes."""
    present = []
    for want, outcome in zip(wanted, (yield RecvEach(wanted, step, window)), strict=True):
        if isinstance(outcome, GatewayError):  # a timeout, or that peer is unreachable
            if _peer_failed(outcome):
                continue
            raise outcome
        present.append(want.source)
    return present


def timeout_error(what: str, site: str, timeout_s: float, missing: list[str]) -> CollectiveTimeout:
    return CollectiveTimeout(
        f"{what} at {site} timed out after {timeout_s:g} s: nothing arrived from "
        f"{', '.join(missing)} (did those sites call it with the same tag, step and sites?)",
        tuple(missing),
        {},
    )
