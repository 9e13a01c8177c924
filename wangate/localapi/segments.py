"""Shared-memory segments: payloads that reach the gateway (or a trainer) without
passing through the Unix socket (proto/localapi.md, "Shared-memory segments").

A segment is a memfd (memfd_create(2)) passed as SCM_RIGHTS ancillary data with the
frame that names it (unix(7)). The size of a segment the gateway reads from must be
sealed (F_SEAL_SHRINK, F_SEAL_GROW; fcntl(2) "File Seals"), so the client cannot
truncate it under the gateway's mapping (which would be SIGBUS, not an error). Its
bytes are the client's to change until the message is confirmed; a change shows as a
checksum failure of that one message at the receiving gateway. Segments the gateway
hands to a trainer are sealed against writing (F_SEAL_FUTURE_WRITE): the trainer maps
them privately, so its array is writable and copy-on-write.

Each segment is made for one message and given away: whoever holds the last
descriptor or mapping frees it, so a process that dies leaks nothing. Nothing here
knows about the event loop; the descriptors could as well go to a worker process.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import mmap
import os
import socket
import stat
import weakref
from collections import deque
from collections.abc import Iterable

from wangate.errors import GatewayError

F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)  # Linux 5.1; not in 3.11
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
HANDED_SEALS = SIZE_SEALS | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
MAX_FDS_PER_MESSAGE = 4  # ancillary room per receive; a frame carries at most one
FD_SPACE = socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * array.array("i").itemsize)
SEND_NAME = "wangate-send"  # what /proc/PID/fd and /proc/PID/maps show
RECV_NAME = "wangate-recv"

# Measured (bench/localapi_shm.py, RESULTS.md "Shared-memory payloads"): from here on a
# segment hands a payload over faster than the socket carries it.
SEGMENT_MIN_BYTES = 1 << 20
PAYLOAD_ALIGNMENT = 64  # a payload starting here is aligned for every dtype (and SIMD)
# inbound segments alive at once (each holds a descriptor until a trainer takes it):
# beyond this, bodies go to private memory, so a peer cannot exhaust descriptors
MAX_LIVE_SEGMENTS = 256


class SegmentError(GatewayError):
    """A descriptor that is not a usable segment (code ``bad_segment``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="bad_segment")


def new_segment(size_bytes: int, name: str) -> tuple[int, mmap.mmap]:
    """A fresh memfd of ``size_bytes`` and a shared writable mapping of it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size_bytes)
        return fd, mmap.mmap(fd, max(size_bytes, 1))
    except BaseException:
        os.close(fd)
        raise


def seal(fd: int, seals: int = HANDED_SEALS) -> None:
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)


def map_segment(fd: int, offset: int, length: int) -> memoryview:
    """A read-only view of ``length`` bytes at ``offset`` of a client's segment.

    Checks first that ``fd`` is a memfd whose size is sealed and that holds that range;
    raises ``SegmentError`` naming what is wrong. The descriptor stays the caller's.
    """
    try:
        info = os.fstat(fd)
    except OSError as exc:
        raise SegmentError(f"cannot inspect the segment: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SegmentError("the descriptor is not a shared-memory segment (not a regular file)")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:  # EINVAL: a file that cannot carry seals, so not a memfd
        raise SegmentError("the descriptor is not a memfd (it cannot carry seals)") from None
    if seals & SIZE_SEALS != SIZE_SEALS:
        raise SegmentError(
            "the segment's size is not sealed (F_SEAL_SHRINK and F_SEAL_GROW are required)"
        )
    if offset < 0 or length < 0 or offset + length > info.st_size:
        raise SegmentError(
            f"the segment holds {info.st_size} bytes, the request names {length} bytes "
            f"at offset {offset}"
        )
    if length == 0:
        return memoryview(b"")
    start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap(2): a page-aligned offset
    try:
        mapping = mmap.mmap(
            fd, offset + length - start, mmap.MAP_SHARED, mmap.PROT_READ, offset=start
        )
    except (OSError, ValueError) as exc:
        raise SegmentError(f"cannot map the segment: {exc}") from None
    return memoryview(mapping)[offset - start :]


# the segment each mapped payload came from, by its mapping: (descriptor, offset)
_SOURCES: weakref.WeakKeyDictionary[mmap.mmap, tuple[int, int]] = weakref.WeakKeyDictionary()


def keep_source(payload: memoryview, fd: int, offset: int) -> None:
    """Keep ``fd`` (now owned here) open for as long as ``payload``'s mapping lives, so
    that the payload can be passed on to another process without a copy
    (``source_of``); ``offset`` is where ``payload`` starts in it."""
    mapping = payload.obj
    assert isinstance(mapping, mmap.mmap)
    _SOURCES[mapping] = (fd, offset)
    weakref.finalize(mapping, os.close, fd)


def source_of(payload: object) -> tuple[int, int] | None:
    """(descriptor, offset) of the segment ``payload`` was mapped from by
    ``map_segment`` and kept with ``keep_source``; valid while ``payload`` lives."""
    if not isinstance(payload, memoryview) or not isinstance(payload.obj, mmap.mmap):
        return None
    return _SOURCES.get(payload.obj)


def map_delivered(fd: int, offset: int, length: int) -> memoryview:
    """A trainer's writable, copy-on-write view of a segment the gateway handed it."""
    if length == 0:
        return memoryview(bytearray())
    mapping = mmap.mmap(fd, offset + length, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    return memoryview(mapping)[offset:]


def fds_from_ancillary(ancdata: Iterable[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors in ``recvmsg`` ancillary data (SCM_RIGHTS)."""
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(data[: len(data) - len(data) % received.itemsize])
            fds.extend(received)
    return fds


def fd_ancillary(fds: Iterable[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


def close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class InboundSegments:
    """The gateway's bodies of large inbound messages, each in a segment of its own.

    The reassembly writes into ``allocate``'s buffer; once the message is verified,
    ``claim`` seals the segment and gives away its descriptor (the mapping lives as
    long as views of it do). ``free`` forgets a body that will not be delivered.
    """

    def __init__(
        self, min_bytes: int = SEGMENT_MIN_BYTES, max_live: int = MAX_LIVE_SEGMENTS
    ) -> None:
        self.min_bytes = min_bytes
        self.max_live = max_live
        self._open: dict[int, int] = {}  # id(mapping) -> its descriptor
        self.made = 0
        self.live = 0  # mappings not yet gone (assembling, or delivered and not taken)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def allocate(self, size_bytes: int, payload_offset: int | None) -> bytearray | memoryview:
        """A body of ``size_bytes``; a segment's is placed so that the payload (at
        ``payload_offset`` in it, when known) starts aligned, so that the trainer's
        array can be a view of it. The body ends the segment. With the offset not yet
        known (the first shard to arrive was not the body's first), the body's end is
        aligned instead: the payload runs to the end and its length is a multiple of
        its item size, so it still starts aligned for its dtype."""
        if size_bytes < self.min_bytes or self.live >= self.max_live:
            return bytearray(size_bytes)
        aligned = size_bytes if payload_offset is None else payload_offset
        pad = -aligned % PAYLOAD_ALIGNMENT
        try:
            fd, mapping = new_segment(pad + size_bytes, RECV_NAME)
        except OSError:  # out of descriptors or memory: today's way still works
            return bytearray(size_bytes)
        self._open[id(mapping)] = fd
        self.made += 1
        self.live += 1
        weakref.finalize(mapping, self._gone)
        return memoryview(mapping)[pad:]

    def _gone(self) -> None:
        self.live -= 1

    def claim(self, payload: memoryview) -> int | None:
        """The sealed descriptor of the segment ``payload`` lies in, now the caller's.

        It may be claimed while the body is still being written: the gateway's own
        mapping predates the seal (F_SEAL_FUTURE_WRITE bars only later ones)."""
        fd = self._open.pop(id(payload.obj), None)
        if fd is not None and not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SEAL:
            seal(fd)
        return fd

    def descriptor(self, body: bytearray | memoryview) -> int | None:
        """The descriptor of ``body``'s segment (still this object's), if it has one."""
        if not isinstance(body, memoryview):
            return None
        return self._open.get(id(body.obj))

    def holds(self, body: memoryview) -> bool:
        """``body`` is in a segment whose descriptor is here (not yet claimed)."""
        return id(body.obj) in self._open

    def restore(self, body: memoryview, fd: int) -> None:
        """Take back a claimed descriptor that nobody was given after all."""
        self._open[id(body.obj)] = fd

    def free(self, body: bytearray | memoryview) -> None:
        if isinstance(body, memoryview):
            fd = self._open.pop(id(body.obj), None)
            if fd is not None:
                os.close(fd)


def recv_with_fds(sock: socket.socket, target: memoryview) -> tuple[int, list[int]]:
    """``sock.recv_into(target)``, also returning descriptors that came with the bytes.

    Raises ``SegmentError`` (after closing what did arrive) if more descriptors came at
    once than a frame may carry: the kernel dropped the rest.
    """
    received, ancdata, flags, _ = sock.recvmsg_into([target], FD_SPACE, socket.MSG_CMSG_CLOEXEC)
    fds = fds_from_ancillary(ancdata) if ancdata else []
    if flags & socket.MSG_CTRUNC:
        close_all(fds)
        raise SegmentError(f"more than {MAX_FDS_PER_MESSAGE} descriptors came in one message")
    return received, fds


class FrameDescriptors:
    """Descriptors that came over a stream, each bound to the frame it was sent with.

    The kernel hands a descriptor to the receive that reads the first byte of the
    message it was sent with, and ends that receive with that message (unix(7); Linux
    unix_stream_read_generic). So each is kept with the stream range of its receive,
    [start, end), and belongs to the last frame starting in that range: a frame that
    names a segment gets its own descriptor or none, never a neighbour's.
    """

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._fds: deque[tuple[int, int, int]] = deque()
        self.received_bytes = 0

    def received(self, size_bytes: int, fds: list[int]) -> bool:
        """Bytes (and descriptors) of one receive; False if they break the rules (more
        than one descriptor at once, or too many no frame named): close the stream."""
        start = self.received_bytes
        self.received_bytes += size_bytes
        if not fds:
            return True
        self._fds.append((start, start + size_bytes, fds[0]))
        if len(fds) > 1 or len(self._fds) > self.max_pending:
            close_all(fds[1:])
            return False
        return True

    def take(self, frame_start: int, frame_end: int) -> int | None:
        """The descriptor that came with the frame at [frame_start, frame_end), if one
        did (now the caller's); those of frames already past are closed."""
        fds = self._fds
        while fds and fds[0][1] <= frame_start:
            os.close(fds.popleft()[2])  # came with a frame that named no segment
        if fds and fds[0][0] <= frame_start and frame_end >= fds[0][1]:
            return fds.popleft()[2]
        return None

    def close(self) -> None:
        close_all(fd for _, _, fd in self._fds)
        self._fds.clear()


class _Pooled:
    __slots__ = ("capacity", "fd", "mapping", "token")

    def __init__(self, fd: int, mapping: mmap.mmap, capacity: int) -> None:
        self.fd = fd
        self.mapping = mapping
        self.capacity = capacity
        self.token = 0  # the hand-over it is lent to (0: free)


class SegmentPool:
    """A client's send segments, reused: filling a fresh segment costs a page fault per
    page, several times the copy itself (RESULTS.md, "Shared-memory payloads").

    A segment is lent to one hand-over at a time, named by a token the gateway gives
    back (``released``) once it has let go of the bytes; only then is it reused. Its
    size is sealed; its bytes are not (they are rewritten), so the gateway relies on the
    checksum, not on seals, for them: F_SEAL_WRITE cannot be undone, and a fresh
    segment per send costs about 7 times the copy into a reused one (RESULTS.md). At
    most ``limit_bytes`` are kept: beyond that a hand-over gets a segment of its own,
    closed after it.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._segments: list[_Pooled] = []
        self._lent: dict[int, _Pooled] = {}  # token -> segment
        self._next_token = 1

    @property
    def pooled_bytes(self) -> int:
        return sum(segment.capacity for segment in self._segments)

    @property
    def lent_count(self) -> int:
        return len(self._lent)

    def has_free(self, size_bytes: int) -> bool:
        return self._free(size_bytes) is not None

    def _free(self, size_bytes: int) -> _Pooled | None:
        fits = [
            s for s in self._segments if not s.token and size_bytes <= s.capacity <= 2 * size_bytes
        ]
        return min(fits, key=lambda s: s.capacity, default=None)

    def lend(self, size_bytes: int) -> tuple[int, int, mmap.mmap]:
        """(token, descriptor, mapping) of a segment of at least ``size_bytes``; token 0
        means it is not pooled: close both after the hand-over."""
        segment = self._free(size_bytes)
        if segment is None:
            capacity = -(-size_bytes // SEGMENT_MIN_BYTES) * SEGMENT_MIN_BYTES
            for spare in sorted(self._segments, key=lambda s: -s.capacity):
                if self.pooled_bytes + capacity <= self.limit_bytes:
                    break
                if not spare.token:
                    self._drop(spare)
            fd, mapping = new_segment(capacity, SEND_NAME)
            seal(fd, SIZE_SEALS)
            if self.pooled_bytes + capacity > self.limit_bytes:
                return 0, fd, mapping
            segment = _Pooled(fd, mapping, capacity)
            self._segments.append(segment)
        segment.token = self._next_token
        self._next_token = self._next_token % 0xFFFFFFFF + 1
        self._lent[segment.token] = segment
        return segment.token, segment.fd, segment.mapping

    def released(self, tokens: Iterable[int]) -> None:
        """The gateway let go of these hand-overs (or refused them)."""
        for token in tokens:
            segment = self._lent.pop(token, None)
            if segment is not None:
                segment.token = 0

    def _drop(self, segment: _Pooled) -> None:
        self._segments.remove(segment)
        segment.mapping.close()
        os.close(segment.fd)

    def close(self) -> None:
        for segment in list(self._segments):
            self._lent.pop(segment.token, None)
            self._drop(segment)
