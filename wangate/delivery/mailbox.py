"""A site's inbox: arrived messages waiting for trainers' ``recv`` calls.

Pure bookkeeping, no asyncio: the caller owns the waiting (futures, timeouts) and
tells the mailbox about it through waiter ids.

Matching: a ``recv(tag, source, step)`` of a job matches a delivery of the same job
with the same tag, and the same source / step when those are given (None matches any):
jobs are namespaces. Among matching deliveries the oldest offered wins; among matching
waiters the oldest registered wins.

Budget: deliveries queued here count against their (source, job)'s
``peer_inbox_bytes``. ``offer`` refuses (returns ``Refused``) a delivery that would
overflow it; the caller then holds that source's deliveries of that job back and offers
again once ``take`` frees space there, so a job whose trainers stop reading fills only
its own budget.
An empty inbox always admits one delivery, so a message larger than the budget is
slow, never stuck. A delivery handed straight to a waiter is not queued and counts
nothing here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import count

from wangate.core.jobs import DEFAULT_JOB
from wangate.delivery.delivered import Delivery

Box = tuple[str, str]  # (source, job): whose budget a delivery counts against


@dataclass(frozen=True)
class HandedToWaiter:
    """The delivery matched a waiting ``recv``; resolve waiter ``waiter_id`` with it."""

    waiter_id: int
    delivery: Delivery


@dataclass(frozen=True)
class Queued:
    """The delivery waits in the inbox."""


@dataclass(frozen=True)
class Refused:
    """The box's budget is full; offer again after space is freed for ``box``."""

    box: Box
    queued_bytes: int
    budget_bytes: int


OfferResult = HandedToWaiter | Queued | Refused


@dataclass(frozen=True)
class _Pattern:
    tag: str
    source: str | None
    step: int | None
    job: str = DEFAULT_JOB

    def matches(self, delivery: Delivery) -> bool:
        return (
            delivery.tag == self.tag
            and delivery.job == self.job
            and (self.source is None or delivery.source == self.source)
            and (self.step is None or delivery.step == self.step)
        )


def box_of(delivery: Delivery) -> Box:
    return delivery.source, delivery.job


def payload_size(delivery: Delivery) -> int:
    return memoryview(delivery.payload).nbytes + len(delivery.meta)


class Mailbox:
    def __init__(self, peer_inbox_bytes: int) -> None:
        if peer_inbox_bytes <= 0:
            raise ValueError("peer_inbox_bytes must be positive")
        self.peer_inbox_bytes = peer_inbox_bytes
        # Dict order is age order (put_back rebuilds it); keys are unique sequence numbers.
        self._queue: dict[int, Delivery] = {}
        self._seq = count()
        self._waiters: OrderedDict[int, _Pattern] = OrderedDict()
        self._waiter_ids = count(1)
        self._queued_bytes: dict[Box, int] = {}
        # (job, tag) -> sources that ever sent it
        self._senders_of: dict[tuple[str, str], set[str]] = {}

    # -- arrivals

    def offer(self, delivery: Delivery) -> OfferResult:
        senders = self._senders_of.setdefault((delivery.job, delivery.tag), set())
        if len(senders) < 64:  # a few sources per tag in practice; bounded regardless
            senders.add(delivery.source)
        handed = self._hand_to_waiter(delivery)
        if handed is not None:
            return handed
        size = payload_size(delivery)
        box = box_of(delivery)
        held = self._queued_bytes.get(box, 0)
        if held and held + size > self.peer_inbox_bytes:
            return Refused(box, held, self.peer_inbox_bytes)
        self._queue[next(self._seq)] = delivery
        self._queued_bytes[box] = held + size
        return Queued()

    def put_back(self, delivery: Delivery) -> HandedToWaiter | Queued:
        """Return a delivery whose waiter went away before using it.

        It goes to the next matching waiter, or becomes the oldest queued delivery. It
        was admitted once, so the budget is not checked again.
        """
        handed = self._hand_to_waiter(delivery)
        if handed is not None:
            return handed
        self._queue = {next(self._seq): delivery, **self._queue}
        box = box_of(delivery)
        self._queued_bytes[box] = self._queued_bytes.get(box, 0) + payload_size(delivery)
        return Queued()

    def _hand_to_waiter(self, delivery: Delivery) -> HandedToWaiter | None:
        for waiter_id, pattern in self._waiters.items():
            if pattern.matches(delivery):
                del self._waiters[waiter_id]
                return HandedToWaiter(waiter_id, delivery)
        return None

    # -- trainers

    def take(
        self,
        tag: str,
        source: str | None = None,
        step: int | None = None,
        job: str = DEFAULT_JOB,
    ) -> Delivery | None:
        """Remove and return the oldest queued delivery matching, or None."""
        pattern = _Pattern(tag, source, step, job)
        for seq, delivery in self._queue.items():
            if pattern.matches(delivery):
                del self._queue[seq]
                box = box_of(delivery)
                left = self._queued_bytes[box] - payload_size(delivery)
                if left:
                    self._queued_bytes[box] = left
                else:
                    del self._queued_bytes[box]
                return delivery
        return None

    def register(
        self,
        tag: str,
        source: str | None = None,
        step: int | None = None,
        job: str = DEFAULT_JOB,
    ) -> int:
        """Register a waiting recv (after ``take`` found nothing); returns its waiter id."""
        waiter_id = next(self._waiter_ids)
        self._waiters[waiter_id] = _Pattern(tag, source, step, job)
        return waiter_id

    def cancel(self, waiter_id: int) -> bool:
        """Forget a waiter (timeout, disconnect); False if it was already handed a delivery."""
        return self._waiters.pop(waiter_id, None) is not None

    def waiters(self) -> list[tuple[int, str, str | None, int | None, str]]:
        """(waiter id, tag, source, step, job) of every waiting recv, oldest first."""
        return [(w, p.tag, p.source, p.step, p.job) for w, p in self._waiters.items()]

    # -- inspection

    def sources_of(self, tag: str, job: str = DEFAULT_JOB) -> frozenset[str]:
        """The sources that have sent ``tag`` of ``job`` to this site so far."""
        return frozenset(self._senders_of.get((job, tag), ()))

    def queued_bytes(self, source: str, job: str = DEFAULT_JOB) -> int:
        return self._queued_bytes.get((source, job), 0)

    def job_counts(self) -> dict[str, tuple[int, int]]:
        """Per job: (deliveries queued, their bytes)."""
        counts: dict[str, tuple[int, int]] = {}
        for delivery in self._queue.values():
            queued, size = counts.get(delivery.job, (0, 0))
            counts[delivery.job] = (queued + 1, size + payload_size(delivery))
        return counts

    def queued_count(self) -> int:
        return len(self._queue)

    def waiter_count(self) -> int:
        return len(self._waiters)
