"""The gateway's bodies of large inbound messages, each in a shared-memory segment
(wangate.shm) that is handed to the trainer that takes the message."""

from __future__ import annotations

import fcntl
import os
import weakref

from wangate.shm import RECV_NAME, SEGMENT_MIN_BYTES, new_segment, seal

PAYLOAD_ALIGNMENT = 64  # a payload starting here is aligned for every dtype (and SIMD)
# inbound segments alive at once (each holds a descriptor until a trainer takes it):
# beyond this, bodies go to private memory, so a peer cannot exhaust descriptors
MAX_LIVE_SEGMENTS = 256


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
