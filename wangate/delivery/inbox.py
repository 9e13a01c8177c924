"""asyncio shell over ``Mailbox``: receivers wait on futures, senders wait for space."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from wangate.core.jobs import DEFAULT_JOB
from wangate.delivery.delivered import Delivery
from wangate.delivery.mailbox import Box, HandedToWaiter, Mailbox, OfferResult, Refused, box_of
from wangate.errors import ErrorCode, RecvTimeout, WangateError

# why no message can come for (tag, source, job): an error to raise, or None to wait
Hopeless = Callable[[str, str | None, str], WangateError | None]


def _never(tag: str, source: str | None, job: str) -> WangateError | None:
    return None


class Inbox:
    def __init__(self, peer_inbox_bytes: int) -> None:
        self.mailbox = Mailbox(peer_inbox_bytes)
        self._waiters: dict[int, asyncio.Future[Delivery]] = {}
        self._space_freed: dict[Box, asyncio.Event] = {}

    def try_deliver(self, delivery: Delivery) -> bool:
        """Hand over or queue ``delivery``; False when its (source, job) budget is full.

        On False the caller holds that box back and calls again after
        ``wait_for_space(box)`` returns.
        """
        return not isinstance(self._settle(self.mailbox.offer(delivery)), Refused)

    async def deliver(self, delivery: Delivery) -> None:
        """Deliver, waiting while its (source, job) budget is full (backpressure)."""
        while not self.try_deliver(delivery):
            await self.wait_for_space(box_of(delivery))

    async def wait_for_space(self, box: Box) -> None:
        await self._space_freed.setdefault(box, asyncio.Event()).wait()

    async def receive(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        hopeless: Hopeless = _never,
        job: str = DEFAULT_JOB,
    ) -> Delivery:
        """The oldest matching delivery; waits for one unless ``hopeless(tag, source,
        job)`` names why none can come (then raises that)."""
        delivery = self._take(tag, source, step, job)
        if delivery is not None:
            return delivery
        error = hopeless(tag, source, job)
        if error is not None:
            raise error
        waiter_id = self.mailbox.register(tag, source, step, job)
        future: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        self._waiters[waiter_id] = future
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except BaseException as exc:  # timeout or cancellation (client went away)
            self.mailbox.cancel(waiter_id)
            self._waiters.pop(waiter_id, None)
            if future.done() and not future.cancelled() and future.exception() is None:
                # Handed a delivery just as we left: it must not be lost.
                self.put_back(future.result())
            if isinstance(exc, TimeoutError):
                what = f"{tag!r}" + (f" from {source!r}" if source else "")
                what += f" at step {step}" if step is not None else ""
                raise RecvTimeout(
                    f"no message {what} arrived within {timeout_s:g} s", code=ErrorCode.TIMEOUT
                ) from None
            raise

    def fail_waiters(self, hopeless: Hopeless) -> int:
        """Fail every waiting recv for which ``hopeless(tag, source, job)`` gives an error."""
        failed = 0
        for waiter_id, tag, source, _step, job in self.mailbox.waiters():
            error = hopeless(tag, source, job)
            future = self._waiters.get(waiter_id)
            if error is None or future is None or future.done():
                continue
            self.mailbox.cancel(waiter_id)
            del self._waiters[waiter_id]
            future.set_exception(error)
            failed += 1
        return failed

    def put_back(self, delivery: Delivery) -> None:
        """A delivery taken from here that its recv could not use after all: it goes
        to the next matching recv, or first in line again."""
        self._settle(self.mailbox.put_back(delivery))

    def take(
        self, tag: str, source: str | None, step: int | None, job: str = DEFAULT_JOB
    ) -> Delivery | None:
        """The oldest matching delivery waiting, if any (no waiting)."""
        return self._take(tag, source, step, job)

    def _take(self, tag: str, source: str | None, step: int | None, job: str) -> Delivery | None:
        delivery = self.mailbox.take(tag, source, step, job)
        if delivery is not None:
            event = self._space_freed.pop(box_of(delivery), None)
            if event is not None:
                event.set()
        return delivery

    def _settle(self, result: OfferResult) -> OfferResult:
        # A waiter whose future is already cancelled cannot take the delivery: offer it on.
        while isinstance(result, HandedToWaiter):
            future = self._waiters.pop(result.waiter_id)
            if not future.done():
                future.set_result(result.delivery)
                break
            result = self.mailbox.put_back(result.delivery)
        return result
