"""The client's side of the local API without I/O: each call written once.

A call is a generator (``Call``). It yields ``Exchange``s (a request frame to write,
and the wait for its reply) and ``OpenStream`` (make the message of a streaming recv,
each shell its own kind), and is sent the typed ``Answer``, or has the error thrown
in. ``Client`` (blocking) and ``AsyncClient`` (asyncio) are shells that carry the
steps out over their socket (``wangate.stepper``) and hand the frames they read to
``reply_in``; what a call asks, in which order, and what its replies mean is here.

Why generators, of the three usual ways: a call can be several exchanges around state
that must be put back however it ends (a large send may ping first, to learn which
shared-memory segments came back, and a lent segment is returned when the send
fails), and the collectives' scripts (``wangate.collective.steps``) are generators
already, so one model covers both, with no build step. httpcore's way (an async
source, the blocking copy generated from it) needs a code generator and a check that
the copy is current; redis-py's (one shared command layer over two connection
classes) writes a call once only while it is one request and one reply.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Generator, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

import numpy as np

from wangate.collective import api as _coll
from wangate.collective.api import PartialResult
from wangate.collective.steps import Script
from wangate.core.buffer import Buffer
from wangate.errors import ErrorCode, GatewayError
from wangate.localapi.protocol import (
    MAX_ID,
    VERSION,
    ClaimRequest,
    FrameError,
    HelloRequest,
    PathsRequest,
    PingRequest,
    RecvRequest,
    Request,
    ResetPathRequest,
    SendRequest,
    StatusRequest,
    StreamProgress,
    WaitRequest,
    decode_reply,
    segment_field,
)
from wangate.localapi.replies import (
    DoneReply,
    ErrorReply,
    HelloReply,
    PathsReply,
    RecvReply,
    Reply,
    SendReply,
    StatusReply,
    WaitReply,
    decode_answer,
    released_of,
    reply_header,
)
from wangate.shm import map_delivered, when_unmapped
from wangate.tensorlike import as_reducible_array, as_wire_array

from .failures import failure, malformed
from .session import Session

R = TypeVar("R", bound=Reply)
T = TypeVar("T")


@dataclass(frozen=True)
class Exchange:
    """Write ``request`` (``payload`` after it, ``fd`` with its first byte); wait for
    its reply. -> ``Answer``"""

    request: Request
    payload: Buffer = b""
    fd: int | None = None
    # the gateway may have refused the connection already: a write that fails on the
    # closed socket still leaves its reason to read
    first: bool = False

    @property
    def streaming(self) -> bool:
        """More replies follow the first (a streaming recv)."""
        return isinstance(self.request, RecvRequest) and self.request.stream


@dataclass(frozen=True)
class Answer:
    reply: Reply  # never an ``ErrorReply``: that is raised
    header: dict[str, Any]  # the reply's map, as ``wangate.incoming`` reads it
    payload: memoryview


@dataclass(frozen=True)
class OpenStream:
    """-> the shell's incoming message for a recv with ``stream=True``."""

    request_id: int
    header: dict[str, Any]  # its first reply's map
    payload: memoryview


Step = Exchange | OpenStream
Call = Generator[Step, Any, T]


def _expect(answer: Answer, kind: type[R]) -> R:
    assert isinstance(answer.reply, kind)  # decode_answer decodes by the request's op
    return answer.reply


def _wire_or_none(array: Any) -> np.ndarray | None:
    return None if array is None else as_wire_array(array)[0]  # torch tensors as numpy


class ClientProtocol(Session):
    # ---------------------------------------------------------------- frames in

    def reply_in(
        self, header: bytes | memoryview, payload: memoryview, fds: deque[int]
    ) -> tuple[dict[str, Any], memoryview]:
        """A reply frame as read: its checked map, and its payload (mapped from its
        segment, whose descriptor came with the frame). ``FrameError``: the stream is
        broken; ``GatewayError``: a segment that cannot be used."""
        reply = decode_reply(header)
        mapped = self._segment_payload(reply, fds)
        if reply["ok"]:
            self.pool.released(released_of(reply))  # the gateway let go of them
        return reply, payload if mapped is None else mapped

    def _segment_payload(self, reply: dict[str, Any], fds: deque[int]) -> memoryview | None:
        """The payload of a reply that came as a segment, mapped copy-on-write."""
        segment = reply.get("segment")
        if segment is None:
            return None
        if not fds:
            raise malformed("a segment without a descriptor")
        fd = fds.popleft()
        try:
            offset, length = segment_field(segment, reply.get("id"))
            mapped = map_delivered(fd, offset, length)
        except (FrameError, OSError, ValueError) as exc:
            raise malformed(f"segment: {exc}") from None
        finally:
            os.close(fd)
        segment_id = reply.get("segment_id")
        if type(segment_id) is int and 1 <= segment_id <= MAX_ID and length > 0:
            when_unmapped(mapped, partial(self.returnable.append, segment_id))
        return mapped

    def answer(self, exchange: Exchange, reply: dict[str, Any], payload: memoryview) -> Answer:
        """``reply`` typed as the answer to ``exchange``; raises the error it says."""
        request = exchange.request
        if isinstance(request, HelloRequest) and reply["ok"] and reply.get("protocol") != VERSION:
            raise GatewayError(
                f"wangate at {self.path} speaks protocol {reply.get('protocol')!r}, "
                f"this client {VERSION}: upgrade the older side",
                code=ErrorCode.BAD_VERSION,
            )
        try:
            typed = decode_answer(request, reply)
        except FrameError as exc:
            raise malformed(exc) from None
        if isinstance(typed, ErrorReply):
            raise failure(typed)
        return Answer(typed, reply, payload)

    # ---------------------------------------------------------------- the calls

    def hello(self) -> Call[None]:
        answer = yield Exchange(HelloRequest(self.next_id(), self._requested_job), first=True)
        self.accept_hello(_expect(answer, HelloReply))

    def send(
        self,
        peer: str,
        tag: str,
        array: np.ndarray,
        *,
        step: int,
        critical: bool,
        codec: str | None,
        deadline_s: float | None,
    ) -> Call[int]:
        meta, payload, checksum = self.encode(peer, tag, array, codec)
        return (
            yield from self.send_encoded(
                peer,
                tag,
                meta,
                payload,
                checksum,
                step=step,
                critical=critical,
                deadline_s=deadline_s,
            )
        )

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
        deadline_s: float | None,
    ) -> Call[int]:
        def request(segment: tuple[int, int] | None = None, token: int = 0) -> SendRequest:
            return SendRequest(
                self.next_id(),
                peer,
                tag,
                step,
                critical,
                meta,
                checksum,
                deadline_s,
                segment,
                token or None,
            )

        if not self.segment_wanted(payload):
            return _expect((yield Exchange(request(), payload)), SendReply).message_id
        if not self.pool.has_free(payload.nbytes) and self.pool.lent_count:
            yield from self.ping()  # its reply says which segments the gateway let go of since
        token, fd, mapping = self.fill_segment(payload)
        failed = True
        try:
            answer = yield Exchange(request((0, payload.nbytes), token), fd=fd)
            message_id = _expect(answer, SendReply).message_id
            failed = False
            return message_id
        finally:
            self.handed_back(token, fd, mapping, failed=failed)

    def recv(
        self, tag: str, *, source: str | None, step: int | None, timeout: float | None, stream: bool
    ) -> Call[Any]:
        """The array; with ``stream``, the shell's incoming message."""
        segments = self.segment_min_bytes is not None
        streaming = stream and segments
        rid = self.next_id()
        returns = self.segments_return and not streaming
        returned = self.to_return() if self.segments_return else ()
        answer = yield Exchange(
            RecvRequest(rid, tag, source, step, timeout, segments, streaming, returns, returned)
        )
        reply = _expect(answer, RecvReply)
        if not stream:
            return self.decode(reply.meta, reply.checksum, answer.payload)
        header = answer.header
        if not streaming:  # the whole message: its one reply of a finished stream
            header = reply_header(
                replace(reply, progress=StreamProgress(answer.payload.nbytes, True))
            )
        return (yield OpenStream(rid, header, answer.payload))

    def wait(self, peer: str, message_id: int, *, timeout: float | None) -> Call[None]:
        _expect((yield Exchange(WaitRequest(self.next_id(), peer, message_id, timeout))), WaitReply)

    def paths(self) -> Call[list[dict[str, Any]]]:
        return _expect((yield Exchange(PathsRequest(self.next_id()))), PathsReply).paths

    def status(self) -> Call[dict[str, Any]]:
        return _expect((yield Exchange(StatusRequest(self.next_id()))), StatusReply).status

    def reset_path(self, peer: str, path: str) -> Call[None]:
        _expect((yield Exchange(ResetPathRequest(self.next_id(), peer, path))), DoneReply)

    def ping(self) -> Call[None]:
        _expect((yield Exchange(PingRequest(self.next_id()))), DoneReply)

    def claim(self, call: str, step: int) -> Call[None]:
        _expect((yield Exchange(ClaimRequest(self.next_id(), call, step))), DoneReply)

    # ---------------------------------------------------------------- collectives
    # Scripts of collective steps, which the shells carry out through their own calls.

    def allreduce(
        self,
        tag: str,
        array: np.ndarray,
        *,
        step: int,
        op: str,
        codec: str | None,
        critical: bool,
        timeout: float,
        sites: Iterable[str] | None,
        partial: bool,
    ) -> Script[np.ndarray | PartialResult]:
        return _coll.allreduce_script(
            self.site,
            self.settings,
            self.collective,
            self.choose_spec,
            tag,
            as_reducible_array(array),
            step=step,
            op=op,
            codec=codec,
            critical=critical,
            timeout=timeout,
            sites=sites,
            partial=partial,
        )

    def broadcast(
        self,
        tag: str,
        array: np.ndarray | None,
        *,
        root: str,
        step: int,
        timeout: float,
        sites: Iterable[str] | None,
    ) -> Script[np.ndarray]:
        return _coll.broadcast_script(
            self.site,
            self.settings,
            tag,
            _wire_or_none(array),
            root=root,
            step=step,
            timeout=timeout,
            sites=sites,
        )

    def barrier(
        self, tag: str, *, step: int, timeout: float, sites: Iterable[str] | None
    ) -> Script[None]:
        return _coll.barrier_script(
            self.site, self.settings, tag, step=step, timeout=timeout, sites=sites
        )
