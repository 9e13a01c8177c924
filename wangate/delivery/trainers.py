"""Delivery to the site's trainers: the layer between the peer drivers and ``recv``.

The gateway wires one ``TrainerDelivery`` to every peer driver (as the driver's
``DeliverySink``, wangate.net.peer_driver) and to the service. What arrives goes to
the inbox (``Inbox``: matching, per-(source, job) budgets, waiting recvs); a large
message is assembled in a shared-memory segment (``InboundSegments``) and can be taken
while it arrives (``InboundStreams``). A delivery the inbox refuses (its (source, job)
budget is full) waits here, in arrival order, behind which later ones of that job from
that source wait too: one job's messages from one source reach trainers in the order
they completed, and the credit they hold keeps that job's sender back meanwhile (its
share of the peer's window is capped, wangate.core.jobs), not the other jobs.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from wangate.core.buffer import Buffer
from wangate.core.events import MessageDropped, MessageProgress, MessageReceived, PeerStateChanged
from wangate.core.inbound import Allocate, Free
from wangate.core.jobs import DEFAULT_JOB
from wangate.core.states import PeerStateKind
from wangate.delivery.delivered import Delivery
from wangate.delivery.inbox import Hopeless, Inbox, _never
from wangate.delivery.mailbox import Box, box_of
from wangate.delivery.segments import InboundSegments
from wangate.delivery.streams import InboundStreams, IncomingStream
from wangate.errors import ErrorCode, RecvTimeout

# where message bodies are assembled: allocate(size, payload offset, job), free, min size
BodyBuffers = tuple[Allocate, Free, int]


class TrainerDelivery:
    def __init__(self, peer_inbox_bytes: int) -> None:
        self.segments = InboundSegments()
        self.streams = InboundStreams(self.segments)
        self.inbox = Inbox(peer_inbox_bytes)
        self.hopeless: Hopeless = _never  # set by the service: it knows the peers' states
        self._refused: dict[Box, deque[Delivery]] = {}  # by (source, job), in arrival order
        self._redelivery: dict[Box, asyncio.Task[None]] = {}
        self.bytes_received: dict[Box, int] = {}  # payload bytes arrived, per (source, job)
        self._expiry: asyncio.TimerHandle | None = None  # the segment pool's next let-go

    # ------------------------------------------------------ the drivers' side

    def body_buffers(self) -> BodyBuffers:
        segments = self.segments
        return segments.allocate, segments.free, segments.min_bytes

    def received(self, source: str, event: MessageReceived) -> bool:
        """A whole, verified message from ``source``. True if a trainer took it while it
        arrived (a stream): the caller gives its credit back now."""
        if self.streams.completed(source, event.msg_id):
            self._count((source, event.header.job), event.payload)
            return True
        self.arrived(Delivery.received(source, event))
        return False

    def progress(self, source: str, event: MessageProgress) -> None:
        self.streams.progress(source, event.msg_id, event.body, event.ready_bytes)

    def dropped(self, source: str, event: MessageDropped) -> None:
        self.streams.dropped(source, event.msg_id, event.reason, event.code)

    def peer_gone(self, source: str, event: PeerStateChanged) -> None:
        """``source`` became unreachable or restarted: its streams end, and recvs that
        can now never be satisfied fail."""
        self.streams.peer_gone(source, event.state, event.reason)
        if event.state == PeerStateKind.UNREACHABLE:
            self.inbox.fail_waiters(self.hopeless)

    def arrived(self, delivery: Delivery) -> None:
        """Into the inbox, or behind what waits for room from the same source and job."""
        box = box_of(delivery)
        self._count(box, delivery.payload)
        waiting = self._refused.get(box)
        if waiting is None and self.inbox.try_deliver(delivery):
            return
        if waiting is None:
            waiting = self._refused[box] = deque()
            task = asyncio.get_running_loop().create_task(self._redeliver(box))
            self._redelivery[box] = task
        waiting.append(delivery)

    def _count(self, box: Box, payload: Buffer) -> None:
        self.bytes_received[box] = self.bytes_received.get(box, 0) + memoryview(payload).nbytes

    async def _redeliver(self, box: Box) -> None:
        waiting = self._refused[box]
        try:
            while waiting:
                await self.inbox.deliver(waiting[0])  # waits for room
                waiting.popleft()
        finally:
            del self._refused[box]
            del self._redelivery[box]

    # ------------------------------------------------------ the service's side

    def returned(self, connection: int, segment_ids: Sequence[int]) -> None:
        """A trainer's client let go of these segments: pooled for reuse, each let go
        after ``POOL_IDLE_S`` unless a message was written into it first."""
        if not segment_ids:
            return
        loop = asyncio.get_running_loop()
        self.segments.returned(connection, segment_ids, loop.time())
        if self._expiry is None:
            self._expire()

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        due = self.segments.expire(loop.time())
        self._expiry = None if due is None else loop.call_at(due, self._expire)

    async def receive(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        job: str = DEFAULT_JOB,
    ) -> Delivery:
        return await self.inbox.receive(tag, source, step, timeout_s, self.hopeless, job)

    async def receive_stream(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        job: str = DEFAULT_JOB,
    ) -> Delivery | IncomingStream:
        """``receive``, or sooner: a large message whose header is in, still arriving
        (proto/localapi.md, "Streamed delivery"). A whole one waiting comes first."""
        delivery = self.inbox.take(tag, source, step, job)
        if delivery is not None:
            return delivery
        stream = self.streams.take(tag, source, step, job)
        if stream is not None:
            return stream
        whole = asyncio.ensure_future(self.receive(tag, source, step, None, job))
        early = self.streams.wait(tag, source, step, job)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wait((whole, early), return_when=asyncio.FIRST_COMPLETED)
        except BaseException as exc:
            self.streams.cancel_wait(early)
            whole.cancel()  # the inbox puts back what it handed over just now
            await asyncio.gather(whole, return_exceptions=True)
            got = whole.result() if whole.done() and not whole.cancelled() else None
            if isinstance(exc, TimeoutError):
                if got is not None:  # it came as the time ran out
                    return got
                what = f"{tag!r}" + (f" from {source!r}" if source else "")
                what += f" at step {step}" if step is not None else ""
                raise RecvTimeout(
                    f"no message {what} arrived within {timeout_s:g} s", code=ErrorCode.TIMEOUT
                ) from None
            if got is not None:
                self.inbox.put_back(got)  # for the next recv: nothing is lost
            raise
        if whole.done():
            self.streams.cancel_wait(early)  # a stream it got too is offered again
            return whole.result()
        whole.cancel()
        await asyncio.gather(whole, return_exceptions=True)
        return early.result()

    def forget(self, delivery: Delivery) -> None:
        """A delivery that never reached the inbox: its segment, if any, is freed."""
        if isinstance(delivery.payload, memoryview):
            self.segments.free(delivery.payload)

    def close(self) -> None:
        for task in list(self._redelivery.values()):
            task.cancel()
