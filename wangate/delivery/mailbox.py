"""A site's inbox: arrived messages waiting for trainers' ``recv`` calls.

Pure bookkeeping, no asyncio: the caller owns the waiting (futures, timeouts) and
tells the mailbox about it through waiter ids.

Matching: a ``recv(tag, source, step)`` matches a delivery with the same tag, and the
same source / step when those are given (None matches any). Among matching
deliveries the oldest offered wins; among matching waiters the oldest registered wins.

Budget: deliveries queued here count against their source's ``peer_inbox_bytes``.
``offer`` refuses (returns ``Refused``) a delivery that would overflow its source's
budget; the transport then holds that source back (stops granting it credit) and
offers again once ``take`` frees space (``Taken.source`` names whose space it was).
An empty inbox always admits one delivery, so a message larger than the budget is
slow, never stuck. A delivery handed straight to a waiter is not queued and counts
nothing here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import count

from wangate.delivery.delivered import Delivery


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
    """The source's inbox is full; offer again after space is freed for ``source``."""

    source: str
    queued_bytes: int
    budget_bytes: int


OfferResult = HandedToWaiter | Queued | Refused


@dataclass(frozen=True)
class _Pattern:
    tag: str
    source: str | None
    step: int | None

    def matches(self, delivery: Delivery) -> bool:
        return (
            delivery.tag == self.tag
            and (self.source is None or delivery.source == self.source)
            and (self.step is None or delivery.step == self.step)
        )


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
        self._queued_bytes: dict[str, int] = {}
        self._senders_of: dict[str, set[str]] = {}  # tag -> sources that ever sent it

    # -- arrivals

    def offer(self, delivery: Delivery) -> OfferResult:
        senders = self._senders_of.setdefault(delivery.tag, set())
        if len(senders) < 64:  # a few sources per tag in practice; bounded regardless
            senders.add(delivery.source)
        handed = self._hand_to_waiter(delivery)
        if handed is not None:
            return handed
        size = payload_size(delivery)
        held = self._queued_bytes.get(delivery.source, 0)
        if held and held + size > self.peer_inbox_bytes:
            return Refused(delivery.source, held, self.peer_inbox_bytes)
        self._queue[next(self._seq)] = delivery
        self._queued_bytes[delivery.source] = held + size
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
        self._queued_bytes[delivery.source] = self._queued_bytes.get(
            delivery.source, 0
        ) + payload_size(delivery)
        return Queued()

    def _hand_to_waiter(self, delivery: Delivery) -> HandedToWaiter | None:
        for waiter_id, pattern in self._waiters.items():
            if pattern.matches(delivery):
                del self._waiters[waiter_id]
                return HandedToWaiter(waiter_id, delivery)
        return None

    # -- trainers

    def take(self, tag: str, source: str | None = None, step: int | None = None) -> Delivery | None:
        """Remove and return the oldest queued delivery matching, or None."""
        pattern = _Pattern(tag, source, step)
        for seq, delivery in self._queue.items():
            if pattern.matches(delivery):
                del self._queue[seq]
                left = self._queued_bytes[delivery.source] - payload_size(delivery)
                if left:
                    self._queued_bytes[delivery.source] = left
                else:
                    del self._queued_bytes[delivery.source]
                return delivery
        return None

    def register(self, tag: str, source: str | None = None, step: int | None = None) -> int:
        """Register a waiting recv (after ``take`` found nothing); returns its waiter id."""
        waiter_id = next(self._waiter_ids)
        self._waiters[waiter_id] = _Pattern(tag, source, step)
        return waiter_id

    def cancel(self, waiter_id: int) -> bool:
        """Forget a waiter (timeout, disconnect); False if it was already handed a delivery."""
        return self._waiters.pop(waiter_id, None) is not None

    def waiters(self) -> list[tuple[int, str, str | None, int | None]]:
        """(waiter id, tag, source, step) of every waiting recv, oldest first."""
        return [(w, p.tag, p.source, p.step) for w, p in self._waiters.items()]

    # -- inspection

    def sources_of(self, tag: str) -> frozenset[str]:
        """The sources that have sent ``tag`` to this site so far."""
        return frozenset(self._senders_of.get(tag, ()))

    def queued_bytes(self, source: str) -> int:
        return self._queued_bytes.get(source, 0)

    def queued_count(self) -> int:
        return len(self._queue)

    def waiter_count(self) -> int:
        return len(self._waiters)
