"""One trainer's connection to the local API: frames in, requests started, replies out.

Frames are read in order by the loop's readiness callback. A send the service can take
without waiting is submitted there and then; every other request runs in its own task,
so one connection may pipeline (a waiting ``recv`` does not hold up a ``send``).
Replies carry the request's id and go out as their requests complete, one whole frame
at a time. An idle connection holds no read buffer.

Limits, checked before anything is allocated: a payload larger than
``max_message_bytes`` closes the connection (after an error reply: skipping that many
bytes is not worth it); a request whose payload alone exceeds the connection's
``client_budget_bytes`` is refused and its bytes skipped; otherwise the reader waits
until the connection's payloads in flight fit the budget (backpressure, not an
error). A request the server cannot parse gets an error reply and the connection
goes on with the next frame, which the prefix's ``payload_len`` locates.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import weakref
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from wangate.core.buffer import Buffer
from wangate.core.jobs import DEFAULT_JOB
from wangate.delivery.delivered import Delivery
from wangate.delivery.streams import IncomingStream
from wangate.errors import ErrorCode, GatewayError
from wangate.localapi.access import peer_credentials, supplementary_groups
from wangate.localapi.dispatch import (
    Handed,
    ReplyPayload,
    dispatch,
    failure_reply,
    message_reply,
    recv_reply,
    submission,
)
from wangate.localapi.framing import EAGER_READ_BYTES, FrameAssembler, sock_send_frame
from wangate.localapi.protocol import (
    FrameError,
    FramePrefix,
    HelloRequest,
    RecvRequest,
    Request,
    SendRequest,
    StreamProgress,
    decode_request,
    encode_header,
)
from wangate.localapi.replies import ErrorReply, ProgressReply, Reply, SendReply, reply_header
from wangate.localapi.segments import FrameDescriptors, recv_with_fds
from wangate.service import Claimant, GatewayService
from wangate.shm import SegmentError, keep_source, map_segment

log = logging.getLogger("wangate.localapi")

MAX_REQUESTS_IN_FLIGHT = 64  # per connection
MAX_PENDING_FDS = MAX_REQUESTS_IN_FLIGHT  # descriptors received, not yet named by a frame
MAX_RELEASED = 4096  # hand-overs to report at once: a client that never asks learns no more
_numbers = itertools.count(1)  # connections, for what they hold at the gateway


class Connection:
    """One trainer's connection. Frames are read in the loop's readiness callback, and a
    send that needs no waiting is submitted right there: on a busy loop each extra
    turn (a task waking up, a task starting) can cost milliseconds."""

    def __init__(
        self,
        service: GatewayService,
        sock: socket.socket,
        *,
        max_message_bytes: int,
        client_budget_bytes: int,
    ) -> None:
        self.service = service
        self.sock = sock
        self.max_message_bytes = max_message_bytes
        self.client_budget_bytes = client_budget_bytes
        self.loop = asyncio.get_running_loop()
        self.assembler = FrameAssembler(max_message_bytes)
        self.write_lock = asyncio.Lock()
        self.in_flight = 0  # requests read and not yet answered
        self.held_bytes = 0  # their payloads, until the service owns them
        self.reading: tuple[Request, int] | None = None  # its payload is arriving
        self.waiting: tuple[Request, int] | None = None  # read, waits for budget
        self.listening = False
        self.closing = False  # no more frames are read
        self.tasks: set[asyncio.Task[None]] = set()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.fds = FrameDescriptors(MAX_PENDING_FDS)  # for sends naming a segment
        # hand-overs (``segment_id``) whose mapping is gone, for the next success reply
        self.released: list[int] = []
        # the job every call is in: named by hello, else "default" from the first call
        # (either way admitted by the job's allow lists first)
        self.job: str | None = None
        self.refused: GatewayError | None = None  # why its hello's job was refused
        self.claimant = Claimant(next(_numbers), 0)

    def _join(self, job: str) -> str:
        """Join ``job`` (raises ``GatewayError`` naming why not); the connection's job.
        A connection stays in its job: a later hello may only name it again."""
        if self.job is not None:
            if job != self.job:
                raise GatewayError(
                    f"this connection is in job {self.job!r}; a connection's job never "
                    f"changes (connect again for job {job!r})",
                    code=ErrorCode.BAD_REQUEST,
                )
            return job
        peer = peer_credentials(self.sock)
        gids = (peer.gid, *supplementary_groups(peer.pid))
        try:
            self.job = self.service.join(job, peer.uid, gids)
        except GatewayError as exc:
            self.refused = exc  # its later calls get the same answer, not the default job
            raise
        self.claimant = Claimant(self.claimant.connection, peer.pid)
        return self.job

    def _job(self) -> str:
        if self.job is not None:
            return self.job
        if self.refused is not None:
            raise self.refused
        return self._join(DEFAULT_JOB)

    async def run(self) -> None:
        self._listen(True)
        try:
            await self.finished
        finally:
            self._listen(False)
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.service.left(self.claimant.connection)
            self.fds.close()
            self.sock.close()

    def _listen(self, on: bool) -> None:
        if on != self.listening and not (on and self.closing):
            self.listening = on
            if on:
                self.loop.add_reader(self.sock.fileno(), self._on_readable)
            else:
                self.loop.remove_reader(self.sock.fileno())

    def _finish(self) -> None:
        self.closing = True
        self._listen(False)
        if not self.finished.done():
            self.finished.set_result(None)

    def _on_readable(self) -> None:
        budget = EAGER_READ_BYTES  # then the loop turns: one client cannot hold it
        while self.listening and budget > 0:
            target = self.assembler.writable()
            try:
                received, fds = recv_with_fds(self.sock, target)
            except (BlockingIOError, InterruptedError):
                self.assembler.release_idle()  # an idle connection holds no buffer
                return
            except (OSError, SegmentError):  # SegmentError: more descriptors than we take
                self._finish()
                return
            if not self.fds.received(received, fds):
                log.warning("a local client sent descriptors no frame named; closing it")
                self._finish()
                return
            if received == 0:  # the client closed, between frames or in one
                self._finish()
                return
            drained = received < len(target)  # nothing more queued: skip the EAGAIN read
            del target
            self.assembler.wrote(received)
            budget -= received
            try:
                self._advance()
            except Exception:  # a bug here must not leave the client waiting forever
                log.exception("local API connection failed; closing it")
                self._finish()
                return
            if drained:
                return  # the readiness callback runs again when more arrives

    def _advance(self) -> None:
        """Act on every complete frame; stops while a request waits for room."""
        while self.waiting is None and not self.closing:
            if self.reading is not None:
                payload = self.assembler.take_payload()
                if payload is None:
                    return
                request, payload_bytes = self.reading
                self.reading = None
                self._start(request, payload, payload_bytes)
                continue
            if self.in_flight >= MAX_REQUESTS_IN_FLIGHT:
                self._listen(False)  # until a reply goes out: replies nobody reads pile up
                return
            try:
                head = self.assembler.next_head()
            except FrameError as exc:  # prefix-level: the stream cannot be resynchronised
                self.closing = True
                self._listen(False)
                self._spawn(self._reply_and_finish(ErrorReply(None, exc.code, str(exc))))
                return
            if head is None:
                return
            self._on_head(*head)

    def _on_head(self, prefix: FramePrefix, header: bytes) -> None:
        payload_bytes = prefix.payload_bytes
        try:
            request = decode_request(header, payload_bytes)
            if payload_bytes > self.client_budget_bytes:
                raise FrameError(
                    ErrorCode.OVER_BUDGET,
                    f"payload of {payload_bytes} bytes exceeds this client's budget of "
                    f"{self.client_budget_bytes} bytes (client_budget_bytes)",
                    request.request_id,
                )
        except FrameError as exc:
            self.assembler.skip_payload(payload_bytes)
            self.in_flight += 1
            self._spawn(self._reply(ErrorReply(exc.request_id, exc.code, str(exc))))
            return
        if isinstance(request, SendRequest) and request.segment is not None:
            self._on_segment(request, *request.segment)
            return
        self._admit(request, payload_bytes)

    def _segment_released(self, segment_id: int) -> None:
        if not self.closing and len(self.released) < MAX_RELEASED:
            self.released.append(segment_id)

    def _on_segment(self, request: SendRequest, offset: int, length: int) -> None:
        """A send whose payload is in the segment that came with its frame: map it and
        let go of the descriptor (the mapping keeps it alive while the message needs
        it). Anything wrong with it costs this request only."""
        start = self.assembler.frame_start
        fd = self.fds.take(start, start + self.assembler.frame_bytes)
        self.in_flight += 1
        try:
            if fd is None:
                raise GatewayError(
                    "send names a segment but no file descriptor came with it",
                    code=ErrorCode.BAD_SEGMENT,
                )
            if length > self.max_message_bytes:
                raise GatewayError(
                    f"segment payload of {length} bytes exceeds the gateway's limit of "
                    f"{self.max_message_bytes} bytes (max_message_bytes)",
                    code=ErrorCode.TOO_LARGE,
                )
            payload = map_segment(fd, offset, length)
            if request.segment_id is not None and length:
                # the mapping goes once the message is done (or failed): the client may
                # then reuse the segment
                weakref.finalize(payload.obj, self._segment_released, request.segment_id)
        except GatewayError as exc:
            self._spawn(self._reply(ErrorReply(request.request_id, exc.code, str(exc))))
            if fd is not None:
                os.close(fd)
            return
        if length:  # workers send from it: the descriptor lives as long as the mapping
            keep_source(payload, fd, offset)
        else:
            os.close(fd)
        self._start(request, payload, 0)

    def _admit(self, request: Request, payload_bytes: int) -> None:
        """Read the payload now if the budget allows; else pause reading (``_advance``
        reads no frame while MAX_REQUESTS_IN_FLIGHT wait for replies)."""
        if self.held_bytes > 0 and self.held_bytes + payload_bytes > self.client_budget_bytes:
            self.waiting = (request, payload_bytes)
            self._listen(False)  # backpressure, not an error
            return
        self.in_flight += 1
        self.held_bytes += payload_bytes
        if payload_bytes:
            self.assembler.expect_payload(payload_bytes)
            self.reading = (request, payload_bytes)
        else:
            self._start(request, b"", 0)

    def _start(self, request: Request, payload: Buffer, payload_bytes: int) -> None:
        if isinstance(request, SendRequest):
            rid = request.request_id
            try:
                message_id = self.service.submit_now(submission(request, payload, self._job()))
            except Exception as exc:
                self._release(payload_bytes)
                self._spawn(self._reply(failure_reply(rid, exc, request)))
                return
            if message_id is not None:
                self._release(payload_bytes)
                self._spawn(self._reply(SendReply(rid, message_id)))
                return
        if isinstance(request, RecvRequest):
            # segments it let go of are back before it waits (streamed or not)
            self.service.returned(self.claimant.connection, request.returned)
            if request.stream:
                self._spawn(self._stream(request))
                return
        self._spawn(self._handle(request, payload, payload_bytes))

    def _release(self, payload_bytes: int) -> None:
        """A payload is the service's now: its bytes leave this client's budget."""
        self.held_bytes -= payload_bytes
        self._resume()

    def _resume(self) -> None:
        """Room was freed: admit the request that waited for it, then read on."""
        if self.closing:
            return
        if self.waiting is not None:
            request, payload_bytes = self.waiting
            self.waiting = None
            self._admit(request, payload_bytes)
        if self.waiting is None and not self.listening and self.in_flight < MAX_REQUESTS_IN_FLIGHT:
            self._listen(True)
            self._advance()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, request: Request, payload: Buffer, payload_bytes: int) -> None:
        reply_payload: ReplyPayload = b""
        try:
            try:
                if isinstance(request, HelloRequest):
                    job = self._join(request.job or DEFAULT_JOB)
                else:
                    job = self._job()
                reply, reply_payload = await dispatch(
                    self.service, request, payload, job, self.claimant
                )
            finally:
                self._release(payload_bytes)  # the service owns the payload now
        except Exception as exc:
            reply = failure_reply(request.request_id, exc, request)
        await self._reply(reply, reply_payload)

    async def _stream(self, request: RecvRequest) -> None:
        """A streaming recv: one reply as soon as a matching message is there, whole or
        with its header in; then, for one still arriving, a reply each time its prefix
        grows by a step, and a last one when it is verified (``done``) or failed."""
        rid = request.request_id
        try:
            got = await self.service.receive_stream(
                request.tag, request.source, request.step, request.timeout_s, self._job()
            )
        except Exception as exc:
            await self._reply(failure_reply(rid, exc, request))
            return
        if isinstance(got, Delivery):
            reply, payload = recv_reply(rid, got, segments=True)
            done = StreamProgress(memoryview(got.payload).nbytes, True)
            await self._reply(replace(reply, progress=done), payload)
            return
        await self._stream_out(rid, got)

    async def _stream_out(self, rid: int, stream: IncomingStream) -> None:
        finished = False
        fd = stream.take_fd()
        try:
            if fd is None:  # cannot happen: a stream is taken with its descriptor
                raise GatewayError("the message's segment is gone", code=ErrorCode.INTERNAL)
            reply = replace(
                message_reply(rid, stream),
                segment=(stream.segment_offset, stream.payload_bytes),
                progress=StreamProgress(stream.ready_bytes, stream.done),
            )
            try:
                await self._write(reply, b"", fd)
            finally:
                os.close(fd)
            sent = stream.ready_bytes
            finished = stream.done
            while not finished:
                stream.changed.clear()
                if stream.error is not None:
                    error = stream.error
                    await self._write(ErrorReply(rid, error.code, str(error)))
                    finished = True
                elif stream.done or stream.ready_bytes > sent:
                    sent = stream.ready_bytes
                    finished = stream.done
                    await self._write(ProgressReply(rid, StreamProgress(sent, finished)))
                else:
                    await stream.changed.wait()
        except GatewayError as exc:
            with contextlib.suppress(OSError):
                await self._write(ErrorReply(rid, exc.code, str(exc)))
        except OSError:
            pass  # the client went away; reading notices
        finally:
            # unfinished: the trainer went away; the message completes (or fails)
            # without it, and its credit goes back all the same (streams.py)
            self.in_flight -= 1
            self._resume()

    async def _reply(self, reply: Reply, payload: ReplyPayload = b"") -> None:
        try:
            if isinstance(payload, Handed):
                try:
                    await self._write(reply, b"", payload.fd)
                finally:
                    os.close(payload.fd)  # the client has its own copy of it now
            else:
                await self._write(reply, payload)
        except OSError:
            pass  # the client went away; reading notices
        finally:
            self.in_flight -= 1
            self._resume()

    async def _reply_and_finish(self, reply: Reply) -> None:
        with contextlib.suppress(OSError):
            await self._write(reply)
        self._finish()

    async def _write(self, reply: Reply, payload: Buffer = b"", fd: int | None = None) -> None:
        body = memoryview(payload).cast("B")
        released: list[int] = []
        if self.released and not isinstance(reply, ErrorReply):
            released, self.released = self.released, []
        try:
            head = encode_header(reply_header(reply, released), body.nbytes)
        except (FrameError, TypeError, ValueError, OverflowError) as exc:
            log.error("cannot encode reply %r: %s", reply.request_id, exc)
            error = ErrorReply(reply.request_id, ErrorCode.INTERNAL, f"bad reply: {exc}")
            head = encode_header(reply_header(error))
            body = memoryview(b"")
        async with self.write_lock:
            await sock_send_frame(self.loop, self.sock, head, body, fd)
