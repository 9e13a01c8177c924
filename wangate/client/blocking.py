"""``Client``: the blocking shell over the client protocol (``protocol.py``).

What is its own: the socket and its lock, connecting within a timeout, writing a
request and reading replies until its own comes, and reading a streamed message's
progress on the caller's thread (``IncomingMessage.wait``/``result``).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterable
from typing import Any, Literal, TypeVar, overload

import numpy as np

from wangate.collective.steps import run_sync
from wangate.incoming import IncomingMessage
from wangate.localapi.framing import ConnectionClosed, SyncFrameReader, send_frame
from wangate.localapi.protocol import FrameError, encode_request
from wangate.stepper import run_steps

from .address import CONNECT_TIMEOUT_S, checked_timeout, socket_path
from .failures import closed, failure_of, lost, timed_out, unavailable
from .protocol import Answer, Call, ClientProtocol, Exchange, Step

Frame = tuple[dict[str, Any], memoryview]
T = TypeVar("T")


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1e6))


class Client:
    """Blocking client. Calls are serialised by a lock, so a thread blocked in ``recv``
    holds up the others: use one ``Client`` per thread, or ``AsyncClient``."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = CONNECT_TIMEOUT_S,
        job: str | None = None,
    ) -> None:
        """Connect and say hello, within ``timeout`` seconds in all (None: no bound);
        ``GatewayUnavailable`` says what timed out. Later calls have their own bounds."""
        timeout = checked_timeout(timeout)
        self._session = ClientProtocol(socket_path(path), job)
        self._lock = threading.Lock()
        deadline = None if timeout is None else time.monotonic() + timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if timeout is not None:
            # A Unix socket's connect waits (while the listener's backlog is full) for
            # at most SO_SNDTIMEO, then fails with EAGAIN; settimeout() would not wait.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout))
        try:
            sock.connect(self._session.path)
        except BlockingIOError:
            sock.close()
            assert timeout is not None
            raise timed_out(self._session.path, "connect", timeout) from None
        except OSError as exc:
            sock.close()
            raise unavailable(self._session.path, exc) from None
        if timeout is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(0))
        self._sock: socket.socket | None = sock
        self._reader = SyncFrameReader(sock, 0)
        self._streams: dict[int, IncomingMessage] = {}  # by request id, until finished
        try:
            self._hello(deadline, timeout)
        except BaseException:
            self.close()
            raise
        self._reader.max_payload_bytes = self._session.max_message_bytes

    def _hello(self, deadline: float | None, timeout: float | None) -> None:
        sock = self._sock
        assert sock is not None
        self._reader.deadline = deadline
        if deadline is not None:
            sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        try:
            self._run(self._session.hello())
        except TimeoutError:
            assert timeout is not None
            raise timed_out(self._session.path, "hello", timeout) from None
        self._reader.deadline = None
        sock.settimeout(None)

    @property
    def site(self) -> str:
        """The name of the site whose gateway this is."""
        return self._session.site

    @property
    def job(self) -> str:
        """The job every call on this connection is in (``default`` unless named)."""
        return self._session.job

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
        return self._run(
            self._session.send(
                peer, tag, array, step=step, critical=critical, codec=codec, deadline_s=deadline_s
            )
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
        call = self._session.recv(tag, source=source, step=step, timeout=timeout, stream=stream)
        got: np.ndarray | IncomingMessage = self._run(call)
        return got

    def wait(self, peer: str, message_id: int, *, timeout: float | None = None) -> None:
        """Return once a trainer at ``peer`` took message ``message_id`` (the id ``send``
        returned). Raises ``MessageFailed`` (its id, tag, step and why) if it never will
        be, ``PeerUnreachable`` while the peer is, ``RecvTimeout`` after ``timeout``."""
        self._run(self._session.wait(peer, message_id, timeout=timeout))

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
        return self._run(
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
        return run_sync(self, script)

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
        script = self._session.broadcast(
            tag, array, root=root, step=step, timeout=timeout, sites=sites
        )
        return run_sync(self, script)

    def barrier(
        self, tag: str, *, step: int = 0, timeout: float = 30.0, sites: Iterable[str] | None = None
    ) -> None:
        """Return once every site has called ``barrier`` with this tag and step."""
        run_sync(self, self._session.barrier(tag, step=step, timeout=timeout, sites=sites))

    def paths(self) -> list[dict[str, Any]]:
        """One map per path (proto/localapi.md); ``wangate.rows.PathRow.from_dicts`` types them."""
        return self._run(self._session.paths())

    def status(self) -> dict[str, Any]:
        return self._run(self._session.status())

    def reset_path(self, peer: str, path: str) -> None:
        """Close one path's connection now; the gateway reconnects it by itself."""
        self._run(self._session.reset_path(peer, path))

    def ping(self) -> None:
        self._run(self._session.ping())

    def claim(self, call: str, step: int) -> None:
        """Enter collective ``call`` (``kind/tag``) at ``step`` (the collectives do it
        first): ``GatewayError`` ``collision`` while another trainer of the job at this
        site is in it."""
        self._run(self._session.claim(call, step))

    def close(self) -> None:
        with self._lock:
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._session.pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- the steps

    def _run(self, call: Call[T]) -> T:
        return run_steps(call, self._step)

    def _step(self, step: Step) -> Answer | IncomingMessage:
        if isinstance(step, Exchange):
            return self._exchange(step)
        message = IncomingMessage(
            step.header, step.payload, self._session.decode_header, failure_of, self._pump_stream
        )
        if not message.finished:
            self._streams[step.request_id] = message
        return message

    def _exchange(self, exchange: Exchange) -> Answer:
        with self._lock:
            sock = self._sock
            if sock is None:
                raise closed()
            rid = exchange.request.request_id
            body = memoryview(exchange.payload).cast("B")
            head = encode_request(exchange.request, body.nbytes)
            try:
                self._write(sock, exchange, head, body)
                while True:
                    reply, payload = self._read_reply()
                    if reply["id"] in (rid, None):
                        break
                    self._route(reply)  # a stream's progress; else a reply to a call
                    # interrupted earlier, dropped
            except TimeoutError:  # only while saying hello, within the connect timeout
                self._broken()
                raise
            except (OSError, ConnectionClosed) as exc:
                self._broken()
                raise lost(self._session.path, exc) from None
            except BaseException:  # e.g. KeyboardInterrupt mid-frame: stream position lost
                self._broken()
                raise
        if reply["id"] is None:
            self.close()  # the gateway closes a stream it cannot resynchronise
        return self._session.answer(exchange, reply, payload)

    @staticmethod
    def _write(sock: socket.socket, exchange: Exchange, head: bytes, body: memoryview) -> None:
        try:
            send_frame(sock, head, body, exchange.fd)  # the segment with the first byte
        except (BrokenPipeError, ConnectionResetError):
            if not exchange.first:
                raise

    def _read_reply(self) -> Frame:
        try:
            head = self._reader.read_head()
            if head is None:
                raise ConnectionClosed("the gateway closed the connection")
            prefix, header = head
            payload = self._reader.read_payload(prefix.payload_bytes)
            return self._session.reply_in(header, payload, self._reader.fds)
        except FrameError as exc:
            raise lost(self._session.path, f"protocol error: {exc}") from None

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
                message.error = closed()
                return
            self._reader.deadline = deadline
            try:
                reply, _ = self._read_reply()
            except TimeoutError:
                if not self._reader.between_frames:  # the stream position is lost
                    self._broken()
                    message.error = lost(self._session.path, "timed out within a reply")
                return
            except (OSError, ConnectionClosed) as exc:
                self._broken()
                message.error = lost(self._session.path, exc)
                return
            finally:
                self._reader.deadline = None
                if self._sock is not None:
                    self._sock.settimeout(None)
            if reply["id"] is None:
                self._shut()  # the lock is held
                message.error = failure_of(reply) if not reply["ok"] else message.error
                return
            self._route(reply)

    def _broken(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        lost_it = lost(self._session.path, "the connection broke")
        for message in self._streams.values():
            if not message.finished:
                message.error = lost_it
        self._streams.clear()
