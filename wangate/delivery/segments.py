"""The gateway's bodies of large inbound messages, each in a shared-memory segment
(wangate.shm) that is handed to the trainer that takes the message, and taken back
for reuse once that trainer's client says its mapping is gone."""

from __future__ import annotations

import fcntl
import os
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from mmap import mmap

from wangate.shm import RECV_NAME, SEGMENT_MIN_BYTES, new_segment, seal

PAYLOAD_ALIGNMENT = 64  # a payload starting here is aligned for every dtype (and SIMD)
# inbound segments alive at once (each holds a descriptor until a trainer takes it):
# beyond this, bodies go to private memory, so a peer cannot exhaust descriptors
MAX_LIVE_SEGMENTS = 256
# Handed-over segments a client may return (``lend``), at most; beyond, the oldest is
# forgotten (never reused). Returned ones kept for reuse, at most: the pages of a kept
# segment stay the gateway's, and a fresh segment's cost several times the copy into
# them (bench/RESULTS.md, "CPU per byte").
MAX_LENT_SEGMENTS = 256
MAX_POOLED_SEGMENTS = 64
MAX_POOLED_BYTES = 1 << 30
# A returned segment not reused within this long is let go: a training loop reuses its
# sizes every step, and traffic of ever-new sizes (or none) should not hold memory.
POOL_IDLE_S = 2.0
MAX_SEGMENT_ID = 2**32 - 1  # a u32 on the local API


@dataclass(frozen=True)
class _Kept:
    """A segment kept for reuse: the gateway's own descriptor and writable mapping
    (made before the seal, so it still writes), and the job whose bodies it may hold."""

    fd: int
    mapping: mmap
    job: str


class InboundSegments:
    """The gateway's bodies of large inbound messages, each in a segment of its own.

    The reassembly writes into ``allocate``'s buffer; once the message is verified,
    ``claim`` seals the segment and gives away its descriptor (the mapping lives as
    long as views of it do). ``free`` forgets a body that will not be delivered.

    ``lend`` claims one for a client that returns segments: a later ``returned`` from
    that client's connection puts it in the pool, and a body of the same size and job
    is then written into it instead of a fresh segment. Only the same job: a client
    could keep mapping a segment it said it returned, and may read only what its job
    may receive anyway.
    """

    def __init__(
        self, min_bytes: int = SEGMENT_MIN_BYTES, max_live: int = MAX_LIVE_SEGMENTS
    ) -> None:
        self.min_bytes = min_bytes
        self.max_live = max_live
        self._open: dict[int, int] = {}  # id(mapping) -> its descriptor
        # id(mapping) -> the job its body was written for, while the mapping lives
        self._job_of: dict[int, str | None] = {}
        self._lent: dict[tuple[int, int], _Kept] = {}  # (connection, segment id) -> kept
        self._pool: deque[tuple[_Kept, float]] = deque()  # returned (and when), oldest first
        self._last_id = 0
        self.made = 0
        self.reused = 0
        self.live = 0  # mappings not yet gone (assembling, delivered, lent or pooled)

    @property
    def open_count(self) -> int:
        return len(self._open)

    @property
    def pooled_bytes(self) -> int:
        return sum(len(kept.mapping) for kept, _ in self._pool)

    def counts(self) -> dict[str, int]:
        """What ``wangate status`` shows of them (proto/localapi.md, ``segments``)."""
        return {
            "made": self.made,
            "reused": self.reused,
            "live": self.live,
            "lent": len(self._lent),
            "pooled": len(self._pool),
            "pooled_bytes": self.pooled_bytes,
        }

    def allocate(
        self, size_bytes: int, payload_offset: int | None, job: str | None = None
    ) -> bytearray | memoryview:
        """A body of ``size_bytes``; a segment's is placed so that the payload (at
        ``payload_offset`` in it, when known) starts aligned, so that the trainer's
        array can be a view of it. The body ends the segment. With the offset not yet
        known (the first shard to arrive was not the body's first), the body's end is
        aligned instead: the payload runs to the end and its length is a multiple of
        its item size, so it still starts aligned for its dtype. With ``job`` known, a
        returned segment of that job and size is reused."""
        if size_bytes < self.min_bytes:
            return bytearray(size_bytes)
        aligned = size_bytes if payload_offset is None else payload_offset
        pad = -aligned % PAYLOAD_ALIGNMENT
        kept = None if job is None else self._pooled(job, pad + size_bytes)
        if kept is not None:
            self._open[id(kept.mapping)] = kept.fd
            self.reused += 1
            return memoryview(kept.mapping)[pad:]
        if self.live >= self.max_live and self._pool:
            self._drop(self._pool.popleft()[0])  # room for a fresh one: the oldest goes
        if self.live >= self.max_live:
            return bytearray(size_bytes)
        try:
            fd, mapping = new_segment(pad + size_bytes, RECV_NAME)
        except OSError:  # out of descriptors or memory: today's way still works
            return bytearray(size_bytes)
        key = id(mapping)
        self._open[key] = fd
        self._job_of[key] = job
        self.made += 1
        self.live += 1
        weakref.finalize(mapping, self._gone, key)
        return memoryview(mapping)[pad:]

    def _pooled(self, job: str, size_bytes: int) -> _Kept | None:
        """The newest returned segment of ``job`` and ``size_bytes``, now taken."""
        for index in range(len(self._pool) - 1, -1, -1):
            kept = self._pool[index][0]
            if kept.job == job and len(kept.mapping) == size_bytes:
                del self._pool[index]
                self._job_of[id(kept.mapping)] = job
                return kept
        return None

    def _gone(self, key: int) -> None:
        self.live -= 1
        self._job_of.pop(key, None)

    def claim(self, payload: memoryview) -> int | None:
        """The sealed descriptor of the segment ``payload`` lies in, now the caller's.

        It may be claimed while the body is still being written: the gateway's own
        mapping predates the seal (F_SEAL_FUTURE_WRITE bars only later ones)."""
        fd = self._open.pop(id(payload.obj), None)
        if fd is not None and not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SEAL:
            seal(fd)
        return fd

    def lend(self, payload: memoryview, connection: int, job: str) -> tuple[int | None, int]:
        """``claim``, for a delivery of ``job`` to a client that returns segments: the
        descriptor and the id it returns it by (0: not to be returned: the body was
        allocated not knowing its job, as for a worker's assembly, which a later body
        could not reuse, or for another job, which a peer's first bytes named)."""
        mapping = payload.obj
        fd = self.claim(payload)
        if fd is None or not isinstance(mapping, mmap) or self._job_of.get(id(mapping)) != job:
            return fd, 0
        try:
            kept = _Kept(os.dup(fd), mapping, job)
        except OSError:
            return fd, 0
        self._last_id = self._last_id % MAX_SEGMENT_ID + 1
        self._lent[(connection, self._last_id)] = kept
        while len(self._lent) > MAX_LENT_SEGMENTS:
            self._drop(self._lent.pop(next(iter(self._lent))))
        return fd, self._last_id

    def returned(self, connection: int, segment_ids: Iterable[int], now: float) -> None:
        """``connection``'s client let go of these at ``now``: into the pool. Ids it was
        not lent (or that were forgotten since) are ignored."""
        for segment_id in segment_ids:
            kept = self._lent.pop((connection, segment_id), None)
            if kept is not None:
                self._pool.append((kept, now))
        pooled_bytes = self.pooled_bytes
        while len(self._pool) > MAX_POOLED_SEGMENTS or pooled_bytes > MAX_POOLED_BYTES:
            oldest = self._pool.popleft()[0]
            pooled_bytes -= len(oldest.mapping)
            self._drop(oldest)

    def expire(self, now: float) -> float | None:
        """Let go of the segments returned ``POOL_IDLE_S`` or longer before ``now``;
        when the next one will be due, if any is left."""
        while self._pool and self._pool[0][1] + POOL_IDLE_S <= now:
            self._drop(self._pool.popleft()[0])
        return self._pool[0][1] + POOL_IDLE_S if self._pool else None

    def forget(self, connection: int) -> None:
        """``connection`` closed: what it did not return is never reused."""
        for key in [key for key in self._lent if key[0] == connection]:
            self._drop(self._lent.pop(key))

    @staticmethod
    def _drop(kept: _Kept) -> None:
        os.close(kept.fd)  # the mapping goes with the last reference to it

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
