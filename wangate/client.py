"""The trainer's side of the local API: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Both speak proto/localapi.md over the gateway's Unix socket. Tensors are encoded by
``wangate.codec`` under the policy the gateway announces in its hello reply; error
feedback for lossy codecs is kept here, per (peer, tag). The payload is written
from the encoded buffer itself and read into one buffer that becomes the array.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mmap
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from itertools import count
from typing import Any, Literal, TypeVar, overload

import numpy as np

from wangate.checksum import checksum_with_prefix
from wangate.codec import CodecPolicy, ErrorFeedback, decode_tensor, encode_tensor, read_meta
from wangate.collective import api as _coll
from wangate.collective.api import CollectiveState
from wangate.collective.tags import check_user_tag
from wangate.core.buffer import Buffer
from wangate.errors import (
    AccessDenied,
    DeadlineExceeded,
    GatewayError,
    GatewayUnavailable,
    MessageFailed,
    PeerUnreachable,
    RecvTimeout,
    TooManyConnections,
)
from wangate.incoming import AsyncIncomingMessage, IncomingMessage
from wangate.localapi.framing import (
    AsyncFrameReader,
    ConnectionClosed,
    SyncFrameReader,
    sock_sendall_with_fd,
)
from wangate.localapi.protocol import (
    MAX_ID,
    VERSION,
    FrameError,
    HelloRequest,
    PathsRequest,
    PingRequest,
    RecvRequest,
    Request,
    ResetPathRequest,
    SendRequest,
    StatusRequest,
    WaitRequest,
    decode_reply,
    encode_request,
    segment_field,
)
from wangate.localapi.segments import SegmentPool
from wangate.shm import map_delivered
from wangate.tensorlike import as_reducible_array, as_wire_array, mark_bfloat16

DEFAULT_SOCKET = "/run/wangate/wangate.sock"
SOCKET_ENV = "WANGATE_SOCKET"
# Bounds connecting and the hello exchange (not later calls): a gateway that accepts
# and never answers must not hang the trainer.
CONNECT_TIMEOUT_S = 30.0
NO_BOUND_S = 1e9  # a timeout this long (or infinite) is no timeout: time_t limits

Reply = tuple[dict[str, Any], memoryview]
T = TypeVar("T")


def _socket_path(path: str | os.PathLike[str] | None) -> str:
    return os.fspath(path) if path is not None else os.environ.get(SOCKET_ENV, DEFAULT_SOCKET)


def _unavailable(path: str, exc: OSError) -> GatewayUnavailable:
    reasons = {
        errno.ENOENT: "no such file (is `wangate run` running?)",
        errno.ECONNREFUSED: "nothing is listening on it (is `wangate run` running?)",
        errno.EACCES: "permission denied (the socket is mode 0660: run as the gateway's "
        "user or add this user to its group)",
        errno.ENOTSOCK: "not a socket",
    }
    reason = reasons.get(exc.errno or 0, exc.strerror or str(exc))
    return GatewayUnavailable(f"cannot reach wangate at {path}: {reason}", code="unavailable")


def _timed_out(path: str, stage: str, timeout_s: float) -> GatewayUnavailable:
    if stage == "connect":
        what = (
            f"connecting to wangate at {path} timed out after {timeout_s:g} s "
            "(its backlog is full: the daemon is not accepting connections)"
        )
    else:
        what = (
            f"wangate at {path} did not answer hello within {timeout_s:g} s "
            "(the daemon is stuck or overloaded, or something else listens there)"
        )
    return GatewayUnavailable(what, code="connect_timeout")


# Replies the gateway sends instead of answering hello, just before it closes.
_REFUSALS: dict[str, type[GatewayUnavailable]] = {
    "access_denied": AccessDenied,
    "too_many_connections": TooManyConnections,
}


def _raise_for_hello(reply: dict[str, Any]) -> None:
    refusal = _REFUSALS.get(reply.get("code", ""))
    if refusal is not None and not reply["ok"]:
        raise refusal(f"{reply['error']} [{reply['code']}]", code=reply["code"])
    _raise_for(reply)


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1e6))


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


def _checked_timeout(timeout: float | None) -> float | None:
    """``timeout`` if positive; infinity (or decades) means no bound (None)."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")
    return None if timeout is not None and timeout >= NO_BOUND_S else timeout


def _lost(path: str, why: object) -> GatewayUnavailable:
    return GatewayUnavailable(
        f"lost the connection to wangate at {path}: {why} (did the daemon stop?)",
        code="unavailable",
    )


class _Session:
    """What both clients do besides I/O: request building, codec policy, reply checks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._ids = count(1)
        self.site = ""
        self.settings: dict[str, Any] = {}
        self.max_message_bytes = 0
        self._policy = CodecPolicy()
        self._feedback = ErrorFeedback()  # residuals of lossy encodes, keyed (peer, tag)
        self.collective = CollectiveState()  # per-hop residuals of collectives
        self.segment_min_bytes: int | None = None
        self.pool = SegmentPool(0)

    def next_id(self) -> int:
        return next(self._ids) % (MAX_ID + 1)

    def accept_hello(self, reply: dict[str, Any]) -> None:
        if reply.get("protocol") != VERSION:
            raise GatewayError(
                f"wangate at {self.path} speaks protocol {reply.get('protocol')!r}, "
                f"this client {VERSION}: upgrade the older side",
                code="bad_version",
            )
        settings = _field(reply, "client_settings", dict)
        compression = settings.get("compression", {})
        self.site = _field(reply, "site", str)
        self.settings = settings
        self.max_message_bytes = int(settings["max_message_bytes"])
        self._policy = CodecPolicy(
            compression.get("default", "none"),
            tuple(tuple(rule) for rule in compression.get("tags", ())),
            compression.get("min_lossy_bytes", 0),
        )
        segments = settings.get("segments")
        # payloads from this size on go in shared memory, if the gateway takes them
        self.segment_min_bytes = None
        if isinstance(segments, dict):
            self.segment_min_bytes = int(segments["min_bytes"])
            pool_bytes = int(segments.get("pool_bytes", 2 * self.max_message_bytes))
            self.pool = SegmentPool(pool_bytes)

    def note_released(self, reply: dict[str, Any]) -> None:
        """Segments the gateway let go of, named in any success reply."""
        released = reply.get("released")
        if isinstance(released, list):
            self.pool.released(t for t in released if type(t) is int)

    def segment_wanted(self, payload: memoryview) -> bool:
        threshold = self.segment_min_bytes
        return threshold is not None and payload.nbytes >= max(threshold, 1)

    def fill_segment(self, payload: memoryview) -> tuple[int, int, mmap.mmap]:
        """(token, descriptor, mapping) of a segment now holding ``payload``: the one
        copy of the bytes on their way to the gateway (instead of through the socket)."""
        token, fd, mapping = self.pool.lend(payload.nbytes)
        try:
            target = np.frombuffer(mapping, np.uint8, payload.nbytes)
            target[:] = np.frombuffer(payload, np.uint8)
            del target
        except BaseException:
            self.handed_back(token, fd, mapping, failed=True)
            raise
        return token, fd, mapping

    def handed_back(self, token: int, fd: int, mapping: mmap.mmap, *, failed: bool) -> None:
        """After a hand-over: an unpooled segment is closed; a refused one is free."""
        if token == 0:
            mapping.close()
            os.close(fd)
        elif failed:
            self.pool.released([token])

    def encode(
        self, peer: str, tag: str, array: np.ndarray, codec: str | None
    ) -> tuple[bytes, memoryview, int]:
        """Encoded meta, payload view and checksum for ``array`` under the policy."""
        check_user_tag(tag)
        array, bfloat16 = as_wire_array(array)  # torch tensors: a view where possible
        spec = self._policy.choose(tag, array.nbytes, codec, array.dtype)
        encoded = encode_tensor(
            array, spec, feedback=self._feedback, key=(peer, tag), bfloat16=bfloat16
        )
        meta = bytes(encoded.meta)
        payload = memoryview(encoded.payload).cast("B")
        if payload.nbytes > self.max_message_bytes:
            raise GatewayError(
                f"{tag!r} encodes to {payload.nbytes} bytes, over the gateway's "
                f"max_message_bytes of {self.max_message_bytes}: split the tensor",
                code="too_large",
            )
        # the encoder read the payload once; both checksums derive from that pass
        return meta, payload, checksum_with_prefix(meta, encoded.payload_crc, payload.nbytes)

    def choose_spec(self, tag: str, nbytes: int, codec: str | None, dtype: np.dtype[Any]) -> str:
        return self._policy.choose(tag, nbytes, codec, dtype)

    def decode(self, reply: dict[str, Any], payload: memoryview) -> np.ndarray:
        # The gateway checked the transport checksum against the bytes before delivery;
        # the frame's own CRC is checked against it without another pass over them.
        meta = _field(reply, "meta", bytes)
        checksum = _field(reply, "checksum", int)
        array = decode_tensor(meta, payload, transport_checksum=checksum)
        return mark_bfloat16(array) if read_meta(meta).bfloat16 else array


def _wire_or_none(array: Any) -> np.ndarray | None:
    return None if array is None else as_wire_array(array)[0]  # torch tensors as numpy


def _field(reply: dict[str, Any], key: str, kind: type[T]) -> T:
    value = reply.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise GatewayError(f"malformed reply from the gateway: {key!r}", code="bad_reply")
    return value


def _raise_for(reply: dict[str, Any]) -> None:
    if not reply["ok"]:
        raise _error_for(reply)


def _error_for(reply: dict[str, Any]) -> GatewayError:
    """The exception a failure reply raises."""
    code, message = reply["code"], reply["error"]
    if code == "timeout":
        return RecvTimeout(message, code=code)
    kind = _ERRORS.get(code)
    if kind is not None:
        return kind(message)
    return GatewayError(f"{message} [{code}]", code=code)


def _whole(reply: dict[str, Any], payload: memoryview) -> dict[str, Any]:
    """A reply to a plain recv, as the one reply of a stream that is complete already."""
    return {**reply, "ready": payload.nbytes, "done": True}


_ERRORS: dict[str, type[GatewayError]] = {
    "peer_unreachable": PeerUnreachable,
    "deadline": DeadlineExceeded,
    "message_failed": MessageFailed,
}


def _recv_request(
    tag: str,
    source: str | None,
    step: int | None,
    timeout: float | None,
    segments: bool = False,
    stream: bool = False,
) -> Callable[[int], Request]:
    return lambda rid: RecvRequest(rid, tag, source, step, timeout, segments, stream)


def _send_request(
    peer: str,
    tag: str,
    step: int,
    critical: bool,
    meta: bytes,
    checksum: int,
    deadline_s: float | None,
    segment_bytes: int | None = None,
    segment_id: int = 0,
) -> Callable[[int], Request]:
    segment = None if segment_bytes is None else (0, segment_bytes)
    return lambda rid: SendRequest(
        rid, peer, tag, step, critical, meta, checksum, deadline_s, segment, segment_id or None
    )


def _segment_payload(reply: dict[str, Any], fds: Any) -> memoryview | None:
    """The payload of a reply that came as a segment, mapped copy-on-write."""
    segment = reply.get("segment")
    if segment is None:
        return None
    if not fds:
        raise GatewayError("malformed reply from the gateway: a segment without a descriptor")
    fd = fds.popleft()
    try:
        offset, length = segment_field(segment, reply.get("id"))
        return map_delivered(fd, offset, length)
    except (FrameError, OSError, ValueError) as exc:
        raise GatewayError(f"malformed reply from the gateway: segment: {exc}") from None
    finally:
        os.close(fd)


def _unix_socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)


class Client:
    """Blocking client. Calls are serialised by a lock, so a thread blocked in ``recv``
    holds up the others: use one ``Client`` per thread, or ``AsyncClient``."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = CONNECT_TIMEOUT_S,
    ) -> None:
        """Connect and say hello, within ``timeout`` seconds in all (None: no bound);
        ``GatewayUnavailable`` says what timed out. Later calls have their own bounds."""
        timeout = _checked_timeout(timeout)
        self._session = _Session(_socket_path(path))
        self._lock = threading.Lock()
        deadline = None if timeout is None else time.monotonic() + timeout
        sock = _unix_socket()
        if timeout is not None:
            # A Unix socket's connect waits (while the listener's backlog is full) for
            # at most SO_SNDTIMEO, then fails with EAGAIN; settimeout() would not wait.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout))
        try:
            sock.connect(self._session.path)
        except BlockingIOError:
            sock.close()
            assert timeout is not None
            raise _timed_out(self._session.path, "connect", timeout) from None
        except OSError as exc:
            sock.close()
            raise _unavailable(self._session.path, exc) from None
        if timeout is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(0))
        self._sock: socket.socket | None = sock
        self._reader = SyncFrameReader(sock, 0)
        self._streams: dict[int, IncomingMessage] = {}  # by request id, until finished
        try:
            self._session.accept_hello(self._hello(deadline, timeout))
        except BaseException:
            self.close()
            raise
        self._reader.max_payload_bytes = self._session.max_message_bytes

    def _hello(self, deadline: float | None, timeout: float | None) -> dict[str, Any]:
        sock = self._sock
        assert sock is not None
        path = self._session.path
        self._reader.deadline = deadline
        try:
            if deadline is not None:
                sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                # if the gateway refused us at once, its reason is waiting to be read
                sock.sendall(encode_request(HelloRequest(self._session.next_id())))
            reply, _ = self._read_reply()
        except TimeoutError:
            assert timeout is not None
            raise _timed_out(path, "hello", timeout) from None
        except (OSError, ConnectionClosed) as exc:
            raise _lost(path, exc) from None
        self._reader.deadline = None
        sock.settimeout(None)
        if reply["id"] is None:
            self.close()  # a refusal: the gateway closes the connection
        _raise_for_hello(reply)
        return reply

    @property
    def site(self) -> str:
        """The name of the site whose gateway this is."""
        return self._session.site

    @property
    def settings(self) -> dict[str, Any]:
        return self._session.settings

    def send(
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
        """Hand ``array`` to the gateway for ``peer``; returns the message id once accepted.

        With ``deadline_s``, the gateway gives the message up if the peer has not
        confirmed it that many seconds after acceptance (``status()``'s recent failures
        say why); without, it keeps trying while the peer is there.
        """
        meta, payload, checksum = self._session.encode(peer, tag, array, codec)
        return self.send_encoded(
            peer, tag, meta, payload, checksum, step=step, critical=critical, deadline_s=deadline_s
        )

    @overload
    def recv(
        self,
        tag: str,
        *,
        source: str | None = ...,
        step: int | None = ...,
        timeout: float | None = ...,
        stream: Literal[False] = ...,
    ) -> np.ndarray: ...

    @overload
    def recv(
        self,
        tag: str,
        *,
        source: str | None = ...,
        step: int | None = ...,
        timeout: float | None = ...,
        stream: Literal[True],
    ) -> IncomingMessage: ...

    def recv(
        self,
        tag: str,
        *,
        source: str | None = None,
        step: int | None = None,
        timeout: float | None = None,
        stream: bool = False,
    ) -> np.ndarray | IncomingMessage:
        """The oldest message with ``tag`` (and source/step if given) as an array.

        With ``stream=True``: an ``IncomingMessage`` as soon as a matching message's
        header is in (a large one still arriving, or a whole one), to read while the
        rest arrives; its ``result()`` is the verified array. ``timeout`` bounds the
        wait for that first reply.
        """
        segments = self._session.segment_min_bytes is not None
        request = _recv_request(tag, source, step, timeout, segments, stream and segments)
        reply, payload = self._call(request)
        if not stream:
            return self._session.decode(reply, payload)
        if not segments:
            reply = _whole(reply, payload)
        message = IncomingMessage(
            reply, payload, self._session.decode, _error_for, self._pump_stream
        )
        if not message.finished:
            self._streams[reply["id"]] = message
        return message

    def wait(self, peer: str, message_id: int, *, timeout: float | None = None) -> None:
        """Return once a trainer at ``peer`` took message ``message_id`` (the id ``send``
        returned). Raises ``MessageFailed`` (its id, tag, step and why) if it never will
        be, ``PeerUnreachable`` while the peer is, ``RecvTimeout`` after ``timeout``."""
        self._call(lambda rid: WaitRequest(rid, peer, message_id, timeout))

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
        deadline_s: float | None = None,
    ) -> int:
        """Send a tensor already encoded by ``wangate.codec`` (the collectives use this to
        encode once for several peers)."""
        session = self._session
        if not session.segment_wanted(payload):
            request = _send_request(peer, tag, step, critical, meta, checksum, deadline_s)
            return _field(self._call(request, payload)[0], "message_id", int)
        if not session.pool.has_free(payload.nbytes) and session.pool.lent_count:
            self.ping()  # its reply says which segments the gateway let go of since
        token, fd, mapping = session.fill_segment(payload)
        failed = True
        try:
            request = _send_request(
                peer, tag, step, critical, meta, checksum, deadline_s, payload.nbytes, token
            )
            message_id = _field(self._call(request, fd=fd)[0], "message_id", int)
            failed = False
            return message_id
        finally:
            session.handed_back(token, fd, mapping, failed=failed)

    def allreduce(
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
        """The reduction (``op`` "sum" or "mean") of ``array`` over the sites (all of the
        gateway's config by default), identical on every site; with ``partial=True`` a
        ``PartialResult`` (``.array``, ``.contributors``) over the sites present. Raises
        ``CollectiveTimeout`` naming the sites that never answered. proto/collective.md."""
        s = self._session
        script = _coll.allreduce_script(
            s.site, s.settings, s.collective, s.choose_spec, tag, as_reducible_array(array),
            step=step, op=op, codec=codec, critical=critical, timeout=timeout,
            sites=sites, partial=partial,
        )  # fmt: skip
        return _coll.run_sync(self, s.site, step, script)

    def broadcast(
        self,
        tag: str,
        array: np.ndarray | None,
        *,
        root: str,
        step: int = 0,
        timeout: float = 30.0,
        sites: Iterable[str] | None = None,
    ) -> np.ndarray:
        """``root``'s array on every site (``array`` is ignored elsewhere but checked)."""
        s, given = self._session, _wire_or_none(array)
        script = _coll.broadcast_script(
            s.site, s.settings, tag, given, root=root, step=step, timeout=timeout, sites=sites
        )
        return _coll.run_sync(self, s.site, step, script)

    def barrier(
        self, tag: str, *, step: int = 0, timeout: float = 30.0, sites: Iterable[str] | None = None
    ) -> None:
        """Return once every site has called ``barrier`` with this tag and step."""
        s = self._session
        script = _coll.barrier_script(
            s.site, s.settings, tag, step=step, timeout=timeout, sites=sites
        )
        _coll.run_sync(self, s.site, step, script)

    def paths(self) -> list[dict[str, Any]]:
        """One map per path (proto/localapi.md); ``wangate.rows.PathRow.from_dicts`` types them."""
        return _field(self._call(PathsRequest)[0], "paths", list)

    def status(self) -> dict[str, Any]:
        return _field(self._call(StatusRequest)[0], "status", dict)

    def reset_path(self, peer: str, path: str) -> None:
        """Close one path's connection now; the gateway reconnects it by itself."""
        self._call(lambda rid: ResetPathRequest(rid, peer, path))

    def ping(self) -> None:
        self._call(PingRequest)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._session.pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, build: Callable[[int], Request], payload: Buffer = b"", fd: int | None = None
    ) -> Reply:
        with self._lock:
            sock = self._sock
            if sock is None:
                raise GatewayUnavailable("this wangate client is closed", code="closed")
            rid = self._session.next_id()
            body = memoryview(payload).cast("B")
            head = encode_request(build(rid), body.nbytes)
            try:
                if fd is not None:  # the segment goes with the frame's first byte
                    head = head[socket.send_fds(sock, [head], [fd]) :]
                sock.sendall(head)
                if body.nbytes:
                    sock.sendall(body)
                while True:
                    reply, reply_payload = self._read_reply()
                    if reply["id"] in (rid, None):
                        break
                    self._route(reply)  # a stream's progress; else a reply to a call
                    # interrupted earlier, dropped
            except (OSError, ConnectionClosed) as exc:
                self._broken()
                raise _lost(self._session.path, exc) from None
            except BaseException:  # e.g. KeyboardInterrupt mid-frame: stream position lost
                self._broken()
                raise
        if reply["id"] is None:
            self.close()  # the gateway closes a stream it cannot resynchronise
        _raise_for(reply)
        return reply, reply_payload

    def _read_reply(self) -> Reply:
        try:
            head = self._reader.read_head()
            if head is None:
                raise ConnectionClosed("the gateway closed the connection")
            prefix, header = head
            reply = decode_reply(header)
        except FrameError as exc:
            raise _lost(self._session.path, f"protocol error: {exc}") from None
        payload = self._reader.read_payload(prefix.payload_bytes)
        self._session.note_released(reply)
        return reply, _segment_payload(reply, self._reader.fds) or payload

    def _route(self, reply: dict[str, Any]) -> None:
        message = self._streams.get(reply["id"])
        if message is not None:
            message._apply(reply)
            if message.finished:
                del self._streams[reply["id"]]

    def _pump_stream(self, message: IncomingMessage, deadline: float | None) -> None:
        """Read one reply (or none by ``deadline``) for the streams of this client."""
        with self._lock:
            sock = self._sock
            if message.finished:
                return
            if sock is None:
                message.error = GatewayUnavailable("this wangate client is closed", code="closed")
                return
            self._reader.deadline = deadline
            try:
                reply, _ = self._read_reply()
            except TimeoutError:
                if not self._reader.between_frames:  # the stream position is lost
                    self._broken()
                    message.error = _lost(self._session.path, "timed out within a reply")
                return
            except (OSError, ConnectionClosed) as exc:
                self._broken()
                message.error = _lost(self._session.path, exc)
                return
            finally:
                self._reader.deadline = None
                if self._sock is not None:
                    self._sock.settimeout(None)
            if reply["id"] is None:
                self.close()
                message.error = _error_for(reply) if not reply["ok"] else message.error
                return
            self._route(reply)

    def _broken(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        lost = _lost(self._session.path, "the connection broke")
        for message in self._streams.values():
            if not message.finished:
                message.error = lost
        self._streams.clear()


class AsyncClient:
    """asyncio client; calls may run concurrently on one connection."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = CONNECT_TIMEOUT_S,
    ) -> None:
        """``timeout`` bounds ``connect()``: connecting and the hello exchange, in all."""
        self._session = _Session(_socket_path(path))
        self._timeout_s = _checked_timeout(timeout)
        self._sock: socket.socket | None = None
        self._reader: AsyncFrameReader | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._failure: GatewayError | None = None
        # streaming recvs: the read loop makes the message at its first reply, so that
        # no progress reply can come before it exists
        self._stream_requests: set[int] = set()
        self._incoming: dict[int, AsyncIncomingMessage] = {}  # made, not yet returned
        self._streams: dict[int, AsyncIncomingMessage] = {}  # unfinished, by request id

    @property
    def site(self) -> str:
        return self._session.site

    @property
    def settings(self) -> dict[str, Any]:
        return self._session.settings

    async def connect(self) -> None:
        sock = _unix_socket()
        sock.setblocking(False)
        stage = "connect"
        try:
            async with asyncio.timeout(self._timeout_s):
                try:
                    await _connect_unix(sock, self._session.path)
                except OSError as exc:
                    sock.close()
                    raise _unavailable(self._session.path, exc) from None
                self._sock = sock
                self._reader = AsyncFrameReader(sock, 0)
                self._reader_task = asyncio.create_task(self._read_loop())
                stage = "hello"
                self._session.accept_hello(await self._hello())
        except TimeoutError:
            await self.close()
            sock.close()
            assert self._timeout_s is not None
            raise _timed_out(self._session.path, stage, self._timeout_s) from None
        except BaseException:
            await self.close()
            raise
        self._reader.max_payload_bytes = self._session.max_message_bytes

    async def _hello(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        rid = self._session.next_id()
        future: asyncio.Future[Reply] = loop.create_future()
        self._pending[rid] = future
        try:
            try:
                await loop.sock_sendall(self._sock, encode_request(HelloRequest(rid)))
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused at once: the read loop reads the gateway's reason
            except OSError as exc:
                raise _lost(self._session.path, exc) from None
            reply, _ = await future
        finally:
            self._pending.pop(rid, None)
        return reply

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
        meta, payload, checksum = self._session.encode(peer, tag, array, codec)
        return await self.send_encoded(
            peer, tag, meta, payload, checksum, step=step, critical=critical, deadline_s=deadline_s
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
        segments = self._session.segment_min_bytes is not None
        streaming = stream and segments
        request = _recv_request(tag, source, step, timeout, segments, streaming)
        reply, payload = await self._call(request, streaming=streaming)
        if not stream:
            return self._session.decode(reply, payload)
        made = self._incoming.pop(reply["id"], None)
        if made is not None:
            return made
        return AsyncIncomingMessage(
            _whole(reply, payload), payload, self._session.decode, _error_for
        )

    async def wait(self, peer: str, message_id: int, *, timeout: float | None = None) -> None:
        """As ``Client.wait``."""
        await self._call(lambda rid: WaitRequest(rid, peer, message_id, timeout))

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
        session = self._session
        if not session.segment_wanted(payload):
            request = _send_request(peer, tag, step, critical, meta, checksum, deadline_s)
            return _field((await self._call(request, payload))[0], "message_id", int)
        if not session.pool.has_free(payload.nbytes) and session.pool.lent_count:
            await self.ping()  # its reply says which segments the gateway let go of since
        token, fd, mapping = session.fill_segment(payload)
        failed = True
        try:
            request = _send_request(
                peer, tag, step, critical, meta, checksum, deadline_s, payload.nbytes, token
            )
            message_id = _field((await self._call(request, fd=fd))[0], "message_id", int)
            failed = False
            return message_id
        finally:
            session.handed_back(token, fd, mapping, failed=failed)

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
        s = self._session
        script = _coll.allreduce_script(
            s.site, s.settings, s.collective, s.choose_spec, tag, as_reducible_array(array),
            step=step, op=op, codec=codec, critical=critical, timeout=timeout,
            sites=sites, partial=partial,
        )  # fmt: skip
        return await _coll.run_async(self, s.site, step, script)

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
        s, given = self._session, _wire_or_none(array)
        script = _coll.broadcast_script(
            s.site, s.settings, tag, given, root=root, step=step, timeout=timeout, sites=sites
        )
        return await _coll.run_async(self, s.site, step, script)

    async def barrier(
        self, tag: str, *, step: int = 0, timeout: float = 30.0, sites: Iterable[str] | None = None
    ) -> None:
        s = self._session
        script = _coll.barrier_script(
            s.site, s.settings, tag, step=step, timeout=timeout, sites=sites
        )
        await _coll.run_async(self, s.site, step, script)

    async def paths(self) -> list[dict[str, Any]]:
        return _field((await self._call(PathsRequest))[0], "paths", list)

    async def status(self) -> dict[str, Any]:
        return _field((await self._call(StatusRequest))[0], "status", dict)

    async def reset_path(self, peer: str, path: str) -> None:
        """Close one path's connection now; the gateway reconnects it by itself."""
        await self._call(lambda rid: ResetPathRequest(rid, peer, path))

    async def ping(self) -> None:
        await self._call(PingRequest)

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
            self._reader_task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._session.pool.close()
        self._fail(GatewayUnavailable("this wangate client is closed", code="closed"))

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self,
        build: Callable[[int], Request],
        payload: Buffer = b"",
        fd: int | None = None,
        *,
        streaming: bool = False,
    ) -> Reply:
        if self._failure is not None:
            raise self._failure
        if self._sock is None:
            raise GatewayUnavailable("this wangate client is not connected", code="closed")
        loop = asyncio.get_running_loop()
        rid = self._session.next_id()
        body = memoryview(payload).cast("B")
        head = encode_request(build(rid), body.nbytes)
        future: asyncio.Future[Reply] = loop.create_future()
        self._pending[rid] = future
        if streaming:
            self._stream_requests.add(rid)
        try:
            # Shielded: a caller cancelled mid-write must not leave half a frame behind.
            await asyncio.shield(asyncio.ensure_future(self._write(head, body, fd)))
            reply, reply_payload = await future
        finally:
            self._pending.pop(rid, None)
            self._stream_requests.discard(rid)
        _raise_for(reply)
        return reply, reply_payload

    async def _write(self, head: bytes, body: memoryview, fd: int | None = None) -> None:
        loop = asyncio.get_running_loop()
        sock = self._sock
        assert sock is not None
        async with self._write_lock:
            try:
                if fd is None:
                    await loop.sock_sendall(sock, head)
                else:
                    await sock_sendall_with_fd(loop, sock, head, fd)
                if body.nbytes:
                    await loop.sock_sendall(sock, body)
            except OSError as exc:  # every pending call learns it through its future
                self._fail(_lost(self._session.path, exc))

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while True:
                head = await self._reader.read_head()
                if head is None:
                    raise ConnectionClosed("the gateway closed the connection")
                prefix, header = head
                reply = decode_reply(header)
                payload = await self._reader.read_payload(prefix.payload_bytes)
                payload = _segment_payload(reply, self._reader.fds) or payload
                self._session.note_released(reply)
                if reply["id"] is None:  # a refusal, or a frame it could not attribute
                    _raise_for_hello(reply)
                if self._stream_reply(reply, payload):
                    continue
                future = self._pending.pop(reply["id"], None)
                if future is not None and not future.done():
                    future.set_result((reply, payload))
        except GatewayError as exc:
            self._fail(exc)
        except (OSError, ConnectionClosed, FrameError) as exc:
            self._fail(_lost(self._session.path, exc))

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
            made = AsyncIncomingMessage(reply, payload, self._session.decode, _error_for)
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
