"""What became of the messages a gateway sent: one book for every backend.

A message a trainer handed over ends in exactly one outcome (proto/delivery.md): a
trainer at the peer took it, or it failed with a reason. The book keeps the last
``MAX_OUTCOMES`` outcomes per peer for ``Client.wait``, the last few failures for
``status``, and one event per peer that is set whenever a waiter should look again
(room for more, an outcome, the peer's state).

The in-process drivers tell it through the ``DriverListener`` calls (``taken``,
``failed``, ``acked``, ``changed``); the worker coordinator calls the same.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from wangate.core.jobs import DEFAULT_JOB
from wangate.errors import failure_text

MAX_OUTCOMES = 65536  # finished messages whose outcome Client.wait can still tell
RECENT_FAILURES = 10
MAX_JOB_RECORDS = 4 * MAX_OUTCOMES  # messages of jobs other than default, all peers

# (peer, msg_id, None or why it failed, whether it failed because the peer restarted)
Outcome = Callable[[str, int, str | None, bool], None]


class OutcomeBook:
    def __init__(self) -> None:
        self._outcomes: dict[str, OrderedDict[int, str | None]] = {}
        self._failures: dict[str, deque[dict[str, Any]]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        # the job of the last messages of jobs other than the default (an outcome's
        # job: ``Client.wait`` of another job does not see it), each job's last failures
        self._job_of: dict[tuple[str, int], str] = {}
        self._job_failures: dict[str, deque[dict[str, Any]]] = {}
        # a worker passes each outcome and each whole arrival on to its coordinator
        self.on_outcome: Outcome | None = None
        self.on_acked: Callable[[str, int], None] | None = None

    # ------------------------------------------------------------ news

    def sent(self, peer: str, msg_id: int, job: str) -> None:
        """A message of ``job`` was accepted for ``peer`` (its failure is the job's)."""
        if job == DEFAULT_JOB:  # a message of no recorded job is the default job's
            self._job_of.pop((peer, msg_id), None)  # ids begin again when a peer restarts
            return
        self._job_of[(peer, msg_id)] = job
        while len(self._job_of) > MAX_JOB_RECORDS:
            del self._job_of[next(iter(self._job_of))]

    def taken(self, peer: str, msg_id: int) -> None:
        self._finish(peer, msg_id, None, False)

    def failed(
        self, peer: str, msg_id: int, tag: str, step: int, reason: str, restarted: bool = False
    ) -> None:
        failure = {"msg_id": msg_id, "tag": tag, "step": step, "reason": reason}
        self._failures.setdefault(peer, deque(maxlen=RECENT_FAILURES)).append(failure)
        job = self._job_of.get((peer, msg_id), DEFAULT_JOB)
        job_failures = self._job_failures.setdefault(job, deque(maxlen=RECENT_FAILURES))
        job_failures.append({"peer": peer, **failure})
        self._finish(peer, msg_id, failure_text(peer, msg_id, tag, step, reason), restarted)

    def acked(self, peer: str, msg_id: int) -> None:
        if self.on_acked is not None:
            self.on_acked(peer, msg_id)

    def changed(self, peer: str) -> None:
        self._event(peer).set()

    def _finish(self, peer: str, msg_id: int, failure: str | None, restarted: bool) -> None:
        outcomes = self._outcomes.setdefault(peer, OrderedDict())
        outcomes[msg_id] = failure
        while len(outcomes) > MAX_OUTCOMES:
            outcomes.popitem(last=False)
        self.changed(peer)
        if self.on_outcome is not None:
            self.on_outcome(peer, msg_id, failure, restarted)

    # ------------------------------------------------------------ questions

    def outcome(self, peer: str, msg_id: int) -> tuple[bool, str | None]:
        """(known, failure): whether the message has ended, and why it failed if so."""
        outcomes = self._outcomes.get(peer)
        if outcomes is None or msg_id not in outcomes:
            return False, None
        return True, outcomes[msg_id]

    def recent_failures(self, peer: str) -> list[dict[str, Any]]:
        return list(self._failures.get(peer, ()))

    def job_of(self, peer: str, msg_id: int) -> str:
        return self._job_of.get((peer, msg_id), DEFAULT_JOB)

    def recent_failures_of(self, job: str) -> list[dict[str, Any]]:
        """The last failures of ``job``'s messages, to any peer."""
        return list(self._job_failures.get(job, ()))

    def forget(self, peer: str) -> None:
        """A peer removed from the configuration: its waiters look again and fail."""
        self._outcomes.pop(peer, None)
        self._failures.pop(peer, None)
        self.changed(peer)

    async def wait_changed(self, peer: str, deadline_at: float | None) -> bool:
        """Wait for news of ``peer``; False once ``deadline_at`` passed without any."""
        event = self._event(peer)
        event.clear()
        remaining_s = None if deadline_at is None else deadline_at - time.monotonic()
        if remaining_s is not None and remaining_s <= 0:
            return False
        try:
            await asyncio.wait_for(event.wait(), remaining_s)
        except TimeoutError:
            return False
        return True

    def _event(self, peer: str) -> asyncio.Event:
        return self._changed.setdefault(peer, asyncio.Event())
