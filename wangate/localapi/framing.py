"""Reading frames from a stream socket with one copy of the payload at most.

``ReadBuffer`` is a small staging area for prefixes and headers. The
payload goes straight from the socket into one buffer of exactly the declared size
(``numpy.empty``: no zero-fill), after the prefix was checked against the limit;
only the few bytes that arrived together with the header are copied across. The
staging area exists only while it holds bytes: an idle connection keeps no buffer
(a gateway may hold a thousand idle trainer connections).
``FrameAssembler`` holds that logic without any I/O; ``SyncFrameReader`` (blocking
socket) and ``ReadyFrameReader`` (non-blocking socket, a readiness callback) are thin
drivers of it, and the gateway's local API server drives it from readiness callbacks.
"""

from __future__ import annotations

import array
import asyncio
import socket
import time
from collections import deque
from typing import Any

import numpy as np

from wangate.localapi.protocol import PREFIX_BYTES, FrameError, FramePrefix, decode_prefix
from wangate.localapi.segments import recv_with_fds
from wangate.shm import close_all

# Allocated when bytes arrive and dropped once they are consumed; it grows (doubling)
# only while one frame's prefix and header do not fit, so at most about twice
# PREFIX_BYTES + MAX_HEADER_BYTES.
STAGING_BYTES = 16 * 1024
SKIP_CHUNK_BYTES = 1024 * 1024
Frame = tuple[FramePrefix, bytes, memoryview]  # prefix, header, payload
EAGER_READ_BYTES = 1024 * 1024


class ConnectionClosed(EOFError):
    """The peer closed the stream in the middle of a frame."""


def new_payload_buffer(size_bytes: int) -> memoryview:
    buffer: Any = np.empty(size_bytes, dtype=np.uint8)
    return memoryview(buffer).cast("B")


class ReadBuffer:
    """Bytes received but not yet consumed, in a staging area that exists only while
    it holds any."""

    def __init__(self, size_bytes: int = STAGING_BYTES) -> None:
        self._initial_bytes = size_bytes
        self._buf: bytearray | None = None
        self._start = 0
        self._end = 0

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def capacity(self) -> int:
        """Bytes allocated now (0 while empty)."""
        return 0 if self._buf is None else len(self._buf)

    def writable(self) -> memoryview:
        """Where the next receive should land (compacting or growing first when needed)."""
        if self._buf is None:
            self._buf = bytearray(self._initial_bytes)
            self._start = self._end = 0
        elif self._end == len(self._buf):
            size = self._end - self._start
            if size == len(self._buf):  # full of one incomplete head: make room for it
                grown = bytearray(2 * size)
                grown[:size] = self._buf
                self._buf = grown
            else:
                self._buf[:size] = self._buf[self._start : self._end]
            self._start, self._end = 0, size
        return memoryview(self._buf)[self._end :]

    def wrote(self, size_bytes: int) -> None:
        self._end += size_bytes

    def take(self, size_bytes: int) -> bytes | None:
        """Consume ``size_bytes`` if that many are buffered."""
        if self._buf is None or self._end - self._start < size_bytes:
            return None
        data = bytes(self._buf[self._start : self._start + size_bytes])
        self._consumed(size_bytes)
        return data

    def drain_into(self, target: memoryview) -> int:
        """Move buffered bytes into ``target``; returns how many."""
        if self._buf is None:
            return 0
        size = min(len(target), self._end - self._start)
        target[:size] = memoryview(self._buf)[self._start : self._start + size]
        self._consumed(size)
        return size

    def discard(self, size_bytes: int) -> int:
        """Drop up to ``size_bytes`` buffered bytes; returns how many."""
        size = min(size_bytes, self._end - self._start)
        self._consumed(size)
        return size

    def release(self) -> None:
        """Drop the staging area if it holds nothing (e.g. after a receive found no data)."""
        if self._start == self._end:
            self._buf = None

    def _consumed(self, size_bytes: int) -> None:
        self._start += size_bytes
        if self._start == self._end:
            self._buf = None  # idle: keep nothing


class FrameAssembler:
    """Bytes in, frames out, no I/O: receive into ``writable()``, report with ``wrote()``.

    ``next_head()`` gives each frame's prefix and header; the caller then says what
    to do with its payload: ``expect_payload`` (it lands in its own buffer, taken with
    ``take_payload`` once full) or ``skip_payload``. Until it says, no more bytes are
    asked for beyond the staging area. A bad prefix raises ``FrameError`` (fatal).
    """

    def __init__(self, max_payload_bytes: int) -> None:
        self.max_payload_bytes = max_payload_bytes
        self._staging = ReadBuffer()
        self._prefix: FramePrefix | None = None  # decoded, its header not yet complete
        self._payload: memoryview | None = None
        self._filled = 0
        self._skip_bytes = 0
        self._scratch: memoryview | None = None
        self._position = 0  # stream offset of the first byte no frame has claimed yet
        self.frame_start = 0  # stream offset of the last frame ``next_head`` gave out
        self.frame_bytes = 0  # and its whole length

    @property
    def between_frames(self) -> bool:
        """Nothing of a frame has arrived beyond what was handed out."""
        return (
            self._prefix is None
            and self._payload is None
            and self._skip_bytes == 0
            and len(self._staging) == 0
        )

    def release_idle(self) -> None:
        """Keep no buffer while nothing is staged: call when a receive found no data."""
        self._staging.release()

    def writable(self) -> memoryview:
        if self._payload is not None:
            return self._payload[self._filled :]
        if self._skip_bytes:
            if self._scratch is None:
                self._scratch = memoryview(bytearray(SKIP_CHUNK_BYTES))
            return self._scratch[: self._skip_bytes]
        return self._staging.writable()

    def wrote(self, size_bytes: int) -> None:
        if self._payload is not None:
            self._filled += size_bytes
        elif self._skip_bytes:
            self._skip_bytes -= size_bytes
            if not self._skip_bytes:
                self._scratch = None
        else:
            self._staging.wrote(size_bytes)

    def next_head(self) -> tuple[FramePrefix, bytes] | None:
        """The next frame's prefix and header, once both are here."""
        if self._payload is not None or self._skip_bytes:
            return None
        if self._prefix is None:
            raw = self._staging.take(PREFIX_BYTES)
            if raw is None:
                return None
            self._prefix = decode_prefix(raw, self.max_payload_bytes)
        header = self._staging.take(self._prefix.header_bytes)
        if header is None:
            return None
        prefix, self._prefix = self._prefix, None
        self.frame_start = self._position
        self.frame_bytes = PREFIX_BYTES + prefix.header_bytes + prefix.payload_bytes
        self._position += self.frame_bytes
        return prefix, header

    def expect_payload(self, size_bytes: int) -> None:
        self._payload = new_payload_buffer(size_bytes)
        self._filled = self._staging.drain_into(self._payload)

    def take_payload(self) -> memoryview | None:
        """The payload expected, once all of it arrived."""
        payload = self._payload
        if payload is None or self._filled < len(payload):
            return None
        self._payload = None
        return payload

    def skip_payload(self, size_bytes: int) -> None:
        self._skip_bytes = size_bytes - self._staging.discard(size_bytes)


async def _wait(loop: asyncio.AbstractEventLoop, fileno: int, *, write: bool) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fileno, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fileno)


def _frame_message(
    head: bytes, body: memoryview, fd: int | None
) -> tuple[list[Any], list[tuple[int, int, bytes]]]:
    ancillary = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _fd_bytes(fd))]
    return ([head, body] if body.nbytes else [head]), ancillary


def _unsent(head: bytes, body: memoryview, sent: int) -> list[Any]:
    """What of a frame one ``sendmsg`` of ``sent`` bytes left."""
    if sent < len(head):
        return [head[sent:], body] if body.nbytes else [head[sent:]]
    rest = body[sent - len(head) :]
    return [rest] if rest.nbytes else []


def send_frame(sock: socket.socket, head: bytes, body: memoryview, fd: int | None = None) -> None:
    """A whole frame on a blocking socket, ``fd`` (if any) on its first byte: head and
    body in one ``sendmsg`` as far as the socket takes them."""
    sent = sock.sendmsg(*_frame_message(head, body, fd))
    for part in _unsent(head, body, sent):
        sock.sendall(part)


def send_frame_at_once(
    sock: socket.socket, head: bytes, body: memoryview, fd: int | None = None
) -> list[Any] | None:
    """One ``sendmsg`` of a whole frame on a non-blocking socket, ``fd`` (if any) on its
    first byte: what the socket did not take ([] when it took it all), or None when it
    took nothing (the descriptor did not go either)."""
    try:
        sent = sock.sendmsg(*_frame_message(head, body, fd))
    except (BlockingIOError, InterruptedError):
        return None
    return _unsent(head, body, sent)


async def sock_send_frame(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    head: bytes,
    body: memoryview,
    fd: int | None = None,
) -> None:
    """A whole frame, ``fd`` (if any) on its first byte: one ``sendmsg`` of head and
    body at once, and only what did not fit waits for room. Each ``sock_sendall`` may
    give the loop a turn, and whatever runs then would hold the reader between the
    head and the body."""
    rest = send_frame_at_once(sock, head, body, fd)
    if rest is None:
        if fd is not None:
            await sock_sendall_with_fd(loop, sock, head, fd)
            rest = _unsent(head, body, len(head))
        else:
            rest = _unsent(head, body, 0)
    await sock_send_rest(loop, sock, rest)


async def sock_send_rest(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, rest: list[Any]
) -> None:
    """What ``send_frame_at_once`` left of a frame, as the socket makes room."""
    for part in rest:
        await loop.sock_sendall(sock, part)


def _fd_bytes(fd: int) -> bytes:
    return array.array("i", [fd]).tobytes()


async def sock_sendall_with_fd(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, data: bytes, fd: int
) -> None:
    """``loop.sock_sendall`` with ``fd`` attached to the first byte (SCM_RIGHTS): the
    loop has no sendmsg, so wait for room ourselves."""
    while True:
        try:
            sent = socket.send_fds(sock, [data], [fd])
            break
        except (BlockingIOError, InterruptedError):
            await _wait(loop, sock.fileno(), write=True)
    if sent < len(data):
        await loop.sock_sendall(sock, data[sent:])


class _FrameReader:
    def __init__(self, sock: socket.socket, max_payload_bytes: int) -> None:
        self._sock = sock
        self._frames = FrameAssembler(max_payload_bytes)
        # descriptors that came with the frames (SCM_RIGHTS), oldest first: a frame
        # naming a segment takes the next one
        self.fds: deque[int] = deque()

    def _recv(self, target: memoryview) -> int:
        received, fds = recv_with_fds(self._sock, target)
        self.fds.extend(fds)
        return received

    def close_fds(self) -> None:
        close_all(self.fds)
        self.fds.clear()

    @property
    def between_frames(self) -> bool:
        """No frame is partly read: a wait given up here leaves the stream usable."""
        return self._frames.between_frames

    @property
    def max_payload_bytes(self) -> int:
        return self._frames.max_payload_bytes

    @max_payload_bytes.setter
    def max_payload_bytes(self, value: int) -> None:
        self._frames.max_payload_bytes = value


class SyncFrameReader(_FrameReader):
    """``FrameAssembler`` over a blocking socket.

    With ``deadline`` (a ``time.monotonic()`` value) set, every receive waits only
    until then and raises ``TimeoutError`` after: a bound on the whole read, however
    the bytes trickle in.
    """

    deadline: float | None = None

    def _receive(self) -> int:
        if self.deadline is not None:
            remaining_s = self.deadline - time.monotonic()
            if remaining_s <= 0:
                raise TimeoutError("timed out")
            self._sock.settimeout(remaining_s)
        received = self._recv(self._frames.writable())
        self._frames.wrote(received)
        return received

    def read_head(self) -> tuple[FramePrefix, bytes] | None:
        """Prefix and header of the next frame; None on a clean close between frames."""
        while (head := self._frames.next_head()) is None:
            if self._receive() == 0:
                if self._frames.between_frames:
                    return None
                raise ConnectionClosed("connection closed in the middle of a frame")
        return head

    def read_payload(self, size_bytes: int) -> memoryview:
        self._frames.expect_payload(size_bytes)
        while (payload := self._frames.take_payload()) is None:
            if self._receive() == 0:
                raise ConnectionClosed("connection closed in the middle of a payload")
        return payload


class ReadyFrameReader(_FrameReader):
    """``FrameAssembler`` over a non-blocking socket, driven by the loop's readiness
    callback: each ``frames_ready`` reads what is there and returns the frames it
    completed. No task waits between the bytes and their frame: on a busy or cold loop
    each turn costs (a task woken, a reader added and removed per read)."""

    def __init__(self, sock: socket.socket, max_payload_bytes: int) -> None:
        super().__init__(sock, max_payload_bytes)
        self._head: tuple[FramePrefix, bytes] | None = None  # its payload is arriving

    def frames_ready(self) -> tuple[list[Frame], ConnectionClosed | FrameError | None]:
        """The frames completed by what the socket holds now (at most EAGER_READ_BYTES
        read: what is left makes the socket readable again after the loop turns), and
        why the stream ended if it did: closed, or a bad prefix (``FrameError``) after
        the frames before it."""
        frames: list[Frame] = []
        budget = EAGER_READ_BYTES
        while True:
            error = self._complete(frames)
            if error is not None or budget <= 0:
                return frames, error
            target = self._frames.writable()
            try:
                received = self._recv(target)
            except (BlockingIOError, InterruptedError):
                self._frames.release_idle()
                return frames, None
            if received == 0:
                if self._head is None and self._frames.between_frames:
                    return frames, ConnectionClosed("the gateway closed the connection")
                return frames, ConnectionClosed("connection closed in the middle of a frame")
            # a short read found the socket empty: complete what came, skip the EAGAIN read
            drained = received < len(target)
            del target
            self._frames.wrote(received)
            budget = 0 if drained else budget - received

    def _complete(self, frames: list[Frame]) -> FrameError | None:
        """Append every frame the assembler holds whole; a bad prefix stops it."""
        assembler = self._frames
        while True:
            if self._head is None:
                try:
                    head = assembler.next_head()
                except FrameError as exc:
                    return exc
                if head is None:
                    return None
                self._head = head
                assembler.expect_payload(head[0].payload_bytes)
            payload = assembler.take_payload()
            if payload is None:
                return None
            prefix, header = self._head
            self._head = None
            frames.append((prefix, header, payload))
