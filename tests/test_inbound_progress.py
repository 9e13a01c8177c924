"""Progress of large messages on their way in (``MessageProgress``, wangate.core.inbound):
the contiguous prefix is reported once the header is in, then at each step of
max(4 MiB, size/64), never per datagram, and never for a whole message."""

from __future__ import annotations

import random
from collections import deque

from wangate.core.events import Event, MessageDropped, MessageProgress, MessageReceived
from wangate.core.frames import REJECT_CHECKSUM, ShardDatagram
from wangate.core.inbound import Reassembly, progress_step
from wangate.core.message import MessageHeader, message_checksum

MiB = 1 << 20
SIZE = 10 * MiB


def make_body(size_bytes: int, *, checksum: int | None = None) -> bytes:
    header = MessageHeader("t", 1, False, 0, b"m").encode()
    payload = random.Random(size_bytes).randbytes(size_bytes - len(header))
    crc = message_checksum(b"m", payload) if checksum is None else checksum
    return MessageHeader("t", 1, False, crc, b"m").encode() + payload


def shard(body: bytes, start: int, end: int, msg_id: int = 1) -> ShardDatagram:
    return ShardDatagram(0, 0, msg_id, len(body), start, body[start:end])


def reassembly(progress_min_bytes: float = MiB) -> tuple[Reassembly, deque[Event]]:
    events: deque[Event] = deque()
    inbound = Reassembly(16 * MiB, 64 * MiB, events)
    inbound.use_buffers(
        lambda size, start, job: bytearray(size), lambda body: None, progress_min_bytes
    )
    return inbound, events


def progress(events: deque[Event]) -> list[int]:
    return [e.ready_bytes for e in events if isinstance(e, MessageProgress)]


def test_the_step_is_4_mib_or_a_64th_of_the_message() -> None:
    assert progress_step(10 * MiB) == 4 * MiB
    assert progress_step(1 << 30) == 16 * MiB
    assert progress_step(256 * MiB + 1) == 4 * MiB + 1


def test_in_order_the_prefix_is_reported_at_the_header_then_each_step() -> None:
    body = make_body(SIZE)
    inbound, events = reassembly()
    for start in range(0, SIZE, MiB // 2):
        inbound.accept_shard(shard(body, start, start + MiB // 2), 0.0)
    assert progress(events) == [MiB // 2, MiB // 2 + 4 * MiB, MiB // 2 + 8 * MiB]
    last = events[-1]
    assert isinstance(last, MessageReceived) and bytes(last.payload) == body[30:]
    first = next(e for e in events if isinstance(e, MessageProgress))
    assert first.msg_id == 1 and bytes(first.body[:30]) == body[:30]


def test_out_of_order_only_the_contiguous_prefix_counts() -> None:
    body = make_body(SIZE)
    inbound, events = reassembly()
    inbound.accept_shard(shard(body, MiB, 6 * MiB), 0.0)  # no header yet: nothing
    inbound.accept_shard(shard(body, 7 * MiB, 8 * MiB), 0.0)
    assert progress(events) == []
    inbound.accept_shard(shard(body, 0, 10), 0.0)  # not even the fixed head
    assert progress(events) == []
    inbound.accept_shard(shard(body, 10, MiB), 0.0)  # joins [0, 6 MiB)
    assert progress(events) == [6 * MiB]
    inbound.accept_shard(shard(body, 6 * MiB, 7 * MiB), 0.0)  # 8 MiB: less than a step on
    assert progress(events) == [6 * MiB]
    inbound.accept_shard(shard(body, 8 * MiB, SIZE), 0.0)  # whole: received, no progress
    assert progress(events) == [6 * MiB]
    assert isinstance(events[-1], MessageReceived)


def test_duplicates_and_small_messages_report_nothing() -> None:
    body = make_body(SIZE)
    inbound, events = reassembly(progress_min_bytes=SIZE + 1)
    inbound.accept_shard(shard(body, 0, MiB), 0.0)
    assert progress(events) == []
    inbound, events = reassembly()
    inbound.accept_shard(shard(body, 0, MiB), 0.0)
    inbound.accept_shard(shard(body, 0, MiB), 0.0)
    inbound.accept_shard(shard(body, MiB // 2, MiB), 0.0)
    assert progress(events) == [MiB]


def test_a_message_that_fails_its_checksum_is_dropped_with_the_code() -> None:
    body = make_body(SIZE, checksum=0x1234)
    inbound, events = reassembly()
    inbound.accept_shard(shard(body, 0, SIZE - 1), 0.0)
    inbound.accept_shard(shard(body, SIZE - 1, SIZE), 0.0)
    assert progress(events) == [SIZE - 1]
    dropped = events[-1]
    assert isinstance(dropped, MessageDropped)
    assert (dropped.msg_id, dropped.code) == (1, REJECT_CHECKSUM)
    assert "checksum" in dropped.reason


def test_a_body_is_allocated_knowing_its_payload_offset_and_job_when_its_head_is_first() -> None:
    asked: list[tuple[int, int | None, str | None]] = []

    def allocate(size: int, start: int | None, job: str | None) -> bytearray:
        asked.append((size, start, job))
        return bytearray(size)

    events: deque[Event] = deque()
    inbound = Reassembly(16 * MiB, 64 * MiB, events)
    inbound.use_buffers(allocate, lambda body: None)
    header = MessageHeader("t", 1, False, 0, b"m", "llama-run3").encode()
    body = header + bytes(MiB - len(header))
    inbound.accept_shard(shard(body, 0, 1400, msg_id=1), 0.0)
    inbound.accept_shard(shard(body, 1400, 2800, msg_id=2), 0.0)  # its head not yet in
    assert asked == [(MiB, len(header), "llama-run3"), (MiB, None, None)]
