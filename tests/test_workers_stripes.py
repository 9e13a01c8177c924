"""The stripe planner, the stripe reassembly (wangate.workers.stripes) and a sent
message's confirmations (wangate.workers.sending), no processes."""

from __future__ import annotations

import random
import zlib

import pytest

from wangate.checksum import crc32_combine
from wangate.core.message import MessageHeader
from wangate.errors import RemoteProtocolError
from wangate.workers.channel import UNKNOWN_HOLDER
from wangate.workers.sending import OutMessage
from wangate.workers.stripes import (
    DESCRIPTOR_BYTES,
    STRIPE_BYTES,
    Added,
    StripeDescriptor,
    StripeReassembly,
    assign_workers,
    refuse_stripes,
    stripe_crc,
    stripe_ranges,
)

MiB = 1 << 20


def test_stripes_cover_the_payload_exactly_once() -> None:
    assert stripe_ranges(10 * MiB, 4 * MiB) == [
        (0, 4 * MiB),
        (4 * MiB, 4 * MiB),
        (8 * MiB, 2 * MiB),
    ]
    assert stripe_ranges(8 * MiB, 4 * MiB) == [(0, 4 * MiB), (4 * MiB, 4 * MiB)]
    assert stripe_ranges(1, 4 * MiB) == [(0, 1)]
    assert stripe_ranges(0) == [(0, 0)]  # an empty message still travels
    assert stripe_ranges(STRIPE_BYTES + 1) == [(0, STRIPE_BYTES), (STRIPE_BYTES, 1)]
    with pytest.raises(ValueError):
        stripe_ranges(5, 0)


def test_stripes_go_to_the_worker_with_the_fewest_bytes_queued() -> None:
    # worker 1 holds 6 MiB, worker 2 nothing: 2 gets the first two, then they alternate
    assert assign_workers([4 * MiB] * 4, {1: 6 * MiB, 2: 0}, [1, 2]) == [2, 2, 1, 2]
    # a tie goes to the lower index; workers not listed (the critical one) get nothing
    assert assign_workers([MiB, MiB, MiB], {0: 0, 1: 0, 2: 0}, [1, 2]) == [1, 2, 1]
    # empty stripes still count, so they spread too
    assert assign_workers([0, 0], {}, [1, 2]) == [1, 2]
    with pytest.raises(ValueError):
        assign_workers([1], {}, [])


def test_a_descriptor_round_trips_ahead_of_the_meta() -> None:
    descriptor = StripeDescriptor(
        instance=7, msg_id=3, offset=4 * MiB, total=10 * MiB, checksum=0xDEADBEEF
    )
    meta = descriptor.encode(b"tensor-meta")
    assert len(meta) == DESCRIPTOR_BYTES + len(b"tensor-meta") == 51
    assert meta.hex()[:16] == b"WGS1".hex() + "00000000"
    assert StripeDescriptor.decode(meta, 4 * MiB) == (descriptor, b"tensor-meta")
    assert StripeDescriptor.decode(meta, 6 * MiB)[0].offset == 4 * MiB  # ends exactly at total


def test_a_descriptor_that_does_not_fit_is_the_peers_error() -> None:
    descriptor = StripeDescriptor(1, 1, 8, 10, 0)
    with pytest.raises(RemoteProtocolError, match="runs past the message's 10 bytes"):
        StripeDescriptor.decode(descriptor.encode(b""), 3)
    with pytest.raises(RemoteProtocolError, match="is not a stripe"):
        StripeDescriptor.decode(b"X" * DESCRIPTOR_BYTES, 0)
    with pytest.raises(RemoteProtocolError, match="shorter than a stripe descriptor"):
        StripeDescriptor.decode(b"WGS1", 0)


def _stripes(payload: bytes, size: int, msg_id: int = 1) -> list[tuple[StripeDescriptor, bytes]]:
    checksum = zlib.crc32(payload, zlib.crc32(b"m"))
    return [
        (
            StripeDescriptor(9, msg_id, offset, len(payload), checksum),
            payload[offset : offset + length],
        )
        for offset, length in stripe_ranges(len(payload), size)
    ]


def test_stripes_in_any_order_with_duplicates_make_the_message_once() -> None:
    payload = random.Random(5).randbytes(1000)
    stripes = _stripes(payload, 300)  # 300, 300, 300, 100
    order = [3, 1, 1, 0, 3, 2]  # out of order, two duplicates
    reassembly: StripeReassembly[bytearray] = StripeReassembly()
    buffer = bytearray(len(payload))
    results = []
    for index in order:
        descriptor, part = stripes[index]
        added = reassembly.add(("sh", 9, 1), descriptor, len(part), zlib.crc32(part), buffer)
        if added is not Added.DUPLICATE:
            buffer[descriptor.offset : descriptor.offset + len(part)] = part
        results.append(added)
    partial, duplicate, complete = Added.PARTIAL, Added.DUPLICATE, Added.COMPLETE
    assert results == [partial, partial, duplicate, partial, duplicate, complete]
    assert bytes(buffer) == payload
    context, crc = reassembly.finish(("sh", 9, 1), zlib.crc32(b"m"))
    assert context is buffer
    assert crc == zlib.crc32(payload, zlib.crc32(b"m")) == stripes[0][0].checksum
    # a stripe of it arriving after it was delivered is a duplicate, not a new message
    descriptor, part = stripes[2]
    assert not reassembly.is_new(("sh", 9, 1))
    assert reassembly.add(("sh", 9, 1), descriptor, 300, 0, bytearray()) is Added.DUPLICATE
    assert len(reassembly) == 0


def test_messages_of_two_instances_with_one_id_are_two_messages() -> None:
    reassembly: StripeReassembly[str] = StripeReassembly()
    one = StripeDescriptor(1, 5, 0, 4, 0)
    assert reassembly.add(("sh", 1, 5), one, 4, 0, "a") is Added.COMPLETE
    reassembly.finish(("sh", 1, 5), 0)
    assert reassembly.is_new(("sh", 2, 5))
    assert (
        reassembly.add(("sh", 2, 5), StripeDescriptor(2, 5, 0, 4, 0), 4, 0, "b") is Added.COMPLETE
    )


def test_an_empty_message_is_complete_with_its_one_stripe() -> None:
    reassembly: StripeReassembly[None] = StripeReassembly()
    assert reassembly.add("k", StripeDescriptor(1, 1, 0, 0, 0), 0, 0, None) is Added.COMPLETE
    assert reassembly.finish("k", 0x1234) == (None, 0x1234)


def test_contradicting_stripes_are_the_peers_error() -> None:
    reassembly: StripeReassembly[None] = StripeReassembly()
    reassembly.add("k", StripeDescriptor(1, 1, 0, 10, 0), 4, 0, None)
    with pytest.raises(RemoteProtocolError, match="says 12 bytes, an earlier one said 10"):
        reassembly.add("k", StripeDescriptor(1, 1, 4, 12, 0), 4, 0, None)
    with pytest.raises(RemoteProtocolError, match=r"overlaps \[0, 4\)"):
        reassembly.add("k", StripeDescriptor(1, 1, 2, 10, 0), 4, 0, None)
    with pytest.raises(RemoteProtocolError, match="differ in length"):
        reassembly.add("k", StripeDescriptor(1, 1, 0, 10, 0), 3, 0, None)
    assert reassembly.drop("k") is None
    assert reassembly.add("k", StripeDescriptor(1, 1, 4, 10, 0), 6, 0, None) is Added.DUPLICATE


def test_completed_messages_are_remembered_up_to_a_bound() -> None:
    reassembly: StripeReassembly[None] = StripeReassembly(max_done=2)
    for msg_id in (1, 2, 3):
        reassembly.add(msg_id, StripeDescriptor(1, msg_id, 0, 1, 0), 1, 0, None)
        reassembly.finish(msg_id, 0)
    assert reassembly.is_new(1) and not reassembly.is_new(2) and not reassembly.is_new(3)


def test_a_stripes_own_crc_comes_from_its_checksum_without_a_pass() -> None:
    rng = random.Random(1)
    for length in (0, 1, 1452, 4 * MiB + 3):
        part = rng.randbytes(length)
        meta = rng.randbytes(rng.randrange(0, 100))
        checksum = zlib.crc32(part, zlib.crc32(meta))
        assert stripe_crc(checksum, zlib.crc32(meta), length) == zlib.crc32(part)
        assert crc32_combine(zlib.crc32(meta), zlib.crc32(part), length) == checksum


def test_a_message_without_new_stripes_for_long_is_idle_and_dropped() -> None:
    reassembly: StripeReassembly[str] = StripeReassembly()
    reassembly.add("old", StripeDescriptor(1, 1, 0, 10, 0), 4, 0, "a", now=100.0)
    reassembly.add("new", StripeDescriptor(1, 2, 0, 10, 0), 4, 0, "b", now=150.0)
    reassembly.add("old", StripeDescriptor(1, 1, 0, 10, 0), 4, 0, "a", now=155.0)  # duplicate
    assert reassembly.idle(160.0, 60.0) == ["old"]  # a duplicate is not progress
    assert reassembly.drop("old") == "a"
    assert reassembly.idle(210.0, 60.0) == ["new"] and len(reassembly) == 1


def test_a_gateway_without_workers_refuses_stripes_and_nothing_else() -> None:
    def header(meta: bytes) -> MessageHeader:
        return MessageHeader("grad", 3, False, 0, meta)

    reason = refuse_stripes(header(StripeDescriptor(7, 1, 0, 10, 0).encode(b"codec meta")))
    assert reason == (
        "it is a stripe of a gateway with worker processes ([workers] count >= 2) and "
        "this gateway runs none: both sites of a pair must set the same [workers] count"
    )
    assert refuse_stripes(header(b"")) is None
    assert refuse_stripes(header(b"WGS1")) is None  # too short to be a stripe's
    assert refuse_stripes(header(b"WGF1" + bytes(60))) is None


def test_a_message_whose_stripes_reached_two_instances_of_the_peer_is_not_delivered() -> None:
    message = OutMessage("sh", 1, "g", 0, False, 3 * STRIPE_BYTES, 0.0, None, None, left=3)
    assert message.reached(UNKNOWN_HOLDER)  # its worker had not heard the peer yet
    assert message.holder == UNKNOWN_HOLDER
    assert message.reached(0x51)  # the first instance known had the next
    assert message.holder == 0x51
    assert message.reached(0x51)
    assert message.reached(UNKNOWN_HOLDER)
    # the peer restarted between two stripes: the new one cannot make the message whole
    assert not message.reached(0x52)
    assert message.holder == 0x51
