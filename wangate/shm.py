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
descriptor or mapping frees it, so a process that dies leaks nothing. These are the
primitives every layer shares (the local API, delivery to trainers, the workers);
nothing here knows about the event loop.
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
from collections.abc import Callable, Iterable

from wangate.errors import ErrorCode, GatewayError

F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)  # Linux 5.1; not in 3.11
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
HANDED_SEALS = SIZE_SEALS | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
SEND_NAME = "wangate-send"  # what /proc/PID/fd and /proc/PID/maps show
RECV_NAME = "wangate-recv"
# Measured (bench/RESULTS.md, "Shared-memory payloads"): from here on a segment hands a
# payload over faster than the socket carries it.
SEGMENT_MIN_BYTES = 1 << 20


class SegmentError(GatewayError):
    """A descriptor that is not a usable segment (code ``bad_segment``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.BAD_SEGMENT)


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


_FORKS = [0]  # forks of this process so far: a child inherits every mapping
os.register_at_fork(after_in_parent=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


def when_unmapped(payload: memoryview, callback: Callable[[], None]) -> None:
    """Call ``callback`` once ``payload``'s mapping (``map_delivered``) is gone from
    this process: from any thread, at the collection of its last view. Not if the
    process forked meanwhile: a child may still map it."""
    forks = _FORKS[0]

    def gone() -> None:
        if _FORKS[0] == forks:
            callback()

    weakref.finalize(payload.obj, gone)


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
