"""The gateway's inbound segments: lent to the trainer that takes a message, returned
once its mapping is gone, and reused for a later body of the same job and size only
(wangate.delivery.segments; proto/localapi.md, "Shared-memory segments")."""

from __future__ import annotations

import fcntl
import gc
import os

import pytest

from wangate.delivery import segments as segments_module
from wangate.delivery.segments import InboundSegments
from wangate.shm import F_SEAL_FUTURE_WRITE

from .test_localapi_segments import is_open

SIZE = 8192


def delivered(
    segments: InboundSegments, connection: int, job: str = "a", fill: int = 1
) -> tuple[memoryview, int, int]:
    """A body of SIZE written for ``job`` and lent to ``connection``: (body, the
    descriptor handed over, its segment id)."""
    body = segments.allocate(SIZE, 0, job)
    assert isinstance(body, memoryview)
    body[:] = bytes([fill]) * SIZE
    fd, segment_id = segments.lend(body, connection, job)
    assert fd is not None
    return body, fd, segment_id


def test_a_returned_segment_holds_the_next_body_of_its_job_and_size() -> None:
    segments = InboundSegments(min_bytes=4096)
    body, fd, segment_id = delivered(segments, connection=7)
    assert segment_id == 1
    assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & F_SEAL_FUTURE_WRITE  # sealed as ever
    os.close(fd)  # what the local API does once the trainer has its own descriptor
    mapping = body.obj
    del body
    assert segments.counts() == {
        "made": 1,
        "reused": 0,
        "live": 1,
        "lent": 1,
        "pooled": 0,
        "pooled_bytes": 0,
    }
    segments.returned(7, [segment_id], 0.0)
    assert segments.counts()["pooled"] == 1 and segments.counts()["pooled_bytes"] == SIZE
    again = segments.allocate(SIZE, 0, "a")
    assert isinstance(again, memoryview) and again.obj is mapping
    assert bytes(again[:4]) == b"\x01\x01\x01\x01"  # the old bytes, until written over
    again[:] = b"\x02" * SIZE  # the gateway's own mapping still writes, sealed or not
    fd, second_id = segments.lend(again, 7, "a")
    assert fd is not None and second_id == 2
    handed = os.pread(fd, SIZE, 0)
    assert handed == b"\x02" * SIZE  # what the next trainer maps
    os.close(fd)
    assert segments.counts() == {
        "made": 1,
        "reused": 1,
        "live": 1,
        "lent": 1,
        "pooled": 0,
        "pooled_bytes": 0,
    }


@pytest.mark.parametrize(("job", "size"), [("b", SIZE), ("a", SIZE + 64), (None, SIZE)])
def test_no_other_job_or_size_and_no_unknown_job_gets_it(job: str | None, size: int) -> None:
    segments = InboundSegments(min_bytes=4096)
    body, fd, segment_id = delivered(segments, connection=1, job="a")
    os.close(fd)
    segments.returned(1, [segment_id], 0.0)
    other = segments.allocate(size, 0, job)
    assert isinstance(other, memoryview) and other.obj is not body.obj
    assert (segments.made, segments.reused, segments.counts()["pooled"]) == (2, 0, 1)


def test_only_the_connection_it_was_lent_to_returns_it() -> None:
    segments = InboundSegments(min_bytes=4096)
    _, fd, segment_id = delivered(segments, connection=1)
    os.close(fd)
    segments.returned(2, [segment_id], 0.0)  # another trainer's connection: ignored
    segments.returned(1, [segment_id + 1, 99], 0.0)  # never lent: ignored
    assert segments.counts()["lent"] == 1 and segments.counts()["pooled"] == 0
    segments.returned(1, [segment_id, segment_id], 0.0)  # once is what counts
    assert segments.counts()["lent"] == 0 and segments.counts()["pooled"] == 1


def test_a_closed_connection_s_segments_are_never_reused() -> None:
    segments = InboundSegments(min_bytes=4096)
    body, fd, segment_id = delivered(segments, connection=1)
    kept_fd = segments._lent[(1, segment_id)].fd
    _, fd_two, _ = delivered(segments, connection=2)
    segments.forget(1)
    assert not is_open(kept_fd)
    assert segments.counts()["lent"] == 1  # connection 2's
    segments.returned(1, [segment_id], 0.0)
    assert segments.counts()["pooled"] == 0
    for handed in (fd, fd_two):
        os.close(handed)
    del body
    gc.collect()
    assert segments.live == 1  # connection 2's, still lent


def test_a_body_whose_first_bytes_named_another_job_is_not_lent() -> None:
    segments = InboundSegments(min_bytes=4096)
    _, fd, segment_id = delivered(segments, connection=1, job="a")
    os.close(fd)
    segments.returned(1, [segment_id], 0.0)
    body = segments.allocate(SIZE, 0, "a")  # job a's segment ...
    fd, segment_id = segments.lend(body, 1, "b")  # ... for a body that says job b
    assert fd is not None and segment_id == 0
    os.close(fd)
    assert segments.counts()["lent"] == 0


def test_a_body_allocated_not_knowing_its_job_is_not_lent() -> None:
    segments = InboundSegments(min_bytes=4096)
    body = segments.allocate(SIZE, None, None)  # its first bytes came later (or a worker's)
    assert isinstance(body, memoryview)
    fd, segment_id = segments.lend(body, 1, "a")
    assert fd is not None and segment_id == 0
    os.close(fd)
    assert segments.counts()["lent"] == 0


def test_the_pool_keeps_the_newest_within_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments_module, "MAX_POOLED_SEGMENTS", 2)
    segments = InboundSegments(min_bytes=4096)
    lent = [delivered(segments, connection=1, fill=n) for n in range(3)]
    kept_fds = [segments._lent[(1, segment_id)].fd for _, _, segment_id in lent]
    for _, fd, _ in lent:
        os.close(fd)
    segments.returned(1, [segment_id for _, _, segment_id in lent], 0.0)
    assert segments.counts()["pooled"] == 2
    assert [is_open(fd) for fd in kept_fds] == [False, True, True]  # the oldest went
    assert segments.allocate(SIZE, 0, "a").obj is lent[2][0].obj  # the newest first
    monkeypatch.setattr(segments_module, "MAX_POOLED_BYTES", SIZE - 1)
    segments.returned(1, [], 0.0)
    assert segments.counts()["pooled"] == 0


def test_lent_segments_are_capped_the_oldest_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments_module, "MAX_LENT_SEGMENTS", 2)
    segments = InboundSegments(min_bytes=4096)
    lent = [delivered(segments, connection=1) for _ in range(3)]
    for _, fd, _ in lent:
        os.close(fd)
    assert sorted(segment_id for (_, segment_id) in segments._lent) == [2, 3]
    segments.returned(1, [1, 2, 3], 0.0)
    assert segments.counts()["pooled"] == 2


def test_at_the_live_cap_a_pooled_segment_makes_room_for_a_fresh_one() -> None:
    segments = InboundSegments(min_bytes=4096, max_live=1)
    body, fd, segment_id = delivered(segments, connection=1, job="a")
    os.close(fd)
    segments.returned(1, [segment_id], 0.0)
    del body
    other = segments.allocate(SIZE, 0, "b")  # not job a's: the pooled one goes first
    assert isinstance(other, memoryview)
    assert segments.counts()["pooled"] == 0 and segments.live == 1
    assert isinstance(segments.allocate(SIZE, 0, "b"), bytearray)  # nothing left to drop


def test_a_returned_segment_not_reused_within_the_idle_time_is_let_go() -> None:
    segments = InboundSegments(min_bytes=4096)
    first, fd, first_id = delivered(segments, connection=1, fill=1)
    os.close(fd)
    second, fd, second_id = delivered(segments, connection=1, fill=2)
    os.close(fd)
    kept = [segments._lent[(1, i)].fd for i in (first_id, second_id)]
    del first, second
    segments.returned(1, [first_id], 10.0)
    segments.returned(1, [second_id], 11.0)
    idle_s = segments_module.POOL_IDLE_S
    assert segments.expire(10.0 + idle_s - 0.001) == 10.0 + idle_s  # nothing due yet
    assert segments.expire(10.0 + idle_s) == 11.0 + idle_s
    assert [is_open(fd) for fd in kept] == [False, True]
    assert segments.expire(11.0 + idle_s) is None
    assert segments.counts()["pooled"] == 0 and not is_open(kept[1])
    gc.collect()
    assert segments.live == 0
