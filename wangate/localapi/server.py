"""The Unix socket server trainers talk to: frames in, ``GatewayService`` calls, frames out.

Each connection's frames are read in order by the loop's readiness callback. A send
the service can take without waiting is submitted there and then; every other request
runs in its own task, so one connection may pipeline (a waiting ``recv`` does not hold
up a ``send``). Replies carry the request's id and go out as their requests complete,
one whole frame at a time.

Before anything is read from a new connection, the kernel's record of the connecting
process (``SO_PEERCRED``) is checked against the access policy (``access.py``) and the
connection count against ``max_connections``: a refused client gets one error reply
(``access_denied`` or ``too_many_connections``, request id nil) and the connection is
closed. An idle connection holds no read buffer.

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
import resource
import socket
import stat
import time
import weakref
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wangate import __version__
from wangate.core.buffer import Buffer
from wangate.delivery.delivered import Delivery
from wangate.delivery.streams import IncomingStream
from wangate.errors import GatewayError
from wangate.localapi.access import (
    AccessPolicy,
    PeerCredentials,
    connection_cap_refusal,
    peer_credentials,
)
from wangate.localapi.framing import EAGER_READ_BYTES, FrameAssembler, sock_sendall_with_fd
from wangate.localapi.protocol import (
    VERSION,
    FrameError,
    FramePrefix,
    HelloRequest,
    PathsRequest,
    RecvRequest,
    Request,
    ResetPathRequest,
    SendRequest,
    StatusRequest,
    WaitRequest,
    decode_request,
    encode_header,
    error_reply,
    ok_reply,
)
from wangate.localapi.segments import FrameDescriptors, recv_with_fds
from wangate.service import GatewayService, Submission
from wangate.shm import SegmentError, keep_source, map_segment, source_of

log = logging.getLogger("wangate.localapi")

SOCKET_MODE = 0o660
MAX_REQUESTS_IN_FLIGHT = 64  # per connection
MAX_CONNECTIONS = 1024  # [limits] max_local_connections
FILE_DESCRIPTOR_MARGIN = 256  # beyond the local connections: UDP sockets, files, logs
REFUSAL_LOG_INTERVAL_S = 60.0  # one warning per refused uid (or for the cap) per interval
MAX_PENDING_FDS = MAX_REQUESTS_IN_FLIGHT  # descriptors received, not yet named by a frame
MAX_RELEASED = 4096  # hand-overs to report at once: a client that never asks learns no more


@dataclass(frozen=True)
class _Handed:
    """A reply payload that goes as a segment: its descriptor travels with the reply."""

    fd: int


class LocalApiServer:
    def __init__(
        self,
        service: GatewayService,
        socket_path: str | os.PathLike[str],
        *,
        max_message_bytes: int,
        client_budget_bytes: int,
        socket_mode: int = SOCKET_MODE,
        listener: socket.socket | None = None,
        allow_uids: Sequence[int] | None = None,
        allow_gids: Sequence[int] | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.service = service
        # a listening socket inherited from systemd (wangate.socket): its file is not ours
        self._inherited = listener
        self.socket_path = Path(socket_path)
        self.max_message_bytes = max_message_bytes
        self.client_budget_bytes = client_budget_bytes
        self.socket_mode = socket_mode
        self.allow_uids = allow_uids
        self.allow_gids = allow_gids  # None: the socket file's group
        self.max_connections = max_connections
        self.policy: AccessPolicy | None = None  # set by start()
        self.refused_connections = 0
        self._refusal_logged: dict[object, float] = {}
        self._listener: socket.socket | None = None
        self._socket_inode: int | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        if self._inherited is not None:
            self._listener = self._inherited
            socket_stat = os.stat(self.socket_path)
        else:
            self._listener = bind_unix_socket(self.socket_path, self.socket_mode)
            socket_stat = os.stat(self.socket_path)
            self._socket_inode = socket_stat.st_ino
        self.policy = AccessPolicy.build(
            self.allow_uids, self.allow_gids, socket_gid=socket_stat.st_gid
        )
        log.info("local API at %s admits %s", self.socket_path, self.policy.description)
        _ensure_file_limit(self.max_connections + FILE_DESCRIPTOR_MARGIN)
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
                if self._socket_inode is not None and (
                    os.stat(self.socket_path).st_ino == self._socket_inode
                ):
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
            if self._admit(sock):
                task = asyncio.create_task(_Connection(self, sock).run())
                self._connections.add(task)
                task.add_done_callback(self._connections.discard)

    def _admit(self, sock: socket.socket) -> bool:
        """Check a new connection before reading anything from it; refuse it with a
        reply the client can act on, and close it, when it may not stay."""
        assert self.policy is not None
        path = os.fspath(self.socket_path)
        try:
            peer = peer_credentials(sock)
        except OSError as exc:
            log.warning("cannot read the credentials of a local connection: %s", exc)
            sock.close()
            return False
        refused: PeerCredentials | None = self.policy.check(peer)
        if refused is not None:
            message = self.policy.refusal(refused, path)
            self._refuse(sock, "access_denied", message, key=("uid", refused.uid))
            return False
        if len(self._connections) >= self.max_connections:
            message = connection_cap_refusal(path, self.max_connections)
            self._refuse(sock, "too_many_connections", message, key="cap")
            return False
        return True

    def _refuse(self, sock: socket.socket, code: str, message: str, *, key: object) -> None:
        self.refused_connections += 1
        now = time.monotonic()
        if now - self._refusal_logged.get(key, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            if len(self._refusal_logged) >= 1024:  # many uids: forget the old ones
                self._refusal_logged = {
                    k: t
                    for k, t in self._refusal_logged.items()
                    if now - t < REFUSAL_LOG_INTERVAL_S
                }
            self._refusal_logged[key] = now
            log.warning("refused a local connection (%s): %s", code, message)
        try:
            # A fresh socket's send buffer takes this small frame whole, without waiting.
            sock.send(encode_header(error_reply(None, code, message)))
        except OSError:
            pass  # the client is gone already
        finally:
            sock.close()


class _Connection:
    """One trainer's connection. Frames are read in the loop's readiness callback, and a
    send that needs no waiting is submitted right there: on a busy loop each extra
    turn (a task waking up, a task starting) can cost milliseconds."""

    def __init__(self, server: LocalApiServer, sock: socket.socket) -> None:
        self.server = server
        self.service = server.service
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.assembler = FrameAssembler(server.max_message_bytes)
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

    async def run(self) -> None:
        self._listen(True)
        try:
            await self.finished
        finally:
            self._listen(False)
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
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
                self._spawn(self._reply_and_finish(error_reply(None, exc.code, str(exc))))
                return
            if head is None:
                return
            self._on_head(*head)

    def _on_head(self, prefix: FramePrefix, header: bytes) -> None:
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
            self.assembler.skip_payload(payload_bytes)
            self.in_flight += 1
            self._spawn(self._reply(error_reply(exc.request_id, exc.code, str(exc))))
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
                    code="bad_segment",
                )
            if length > self.server.max_message_bytes:
                raise GatewayError(
                    f"segment payload of {length} bytes exceeds the gateway's limit of "
                    f"{self.server.max_message_bytes} bytes (max_message_bytes)",
                    code="too_large",
                )
            payload = map_segment(fd, offset, length)
            if request.segment_id is not None and length:
                # the mapping goes once the message is done (or failed): the client may
                # then reuse the segment
                weakref.finalize(payload.obj, self._segment_released, request.segment_id)
        except GatewayError as exc:
            self._spawn(self._reply(error_reply(request.request_id, exc.code, str(exc))))
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
        if (
            self.held_bytes > 0
            and self.held_bytes + payload_bytes > self.server.client_budget_bytes
        ):
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
            try:
                message_id = self.service.submit_now(_submission(request, payload))
            except GatewayError as exc:
                self._release(payload_bytes)
                self._spawn(self._reply(error_reply(request.request_id, exc.code, str(exc))))
                return
            except Exception as exc:
                log.exception("local API request %r failed", request)
                self._release(payload_bytes)
                reply = error_reply(request.request_id, "internal", f"gateway error: {exc}")
                self._spawn(self._reply(reply))
                return
            if message_id is not None:
                self._release(payload_bytes)
                self._spawn(self._reply(ok_reply(request.request_id, message_id=message_id)))
                return
        if isinstance(request, RecvRequest) and request.stream:
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
        rid = request.request_id
        reply_payload: Buffer | _Handed = b""
        try:
            try:
                reply, reply_payload = await self._dispatch(request, payload)
            finally:
                self._release(payload_bytes)  # the service owns the payload now
        except GatewayError as exc:
            reply = error_reply(rid, exc.code, str(exc))
        except Exception as exc:
            log.exception("local API request %r failed", request)
            reply = error_reply(rid, "internal", f"gateway error: {exc}")
        if isinstance(reply_payload, _Handed):
            try:
                await self._reply(reply, b"", reply_payload.fd)
            finally:
                os.close(reply_payload.fd)  # the client has its own copy of it now
            return
        await self._reply(reply, reply_payload)

    async def _stream(self, request: RecvRequest) -> None:
        """A streaming recv: one reply as soon as a matching message is there, whole or
        with its header in; then, for one still arriving, a reply each time its prefix
        grows by a step, and a last one when it is verified (``done``) or failed."""
        rid = request.request_id
        try:
            got = await self.service.receive_stream(
                request.tag, request.source, request.step, request.timeout_s
            )
        except GatewayError as exc:
            await self._reply(error_reply(rid, exc.code, str(exc)))
            return
        except Exception as exc:
            log.exception("local API request %r failed", request)
            await self._reply(error_reply(rid, "internal", f"gateway error: {exc}"))
            return
        if isinstance(got, Delivery):
            reply, payload = _recv_reply(rid, got, segments=True)
            size = memoryview(got.payload).nbytes
            reply.update(ready=size, done=True)
            if isinstance(payload, _Handed):
                try:
                    await self._reply(reply, b"", payload.fd)
                finally:
                    os.close(payload.fd)
                return
            await self._reply(reply, payload)
            return
        await self._stream_out(rid, got)

    async def _stream_out(self, rid: int, stream: IncomingStream) -> None:
        finished = False
        fd = stream.take_fd()
        try:
            if fd is None:  # cannot happen: a stream is taken with its descriptor
                raise GatewayError("the message's segment is gone", code="internal")
            reply = ok_reply(
                rid,
                **_message_fields(stream),
                segment=[stream.segment_offset, stream.payload_bytes],
                ready=stream.ready_bytes,
                done=stream.done,
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
                    await self._write(error_reply(rid, error.code, str(error)))
                    finished = True
                elif stream.done or stream.ready_bytes > sent:
                    sent = stream.ready_bytes
                    finished = stream.done
                    await self._write(ok_reply(rid, ready=sent, done=finished))
                else:
                    await stream.changed.wait()
        except GatewayError as exc:
            with contextlib.suppress(OSError):
                await self._write(error_reply(rid, exc.code, str(exc)))
        except OSError:
            pass  # the client went away; reading notices
        finally:
            # unfinished: the trainer went away; the message completes (or fails)
            # without it, and its credit goes back all the same (streams.py)
            self.in_flight -= 1
            self._resume()

    async def _reply(
        self, reply: dict[str, Any], payload: Buffer = b"", fd: int | None = None
    ) -> None:
        try:
            await self._write(reply, payload, fd)
        except OSError:
            pass  # the client went away; reading notices
        finally:
            self.in_flight -= 1
            self._resume()

    async def _reply_and_finish(self, reply: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            await self._write(reply)
        self._finish()

    async def _dispatch(
        self, request: Request, payload: Buffer
    ) -> tuple[dict[str, Any], Buffer | _Handed]:
        rid = request.request_id
        service = self.service
        if isinstance(request, SendRequest):
            message_id = await service.submit(_submission(request, payload))
            return ok_reply(rid, message_id=message_id), b""
        if isinstance(request, RecvRequest):
            delivery = await service.receive(
                request.tag, request.source, request.step, request.timeout_s
            )
            return _recv_reply(rid, delivery, request.segments)
        if isinstance(request, HelloRequest):
            return ok_reply(
                rid,
                protocol=VERSION,
                site=service.site_name,
                version=__version__,
                client_settings=service.client_settings(),
            ), b""
        if isinstance(request, PathsRequest):
            return ok_reply(rid, paths=[row.to_dict() for row in service.paths()]), b""
        if isinstance(request, StatusRequest):
            return ok_reply(rid, status=service.status().to_dict()), b""
        if isinstance(request, ResetPathRequest):
            service.reset_path(request.peer, request.path)
            return ok_reply(rid), b""
        if isinstance(request, WaitRequest):
            await service.wait_message(request.peer, request.message_id, request.timeout_s)
            return ok_reply(rid, outcome="taken"), b""
        return ok_reply(rid), b""

    async def _write(
        self, reply: dict[str, Any], payload: Buffer = b"", fd: int | None = None
    ) -> None:
        body = memoryview(payload).cast("B")
        if self.released and reply.get("ok"):
            reply["released"], self.released = self.released, []
        try:
            head = encode_header(reply, body.nbytes)
        except (FrameError, TypeError, ValueError, OverflowError) as exc:
            log.error("cannot encode reply %r: %s", reply.get("id"), exc)
            head = encode_header(error_reply(reply.get("id"), "internal", f"bad reply: {exc}"))
            body = memoryview(b"")
        async with self.write_lock:
            if fd is None:
                await self.loop.sock_sendall(self.sock, head)
            else:
                await sock_sendall_with_fd(self.loop, self.sock, head, fd)
            if body.nbytes:
                await self.loop.sock_sendall(self.sock, body)


def _message_fields(message: Delivery | IncomingStream) -> dict[str, Any]:
    """What a recv reply says of its message, whole or streamed (proto/localapi.md)."""
    return {
        "source": message.source,
        "tag": message.tag,
        "step": message.step,
        "critical": message.critical,
        "meta": message.meta,
        "checksum": message.checksum,
    }


def _recv_reply(
    rid: int, delivery: Delivery, segments: bool
) -> tuple[dict[str, Any], Buffer | _Handed]:
    reply = ok_reply(rid, **_message_fields(delivery))
    fd = delivery.segment_fd
    if fd is None:
        return reply, delivery.payload
    if not segments:
        os.close(fd)  # in-band, from the gateway's own mapping of it
        return reply, delivery.payload
    view = memoryview(delivery.payload)
    offset = memoryview(view.obj).nbytes - view.nbytes  # the payload ends the body
    reply["segment"] = [offset, view.nbytes]
    return reply, _Handed(fd)


def _submission(request: SendRequest, payload: Buffer) -> Submission:
    return Submission(
        peer=request.peer,
        tag=request.tag,
        step=request.step,
        critical=request.critical,
        meta=request.meta,
        payload=payload,
        checksum=request.checksum,
        deadline_s=request.deadline_s,
        segment=source_of(payload),
    )


def _ensure_file_limit(needed: int) -> None:
    """Raise the soft RLIMIT_NOFILE to ``needed`` if the hard limit allows: the
    connection cap, not EMFILE, should be what turns trainers away."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        target = soft
        log.warning("cannot raise the open-file limit to %d: %s", needed, exc)
    if target < needed:
        log.warning(
            "the open-file limit (%d) is below what max_local_connections needs (%d): "
            "raise LimitNOFILE or lower the cap",
            target,
            needed,
        )


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
