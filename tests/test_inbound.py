"""Idle expiry of partially received messages (wangate.core.inbound).

A sender may abandon a message half sent; the receiver must not hold its bytes and its
credit forever. These tests drive ``Reassembly`` with a fake clock and real frames.
"""

from __future__ import annotations

import math
import random
from collections import deque

import pytest

from wangate.core.coding import CodingShape
from wangate.core.events import Event, MessageDropped, MessageReceived
from wangate.core.fec import BlockEncoder
from wangate.core.frames import (
    REJECT_EXPIRED,
    REJECT_MALFORMED,
    ControlStreamDecoder,
    MessageRejected,
    RepairDatagram,
    ShardDatagram,
    encode_control,
)
from wangate.core.inbound import DEFAULT_IDLE_TIMEOUT_S, Reassembly
from wangate.core.message import MessageHeader, message_checksum
from wangate.errors import LocalProtocolError

MAX_MESSAGE = 1 << 16
WINDOW = 1 << 18


def make_body(size_bytes: int, seed: int) -> bytes:
    # header: the 21-byte fixed head, job "default", tag "t"
    payload = random.Random(seed).randbytes(size_bytes - 29)
    body = MessageHeader("t", 1, False, message_checksum(b"", payload), b"").encode() + payload
    assert len(body) == size_bytes
    return body


def shard(msg_id: int, body: bytes, start: int, end: int) -> ShardDatagram:
    return ShardDatagram(0, 0, msg_id, len(body), start, body[start:end])


def repair(msg_id: int, body: bytes, shape: CodingShape, block: int, index: int) -> RepairDatagram:
    encoder = BlockEncoder(shape.block_k(block), shape.symbol_bytes)
    for i in range(shape.block_k(block)):
        lo, hi = shape.symbol_range(block, i)
        encoder.add_source(i, body[lo:hi])
    data = encoder.repair(index)
    return RepairDatagram(0, 0, msg_id, len(body), block, index, shape.k, shape.symbol_bytes, data)


def reassembly(**kwargs: float) -> tuple[Reassembly, deque[Event]]:
    events: deque[Event] = deque()
    return Reassembly(MAX_MESSAGE, WINDOW, events, **kwargs), events


def before(t: float) -> float:
    return math.nextafter(t, -math.inf)


def test_a_partial_message_expires_at_its_idle_timeout_and_not_a_moment_before() -> None:
    inbound, events = reassembly()
    body = make_body(1000, seed=1)
    assert inbound.accept_shard(shard(3, body, 0, 300), 100.0)
    deadline = 100.0 + DEFAULT_IDLE_TIMEOUT_S
    assert inbound.next_expiry() == deadline

    inbound.expire(before(deadline))
    assert 3 in inbound.inbound
    assert inbound.held_bytes == 1000
    assert not inbound.rejections and not events

    inbound.expire(deadline)
    assert 3 not in inbound.inbound
    assert 3 in inbound.rejected
    assert inbound.next_expiry() is None


def test_new_bytes_and_new_repair_symbols_reset_the_clock_duplicates_do_not() -> None:
    inbound, _ = reassembly(idle_timeout_s=10.0)
    body = make_body(1000, seed=2)
    shape = CodingShape(len(body), 100, 4)  # 3 blocks: [0,400) [400,800) [800,1000)
    msg = 5

    assert inbound.accept_shard(shard(msg, body, 0, 100), 1.0)  # created
    assert inbound.next_expiry() == 11.0
    assert inbound.accept_shard(shard(msg, body, 100, 150), 4.0)  # new bytes
    assert inbound.next_expiry() == 14.0
    assert inbound.accept_shard(shard(msg, body, 120, 150), 6.0)  # nothing new
    assert inbound.next_expiry() == 14.0
    assert inbound.accept_repair(repair(msg, body, shape, 1, 4), 9.0)  # stored
    assert inbound.next_expiry() == 19.0
    assert inbound.accept_repair(repair(msg, body, shape, 1, 4), 12.0)  # duplicate
    assert inbound.next_expiry() == 19.0
    assert inbound.accept_repair(repair(msg, body, shape, 0, 5), 15.0)  # another block
    assert inbound.next_expiry() == 25.0
    assert inbound.accept_shard(shard(msg, body, 800, 1000), 16.0)  # block 2 complete
    assert inbound.next_expiry() == 26.0
    assert inbound.accept_repair(repair(msg, body, shape, 2, 2), 20.0)  # block covered
    assert inbound.next_expiry() == 26.0
    assert inbound.blocks_decoded == 0

    inbound.expire(before(26.0))
    assert msg in inbound.inbound
    inbound.expire(26.0)
    assert msg not in inbound.inbound


def test_expiry_returns_the_bytes_and_the_credit_exactly_once() -> None:
    inbound, events = reassembly()
    partial = make_body(1000, seed=3)
    whole = make_body(700, seed=4)
    assert inbound.accept_shard(shard(1, partial, 0, 300), 0.0)
    assert inbound.accept_shard(shard(1, partial, 500, 600), 0.0)
    assert inbound.accept_shard(shard(2, whole, 0, 700), 0.0)  # delivered, not consumed
    assert [type(e) for e in events] == [MessageReceived]
    assert (inbound.held_bytes, inbound.consumed_bytes) == (1700, 0)

    inbound.expire(DEFAULT_IDLE_TIMEOUT_S)
    assert (inbound.held_bytes, inbound.consumed_bytes) == (700, 1000)

    # late shards of the expired message: acknowledged, not stored, not re-admitted
    assert inbound.accept_shard(shard(1, partial, 300, 500), 61.0)
    assert inbound.accept_repair(repair(1, partial, CodingShape(1000, 100, 4), 0, 4), 61.0)
    assert inbound.inbound == {}
    assert inbound.next_expiry() is None
    inbound.expire(1e9)
    assert (inbound.held_bytes, inbound.consumed_bytes) == (700, 1000)

    inbound.release(700)  # the trainer took the delivered one
    assert (inbound.held_bytes, inbound.consumed_bytes) == (0, 1700)


def test_the_sender_is_told_once_with_code_4_and_the_reason() -> None:
    inbound, events = reassembly(idle_timeout_s=2.5)
    body = make_body(1000, seed=5)
    assert inbound.accept_shard(shard(9, body, 0, 300), 0.0)
    assert inbound.accept_shard(shard(9, body, 600, 650), 0.0)
    events.clear()

    inbound.expire(2.5)
    reason = "no data for 2.5 s: abandoned by its sender? (350 of 1000 bytes received)"
    assert list(inbound.rejections) == [MessageRejected(9, 4, reason)]
    assert list(events) == [MessageDropped(9, reason, REJECT_EXPIRED)]

    inbound.accept_shard(shard(9, body, 300, 600), 3.0)
    inbound.expire(100.0)
    assert len(inbound.rejections) == 1 and len(events) == 1
    assert inbound.take_done(10) == ()  # rejected, never confirmed as done

    # on the wire: code u16 4 after the message id, then the reason
    raw = encode_control(inbound.rejections.popleft())
    assert raw[5:15] == (9).to_bytes(8, "big") + REJECT_EXPIRED.to_bytes(2, "big")
    assert raw[15:] == reason.encode()
    assert ControlStreamDecoder().feed(raw) == [MessageRejected(9, 4, reason)]


def test_a_complete_message_is_never_expired() -> None:
    inbound, events = reassembly(idle_timeout_s=1.0)
    body = make_body(500, seed=6)
    assert inbound.accept_shard(shard(4, body, 0, 200), 0.0)
    assert inbound.accept_shard(shard(4, body, 200, 500), 0.5)
    assert [type(e) for e in events] == [MessageReceived]
    assert inbound.next_expiry() is None

    inbound.expire(1e9)
    assert not inbound.rejections
    assert 4 in inbound.completed and 4 not in inbound.rejected
    assert (inbound.held_bytes, inbound.consumed_bytes) == (500, 0)
    assert inbound.take_done(10) == (4,)
    assert inbound.accept_shard(shard(4, body, 0, 1), 2e9)  # asked again: done once more
    assert inbound.take_done(10) == (4,)


def test_next_expiry_follows_the_least_recently_progressed_message() -> None:
    inbound, _ = reassembly(idle_timeout_s=10.0)
    bodies = {msg: make_body(400, seed=msg) for msg in (1, 2, 3)}
    assert inbound.next_expiry() is None
    inbound.accept_shard(shard(1, bodies[1], 0, 10), 0.0)
    inbound.accept_shard(shard(2, bodies[2], 0, 10), 1.0)
    inbound.accept_shard(shard(3, bodies[3], 0, 10), 2.0)
    assert inbound.next_expiry() == 10.0
    inbound.accept_shard(shard(1, bodies[1], 10, 20), 3.0)  # 1 is now the most recent
    assert inbound.next_expiry() == 11.0
    inbound.accept_shard(shard(2, bodies[2], 10, 400), 4.0)  # 2 completes
    assert inbound.next_expiry() == 12.0

    inbound.expire(12.0)
    assert list(inbound.inbound) == [1]
    assert inbound.next_expiry() == 13.0
    inbound.expire(13.0)
    assert inbound.next_expiry() is None
    assert [r.msg_id for r in inbound.rejections] == [3, 1]


def test_next_expiry_and_expire_match_a_plain_model_under_random_traffic() -> None:
    rng = random.Random(11)
    timeout = 7.0
    inbound, _ = reassembly(idle_timeout_s=timeout)
    bodies = {msg: make_body(rng.randrange(40, 200), seed=msg) for msg in range(1, 130)}
    progressed: dict[int, float] = {}  # the model: message -> last time new bytes came
    have: dict[int, set[int]] = {msg: set() for msg in bodies}
    cursor = dict.fromkeys(bodies, 0)  # the sender sends each message in order...
    expired: set[int] = set()
    released = 0
    now = 0.0
    for step in range(2000):
        now += rng.choice((0.0, 0.125, 0.25, 0.5, 2.0))
        if rng.random() < 0.2:
            inbound.expire(now)
            for msg, at in list(progressed.items()):
                if now >= at + timeout:
                    del progressed[msg]
                    expired.add(msg)
                    released += len(bodies[msg])
        else:
            # ...from a sliding set of six; one in five it abandons half sent
            msg = 1 + step // 20 + rng.randrange(6)
            body = bodies[msg]
            abandoned = msg % 5 == 0 and cursor[msg] >= len(body) // 2
            if abandoned or rng.random() < 0.2:  # a duplicate (or what the sender resends)
                start = rng.randrange(max(1, cursor[msg]))
            else:
                start = cursor[msg] % len(body)
            end = min(len(body), start + rng.randrange(1, 60))
            cursor[msg] = max(cursor[msg], end)
            assert inbound.accept_shard(shard(msg, body, start, end), now)
            done = len(have[msg]) == len(body)
            if msg not in expired and not done:
                new = set(range(start, end)) - have[msg]
                if new or msg not in progressed:
                    progressed[msg] = now
                have[msg] |= new
                if len(have[msg]) == len(body):
                    del progressed[msg]
        expected = min(progressed.values()) + timeout if progressed else None
        assert inbound.next_expiry() == expected
        assert set(inbound.inbound) == set(progressed)
        times = [progressed[m] for m in inbound.inbound]  # the next to expire comes first
        assert times == sorted(times)
    delivered = sum(len(have[m]) == len(bodies[m]) for m in bodies if m not in expired)
    assert len(expired) >= 10 and delivered >= 10  # both outcomes were exercised
    assert inbound.messages_received == delivered
    assert inbound.consumed_bytes == released
    assert inbound.held_bytes == sum(len(bodies[m]) for m in have if have[m]) - released
    assert sorted(r.msg_id for r in inbound.rejections) == sorted(expired)  # each once


def test_idle_timeout_must_be_a_positive_finite_number_of_seconds() -> None:
    assert reassembly()[0].idle_timeout_s == 60.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(LocalProtocolError, match="idle timeout"):
            reassembly(idle_timeout_s=bad)


def test_a_whole_message_the_screen_refuses_is_rejected_with_its_reason() -> None:
    events: deque[Event] = deque()
    seen: list[MessageHeader] = []

    def screen(header: MessageHeader) -> str | None:
        seen.append(header)
        return "not for this gateway" if header.step == 1 else None

    inbound = Reassembly(MAX_MESSAGE, WINDOW, events, screen=screen)
    body = make_body(500, seed=7)  # step 1
    assert inbound.accept_shard(shard(3, body, 0, 500), 0.0)
    assert [h.step for h in seen] == [1]
    assert list(events) == [MessageDropped(3, "not for this gateway", REJECT_MALFORMED)]
    assert list(inbound.rejections) == [
        MessageRejected(3, REJECT_MALFORMED, "not for this gateway")
    ]
    assert (inbound.held_bytes, inbound.take_done(10)) == (0, ())
    assert 3 in inbound.rejected and 3 not in inbound.completed
