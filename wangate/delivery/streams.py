"""Large messages handed to a trainer while they arrive (``recv`` with ``stream``).

A large message from a peer is assembled in a shared-memory segment (segments.py). As
soon as its header is in, the session reports it (``MessageProgress``) and it is open
here; a streaming ``recv`` that matches takes it then, not at the end: the trainer maps
the segment and reads the contiguous prefix while the rest is in flight. The gateway
tells it how far the prefix reaches each time it crosses a step (never per datagram),
and at the end that the whole message passed its checksum, or why it failed.

Ownership: a taken stream is that trainer's. When it completes, the trainer holds it
(the credit goes back to the peer at once); if the trainer went away meanwhile, the
message is simply consumed. A message nobody takes while it arrives goes to the inbox
when complete, as any other.

This is the asyncio side only: which message matches which recv, and who waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass

from wangate.core.frames import REJECT_CHECKSUM, REJECT_EXPIRED
from wangate.core.jobs import DEFAULT_JOB
from wangate.core.message import decode_header
from wangate.core.states import PeerStateKind
from wangate.delivery.segments import InboundSegments
from wangate.errors import (
    ErrorCode,
    GatewayError,
    MessageFailed,
    PeerUnreachable,
    RemoteProtocolError,
)

Key = tuple[str, int]  # (source, msg_id)


@dataclass
class IncomingStream:
    """One message from ``source`` taken by a streaming recv before it is complete."""

    source: str
    msg_id: int
    tag: str
    step: int
    critical: bool
    meta: bytes
    checksum: int
    body: memoryview  # where the session assembles it (a segment)
    payload_offset: int  # in ``body``
    ready_body_bytes: int = 0  # contiguous prefix of the body now in (unverified)
    done: bool = False  # whole and verified
    error: GatewayError | None = None  # failed: why
    fd: int | None = None  # the segment's sealed descriptor, until it goes to the trainer
    taken: bool = False
    job: str = DEFAULT_JOB

    def __post_init__(self) -> None:
        self.changed = asyncio.Event()  # ready bytes grew, or it finished

    @property
    def payload_bytes(self) -> int:
        return self.body.nbytes - self.payload_offset

    @property
    def segment_offset(self) -> int:
        """Where the payload starts in the segment (the body ends the segment)."""
        return memoryview(self.body.obj).nbytes - self.body.nbytes + self.payload_offset

    @property
    def ready_bytes(self) -> int:
        """Of the payload: contiguous from its start, not verified before ``done``."""
        return max(0, min(self.ready_body_bytes, self.body.nbytes) - self.payload_offset)

    @property
    def finished(self) -> bool:
        return self.done or self.error is not None

    def take_fd(self) -> int | None:
        fd, self.fd = self.fd, None
        return fd

    def close_fd(self) -> None:
        fd = self.take_fd()
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class _Waiter:
    tag: str
    source: str | None
    step: int | None
    future: asyncio.Future[IncomingStream]
    job: str = DEFAULT_JOB

    def matches(self, stream: IncomingStream) -> bool:
        return (
            stream.tag == self.tag
            and stream.job == self.job
            and (self.source is None or stream.source == self.source)
            and (self.step is None or stream.step == self.step)
        )


class InboundStreams:
    """Large messages in progress, and the streaming recvs waiting for one.

    Only a message assembled in a segment (``segments``) can be streamed; its sealed
    descriptor is taken from ``segments`` when a recv takes it, given back if that recv
    goes away before its reply went out.
    """

    def __init__(self, segments: InboundSegments) -> None:
        self._segments = segments
        self._open: dict[Key, IncomingStream] = {}  # in start order
        self._waiters: list[_Waiter] = []
        self.streamed = 0  # messages taken before they were complete

    @property
    def open_count(self) -> int:
        return len(self._open)

    # ------------------------------------------------ from the peer drivers

    def progress(self, source: str, msg_id: int, body: memoryview, ready_bytes: int) -> None:
        """The session's ``MessageProgress`` for a message from ``source``."""
        stream = self._open.get((source, msg_id))
        if stream is None:
            stream = self._opened(source, msg_id, body, ready_bytes)
            if stream is None:
                return
            self._open[(source, msg_id)] = stream
            self._offer(stream)
            return
        stream.ready_body_bytes = max(stream.ready_body_bytes, ready_bytes)
        stream.changed.set()

    def _opened(
        self, source: str, msg_id: int, body: memoryview, ready_bytes: int
    ) -> IncomingStream | None:
        try:
            header, start = decode_header(body[:ready_bytes])
        except RemoteProtocolError:
            return None  # not a header after all: the end drops it
        if not self._segments.holds(body):
            return None
        return IncomingStream(
            source,
            msg_id,
            header.tag,
            header.step,
            header.critical,
            header.meta,
            header.checksum,
            body,
            start,
            ready_bytes,
            job=header.job,
        )

    def completed(self, source: str, msg_id: int) -> bool:
        """The message is whole and verified. True if a trainer has it already (the
        caller gives its credit back); False: it goes to the inbox as usual."""
        stream = self._open.pop((source, msg_id), None)
        if stream is None:
            return False
        if not stream.taken:
            return False
        stream.ready_body_bytes = stream.body.nbytes
        stream.done = True
        stream.changed.set()
        return True

    def dropped(self, source: str, msg_id: int, reason: str, code: int) -> None:
        stream = self._open.pop((source, msg_id), None)
        if stream is None:
            return
        what = f"message {stream.tag!r} (step {stream.step}) from {source}"
        if code == REJECT_CHECKSUM:
            error: GatewayError = GatewayError(
                f"{what} failed its checksum: {reason}", code=ErrorCode.CHECKSUM
            )
        elif code == REJECT_EXPIRED:
            error = MessageFailed(f"{what} was abandoned by its sender: {reason}")
        else:
            error = MessageFailed(f"{what} was dropped: {reason}")
        self._fail(stream, error)

    def peer_gone(self, source: str, state: str, reason: str) -> None:
        """The peer became unreachable or restarted: its messages in progress end."""
        for key in [key for key in self._open if key[0] == source]:
            stream = self._open.pop(key)
            what = f"message {stream.tag!r} (step {stream.step}) from {source}"
            got = f"{stream.ready_bytes} of {stream.payload_bytes} bytes in"
            if state == PeerStateKind.UNREACHABLE:
                error: GatewayError = PeerUnreachable(
                    f"{what}: peer {source} is unreachable ({reason}); {got}"
                )
            else:
                error = MessageFailed(f"{what}: peer {source} {state} ({reason}); {got}")
            self._fail(stream, error)

    def _fail(self, stream: IncomingStream, error: GatewayError) -> None:
        stream.error = error
        stream.changed.set()

    # ------------------------------------------------------- from recvs

    def take(
        self, tag: str, source: str | None, step: int | None, job: str = DEFAULT_JOB
    ) -> IncomingStream | None:
        """The oldest open message that matches and nobody took, now taken."""
        probe = _Waiter(tag, source, step, asyncio.get_running_loop().create_future(), job)
        for stream in self._open.values():
            if not stream.taken and probe.matches(stream):
                self._take(stream)
                return stream
        return None

    def _take(self, stream: IncomingStream) -> None:
        stream.taken = True
        stream.fd = self._segments.claim(stream.body)
        self.streamed += 1

    def wait(
        self, tag: str, source: str | None, step: int | None, job: str = DEFAULT_JOB
    ) -> asyncio.Future[IncomingStream]:
        future: asyncio.Future[IncomingStream] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(tag, source, step, future, job))
        return future

    def cancel_wait(self, future: asyncio.Future[IncomingStream]) -> None:
        """Stop waiting; a stream the future got meanwhile is offered again."""
        self._waiters = [w for w in self._waiters if w.future is not future]
        if future.done() and not future.cancelled():
            self.put_back(future.result())
        else:
            future.cancel()

    def put_back(self, stream: IncomingStream) -> None:
        """A taken stream whose recv went away before its first reply was written."""
        stream.taken = False
        self.streamed -= 1
        fd = stream.take_fd()
        if stream.finished:  # nobody will take it now: what a recv would close
            if fd is not None:
                os.close(fd)
            return
        if fd is not None:
            self._segments.restore(stream.body, fd)
        self._offer(stream)

    def _offer(self, stream: IncomingStream) -> None:
        for waiter in self._waiters:
            if not waiter.future.done() and waiter.matches(stream):
                self._waiters.remove(waiter)
                self._take(stream)
                waiter.future.set_result(stream)
                return
