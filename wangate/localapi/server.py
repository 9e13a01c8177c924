"""The Unix socket server trainers talk to: frames in, ``GatewayService`` calls, frames out.

One task per connection reads frames in order; each request then runs in its own
task, so one connection may pipeline (a waiting ``recv`` does not hold up a ``send``).
Replies carry the request's id and go out as their requests complete, one whole
frame at a time.

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
import errno
import logging
import os
import socket
import stat
from pathlib import Path
from typing import Any

from wangate import __version__
from wangate.errors import GatewayError
from wangate.localapi.framing import AsyncFrameReader, ConnectionClosed
from wangate.localapi.protocol import (
    VERSION,
    FrameError,
    HelloRequest,
    PathsRequest,
    RecvRequest,
    Request,
    ResetPathRequest,
    SendRequest,
    StatusRequest,
    decode_request,
    encode_header,
    error_reply,
    ok_reply,
)
from wangate.service import Buffer, GatewayService, Submission

log = logging.getLogger("wangate.localapi")

SOCKET_MODE = 0o660
MAX_REQUESTS_IN_FLIGHT = 64  # per connection


class LocalApiServer:
    def __init__(
        self,
        service: GatewayService,
        socket_path: str | os.PathLike[str],
        *,
        max_message_bytes: int,
        client_budget_bytes: int,
        socket_mode: int = SOCKET_MODE,
    ) -> None:
        self.service = service
        self.socket_path = Path(socket_path)
        self.max_message_bytes = max_message_bytes
        self.client_budget_bytes = client_budget_bytes
        self.socket_mode = socket_mode
        self._listener: socket.socket | None = None
        self._socket_inode: int | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self._listener = bind_unix_socket(self.socket_path, self.socket_mode)
        self._socket_inode = os.stat(self.socket_path).st_ino
        self._accept_task = asyncio.create_task(self._accept_loop())

    async def close(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept_task
            self._accept_task = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            # Remove the file only if it is still ours (a successor may have replaced it).
            with contextlib.suppress(OSError):
                if os.stat(self.socket_path).st_ino == self._socket_inode:
                    os.unlink(self.socket_path)

    async def __aenter__(self) -> LocalApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _accept_loop(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                log.warning("accept failed on %s: %s", self.socket_path, exc)
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            task = asyncio.create_task(_Connection(self, sock).run())
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)


class _Connection:
    def __init__(self, server: LocalApiServer, sock: socket.socket) -> None:
        self.server = server
        self.service = server.service
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.reader = AsyncFrameReader(sock, server.max_message_bytes)
        self.write_lock = asyncio.Lock()
        self.slots = asyncio.Semaphore(MAX_REQUESTS_IN_FLIGHT)
        self.held_bytes = 0
        self.budget_freed = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        try:
            while await self._next_request():
                pass
        except (ConnectionClosed, OSError):
            pass
        finally:
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.sock.close()

    async def _next_request(self) -> bool:
        """Read one frame and start its handler; False when the connection should end."""
        try:
            head = await self.reader.read_head()
        except FrameError as exc:  # prefix-level: the stream cannot be resynchronised
            await self._write(error_reply(None, exc.code, str(exc)))
            return False
        if head is None:
            return False
        prefix, header = head
        payload_bytes = prefix.payload_bytes
        try:
            request = decode_request(header, payload_bytes)
            if payload_bytes > self.server.client_budget_bytes:
                raise FrameError(
                    "over_budget",
                    f"payload of {payload_bytes} bytes exceeds this client's budget of "
                    f"{self.server.client_budget_bytes} bytes (client_budget_bytes)",
                    request.request_id,
                )
        except FrameError as exc:
            await self.reader.skip_payload(payload_bytes)
            await self._write(error_reply(exc.request_id, exc.code, str(exc)))
            return True
        await self.slots.acquire()
        while self.held_bytes and self.held_bytes + payload_bytes > self.server.client_budget_bytes:
            self.budget_freed.clear()
            await self.budget_freed.wait()
        self.held_bytes += payload_bytes
        payload = await self.reader.read_payload(payload_bytes) if payload_bytes else b""
        task = asyncio.create_task(self._handle(request, payload, payload_bytes))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _handle(self, request: Request, payload: Buffer, payload_bytes: int) -> None:
        rid = request.request_id
        reply_payload: Buffer = b""
        try:
            try:
                reply, reply_payload = await self._dispatch(request, payload)
            finally:
                self.held_bytes -= payload_bytes  # the service owns the payload now
                self.budget_freed.set()
        except GatewayError as exc:
            reply = error_reply(rid, exc.code, str(exc))
        except Exception as exc:
            log.exception("local API request %r failed", request)
            reply = error_reply(rid, "internal", f"gateway error: {exc}")
        try:
            await self._write(reply, reply_payload)
        except OSError:
            pass  # the client went away; its reader notices
        finally:
            self.slots.release()

    async def _dispatch(self, request: Request, payload: Buffer) -> tuple[dict[str, Any], Buffer]:
        rid = request.request_id
        service = self.service
        if isinstance(request, SendRequest):
            message_id = await service.submit(
                Submission(
                    peer=request.peer,
                    tag=request.tag,
                    step=request.step,
                    critical=request.critical,
                    meta=request.meta,
                    payload=payload,
                    checksum=request.checksum,
                    deadline_s=request.deadline_s,
                )
            )
            return ok_reply(rid, message_id=message_id), b""
        if isinstance(request, RecvRequest):
            delivery = await service.receive(
                request.tag, request.source, request.step, request.timeout_s
            )
            reply = ok_reply(
                rid,
                source=delivery.source,
                tag=delivery.tag,
                step=delivery.step,
                critical=delivery.critical,
                meta=delivery.meta,
                checksum=delivery.checksum,
            )
            return reply, delivery.payload
        if isinstance(request, HelloRequest):
            return ok_reply(
                rid,
                protocol=VERSION,
                site=service.site_name,
                version=__version__,
                client_settings=service.client_settings(),
            ), b""
        if isinstance(request, PathsRequest):
            return ok_reply(rid, paths=service.paths()), b""
        if isinstance(request, StatusRequest):
            return ok_reply(rid, status=service.status()), b""
        if isinstance(request, ResetPathRequest):
            service.reset_path(request.peer, request.path)
            return ok_reply(rid), b""
        return ok_reply(rid), b""

    async def _write(self, reply: dict[str, Any], payload: Buffer = b"") -> None:
        body = memoryview(payload).cast("B")
        try:
            head = encode_header(reply, body.nbytes)
        except (FrameError, TypeError, ValueError, OverflowError) as exc:
            log.error("cannot encode reply %r: %s", reply.get("id"), exc)
            head = encode_header(error_reply(reply.get("id"), "internal", f"bad reply: {exc}"))
            body = memoryview(b"")
        async with self.write_lock:
            await self.loop.sock_sendall(self.sock, head)
            if body.nbytes:
                await self.loop.sock_sendall(self.sock, body)


def bind_unix_socket(path: Path, mode: int) -> socket.socket:
    """Listen on ``path`` with file mode ``mode`` from its first appearance.

    The socket is bound under a temporary name, chmod-ed, then renamed into place, so
    no client ever sees it with the umask's mode. A leftover socket file is replaced
    only when nothing answers on it.
    """
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise GatewayError(
                f"{path} exists and is not a socket; not replacing it", code="socket_in_use"
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(os.fspath(path))
        except ConnectionRefusedError:
            os.unlink(path)  # stale: its daemon is gone
        except FileNotFoundError:
            pass
        else:
            raise GatewayError(
                f"another process is listening on {path} (is `wangate run` already running?)",
                code="socket_in_use",
            )
        finally:
            probe.close()
    temporary = path.parent / f".wg{os.getpid()}.sock"
    bind_path = temporary if len(os.fsencode(temporary)) < 108 else path
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            if bind_path == temporary:
                os.unlink(temporary)
        sock.bind(os.fspath(bind_path))
        os.chmod(bind_path, mode)
        sock.listen(socket.SOMAXCONN)
        if bind_path != path:
            os.rename(bind_path, path)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.ENAMETOOLONG or "too long" in str(exc):
            raise GatewayError(
                f"socket path too long (max 107 bytes): {path}", code="bad_socket_path"
            ) from None
        raise GatewayError(
            f"cannot listen on {path}: {exc.strerror or exc}", code="socket_error"
        ) from None
    return sock
