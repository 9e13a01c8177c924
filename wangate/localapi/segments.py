"""Segments on the trainer's socket: descriptors bound to the frames they came with,
and a client's pool of send segments (proto/localapi.md, "Shared-memory segments";
the primitives are wangate.shm)."""

from __future__ import annotations

import array
import mmap
import os
import socket
from collections import deque
from collections.abc import Iterable

from wangate.shm import (
    SEGMENT_MIN_BYTES,
    SEND_NAME,
    SIZE_SEALS,
    SegmentError,
    close_all,
    fds_from_ancillary,
    new_segment,
    seal,
)

MAX_FDS_PER_MESSAGE = 4  # ancillary room per receive; a frame carries at most one
FD_SPACE = socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * array.array("i").itemsize)


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
