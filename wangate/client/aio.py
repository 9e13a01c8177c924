"""``AsyncClient``: the asyncio shell over the client protocol (``protocol.py``).

What is its own: connecting within a timeout on the loop, one write at a time (a
cancelled caller never leaves half a frame), and a reader, the socket's readiness
callback, that hands each reply to the call waiting for it as it arrives (no task in
between), so that calls run concurrently on one connection; a streamed message is made
by the reader at its first reply, so that no progress reply can come before it exists.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterable
from typing import Any, Literal, TypeVar, overload

import numpy as np

from wangate.collective.steps import run_async
from wangate.errors import ErrorCode, GatewayError, GatewayUnavailable
from wangate.incoming import AsyncIncomingMessage
from wangate.localapi.framing import (
    ConnectionClosed,
    ReadyFrameReader,
    send_frame_at_once,
    sock_send_frame,
    sock_send_rest,
)
from wangate.localapi.protocol import FrameError, encode_request
from wangate.stepper import run_steps_async

from .address import CONNECT_TIMEOUT_S, checked_timeout, socket_path
from .failures import closed, failure_of, lost, timed_out, unavailable
from .protocol import Answer, Call, ClientProtocol, Exchange, Step

Frame = tuple[dict[str, Any], memoryview]
T = TypeVar("T")


async def _connect_unix(sock: socket.socket, path: str) -> None:
    """``loop.sock_connect`` for a Unix socket: while the listener's backlog is full a
    non-blocking connect fails with EAGAIN (it does not go on in the background, and
    no readiness event says when to retry), so retry, backing off up to 50 ms."""
    delay_s = 0.001
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            await asyncio.sleep(delay_s)
            delay_s = min(2 * delay_s, 0.05)


class AsyncClient:
    """asyncio client; calls may run concurrently on one connection."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = CONNECT_TIMEOUT_S,
        job: str | None = None,
    ) -> None:
        """``timeout`` bounds ``connect()``: connecting and the hello exchange, in all."""
        self._session = ClientProtocol(socket_path(path), job)
        self._timeout_s = checked_timeout(timeout)
        self._sock: socket.socket | None = None
        self._reader: ReadyFrameReader | None = None
        self._reading = False  # the loop calls _on_readable when replies arrive
        self._write_lock = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._failure: GatewayError | None = None
        # streaming recvs: the reader makes the message at its first reply
        self._stream_requests: set[int] = set()
        self._incoming: dict[int, AsyncIncomingMessage] = {}  # made, not yet returned
        self._streams: dict[int, AsyncIncomingMessage] = {}  # unfinished, by request id

    @property
    def site(self) -> str:
        return self._session.site

    @property
    def job(self) -> str:
        """The job every call on this connection is in (``default`` unless named)."""
        return self._session.job

    @property
    def settings(self) -> dict[str, Any]:
        return self._session.settings

    async def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        stage = "connect"
        try:
            async with asyncio.timeout(self._timeout_s):
                try:
                    await _connect_unix(sock, self._session.path)
                except OSError as exc:
                    sock.close()
                    raise unavailable(self._session.path, exc) from None
                self._sock = sock
                self._reader = ReadyFrameReader(sock, 0)
                asyncio.get_running_loop().add_reader(sock.fileno(), self._on_readable)
                self._reading = True
                stage = "hello"
                await self._run(self._session.hello())
        except TimeoutError:
            await self.close()
            sock.close()
            assert self._timeout_s is not None
            raise timed_out(self._session.path, stage, self._timeout_s) from None
        except BaseException:
            await self.close()
            raise
        self._reader.max_payload_bytes = self._session.max_message_bytes

    async def send(
        self,
        peer: str,
        tag: str,
        array: np.ndarray,
        *,
        step: int = 0,
        critical: bool = False,
        codec: str | None = None,
        deadline_s: float | None = None,
    ) -> int:
        """As ``Client.send``."""
        return await self._run(
            self._session.send(
                peer, tag, array, step=step, critical=critical, codec=codec, deadline_s=deadline_s
            )
        )

    @overload
    async def recv(
        self,
        tag: str,
        *,
        source: str | None = ...,
        step: int | None = ...,
        timeout: float | None = ...,
        stream: Literal[False] = ...,
    ) -> np.ndarray: ...

    @overload
    async def recv(
        self,
        tag: str,
        *,
        source: str | None = ...,
        step: int | None = ...,
        timeout: float | None = ...,
        stream: Literal[True],
    ) -> AsyncIncomingMessage: ...

    async def recv(
        self,
        tag: str,
        *,
        source: str | None = None,
        step: int | None = None,
        timeout: float | None = None,
        stream: bool = False,
    ) -> np.ndarray | AsyncIncomingMessage:
        """As ``Client.recv``; with ``stream=True`` an ``AsyncIncomingMessage``."""
        call = self._session.recv(tag, source=source, step=step, timeout=timeout, stream=stream)
        got: np.ndarray | AsyncIncomingMessage = await self._run(call)
        return got

    async def wait(self, peer: str, message_id: int, *, timeout: float | None = None) -> None:
        """As ``Client.wait``."""
        await self._run(self._session.wait(peer, message_id, timeout=timeout))

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
        deadline_s: float | None = None,
    ) -> int:
        """As ``Client.send_encoded``."""
        return await self._run(
            self._session.send_encoded(
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

    async def allreduce(
        self,
        tag: str,
        array: np.ndarray,
        *,
        step: int = 0,
        op: str = "sum",
        codec: str | None = None,
        critical: bool = False,
        timeout: float = 30.0,
        sites: Iterable[str] | None = None,
        partial: bool = False,
    ) -> Any:
        """As ``Client.allreduce``."""
        script = self._session.allreduce(
            tag,
            array,
            step=step,
            op=op,
            codec=codec,
            critical=critical,
            timeout=timeout,
            sites=sites,
            partial=partial,
        )
        return await run_async(self, script)

    async def broadcast(
        self,
        tag: str,
        array: np.ndarray | None,
        *,
        root: str,
        step: int = 0,
        timeout: float = 30.0,
        sites: Iterable[str] | None = None,
    ) -> np.ndarray:
        """As ``Client.broadcast``."""
        script = self._session.broadcast(
            tag, array, root=root, step=step, timeout=timeout, sites=sites
        )
        return await run_async(self, script)

    async def barrier(
        self, tag: str, *, step: int = 0, timeout: float = 30.0, sites: Iterable[str] | None = None
    ) -> None:
        """As ``Client.barrier``."""
        script = self._session.barrier(tag, step=step, timeout=timeout, sites=sites)
        await run_async(self, script)

    async def paths(self) -> list[dict[str, Any]]:
        return await self._run(self._session.paths())

    async def status(self) -> dict[str, Any]:
        return await self._run(self._session.status())

    async def reset_path(self, peer: str, path: str) -> None:
        """Close one path's connection now; the gateway reconnects it by itself."""
        await self._run(self._session.reset_path(peer, path))

    async def ping(self) -> None:
        await self._run(self._session.ping())

    async def claim(self, call: str, step: int) -> None:
        """As ``Client.claim``."""
        await self._run(self._session.claim(call, step))

    async def close(self) -> None:
        self._stop_reading()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._session.pool.close()
        self._fail(closed())

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---------------------------------------------------------------- the steps

    async def _run(self, call: Call[T]) -> T:
        return await run_steps_async(call, self._step)

    async def _step(self, step: Step) -> Answer | AsyncIncomingMessage:
        if isinstance(step, Exchange):
            return await self._exchange(step)
        made = self._incoming.pop(step.request_id, None)
        if made is not None:
            return made
        return AsyncIncomingMessage(
            step.header, step.payload, self._session.decode_header, failure_of
        )

    async def _exchange(self, exchange: Exchange) -> Answer:
        if self._failure is not None:
            raise self._failure
        if self._sock is None:
            raise GatewayUnavailable("this wangate client is not connected", code=ErrorCode.CLOSED)
        loop = asyncio.get_running_loop()
        rid = exchange.request.request_id
        body = memoryview(exchange.payload).cast("B")
        head = encode_request(exchange.request, body.nbytes)
        future: asyncio.Future[Frame] = loop.create_future()
        self._pending[rid] = future
        if exchange.streaming:
            self._stream_requests.add(rid)
        try:
            await self._write(exchange, head, body)
            reply, payload = await future
        finally:
            self._pending.pop(rid, None)
            self._stream_requests.discard(rid)
        return self._session.answer(exchange, reply, payload)

    async def _write(self, exchange: Exchange, head: bytes, body: memoryview) -> None:
        """The request's frame, whole and alone on the socket: at once when the socket
        takes it (no turn of the loop: a task woken per call costs on a busy or cold
        loop), else what is left by a task, shielded: a caller cancelled mid-write must
        not leave half a frame behind."""
        sock = self._sock
        assert sock is not None
        await self._write_lock.acquire()  # at once while nobody else writes
        try:
            rest = send_frame_at_once(sock, head, body, exchange.fd)
        except OSError as exc:
            self._write_lock.release()
            self._write_failed(exchange, exc)
            return
        if rest == []:  # the socket took it whole
            self._write_lock.release()
            return
        await asyncio.shield(
            asyncio.ensure_future(self._write_rest(sock, exchange, head, body, rest))
        )

    async def _write_rest(
        self,
        sock: socket.socket,
        exchange: Exchange,
        head: bytes,
        body: memoryview,
        rest: list[Any] | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            if rest is None:  # nothing went: the whole frame, its descriptor first
                await sock_send_frame(loop, sock, head, body, exchange.fd)
            else:
                await sock_send_rest(loop, sock, rest)
        except OSError as exc:
            self._write_failed(exchange, exc)
        finally:
            self._write_lock.release()

    def _write_failed(self, exchange: Exchange, exc: OSError) -> None:
        if isinstance(exc, (BrokenPipeError, ConnectionResetError)) and exchange.first:
            return  # the reader reads the gateway's reason
        self._fail(lost(self._session.path, exc))  # every pending call learns it

    def _on_readable(self) -> None:
        """Replies, read as they arrive, each handed to the call waiting for it."""
        assert self._reader is not None
        try:
            frames, ended = self._reader.frames_ready()
            for _prefix, header, payload in frames:
                self._on_frame(header, payload)
            if ended is None:
                return
            raise ended
        except GatewayError as exc:
            error = exc
        except FrameError as exc:
            error = lost(self._session.path, f"protocol error: {exc}")
        except (OSError, ConnectionClosed) as exc:
            error = lost(self._session.path, exc)
        self._stop_reading()
        self._fail(error)

    def _on_frame(self, header: bytes, payload: memoryview) -> None:
        assert self._reader is not None
        reply, payload = self._session.reply_in(header, payload, self._reader.fds)
        if reply["id"] is None and not reply["ok"]:  # a refusal, or a frame it
            raise failure_of(reply)  # could not attribute: the gateway closes
        if self._stream_reply(reply, payload):
            return
        future = self._pending.pop(reply["id"], None)
        if future is not None and not future.done():
            future.set_result((reply, payload))

    def _stop_reading(self) -> None:
        if self._reading and self._sock is not None:
            self._reading = False
            asyncio.get_running_loop().remove_reader(self._sock.fileno())

    def _stream_reply(self, reply: dict[str, Any], payload: memoryview) -> bool:
        """Feed a streaming recv's reply to its message; True if it was only that."""
        rid = reply["id"]
        message = self._streams.get(rid)
        if message is not None:
            message._update(reply)
            if message.finished:
                del self._streams[rid]
            return True
        if rid in self._stream_requests and reply["ok"]:
            self._stream_requests.discard(rid)
            made = AsyncIncomingMessage(reply, payload, self._session.decode_header, failure_of)
            self._incoming[rid] = made
            if not made.finished:
                self._streams[rid] = made
        return False

    def _fail(self, error: GatewayError) -> None:
        for message in self._streams.values():
            message._lost(error)
        self._streams.clear()
        if self._failure is None:
            self._failure = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._failure)
        self._pending.clear()
