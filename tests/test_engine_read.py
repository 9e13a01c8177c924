"""PathChannel.read: a channel reads its own socket in batches (recvmmsg), opens each
packet where it lies, and hands back what is not its own untouched, with its sender."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator

import pytest

from tests.test_engine_channel import Pair, _sealed_by_a, datagrams, read_lists
from tests.test_shard_placing import MSG, shard
from wangate.core.datagrams import encode_probe
from wangate.engine import ReadDatagrams
from wangate.engine._engine import place_shards
from wangate.errors import LocalProtocolError

BATCH = 64  # WG_READ_BATCH


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def send_all(pair: Pair, sent: list[bytes]) -> None:
    for datagram in sent:
        assert pair.a.queue(datagram) is True
    assert pair.a.flush(pair.now) == len(sent)


def test_a_batch_is_read_whole_in_order_and_acknowledged(pair: Pair) -> None:
    sent = datagrams(BATCH, pair.a.datagram_bytes, seed=7)
    send_all(pair, sent)
    assert read_lists(pair.b, pair.now) == (sent, [], [], BATCH, BATCH)
    assert read_lists(pair.b, pair.now) == ([], [], [], 0, 0)  # nothing waiting: no block, no error
    assert pair.b.stats()["datagrams_received"] == BATCH
    pair.now += 0.002
    assert pair.b.flush(pair.now) == 1  # the batch is acknowledged like any other packets
    assert read_lists(pair.a, pair.now) == ([], [], [], 1, 1)
    assert pair.a.stats()["acked_packets"] == BATCH


def test_more_than_a_batch_is_read_in_batches(pair: Pair) -> None:
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    try:
        sent = [i.to_bytes(2, "big") * 600 for i in range(100)]
        for datagram in sent:
            other.sendto(datagram, pair.socks[1].getsockname())
        first, second = read_lists(pair.b, pair.now), read_lists(pair.b, pair.now)
        sender = other.getsockname()
        assert first == ([], [(d, sender) for d in sent[:BATCH]], [], BATCH, BATCH)
        assert second == ([], [(d, sender) for d in sent[BATCH:]], [], 100 - BATCH, 100 - BATCH)
    finally:
        other.close()


def test_what_is_not_the_channels_comes_back_untouched_with_its_sender(pair: Pair) -> None:
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    try:
        b_addr = pair.socks[1].getsockname()
        long_header = b"\xc0" + os.urandom(1250)  # a handshake packet, aioquic's
        not_ours = b"\x40" + bytes(8) + os.urandom(40)  # a short header, another ID
        other.sendto(long_header, b_addr)
        send_all(pair, [b"data"])
        other.sendto(not_ours, b_addr)
        other.sendto(b"", b_addr)
        got, foreign, errors, count, packets = read_lists(pair.b, pair.now)
        sender = other.getsockname()
        assert got == [b"data"] and errors == [] and count == packets == 4
        assert foreign == [(long_header, sender), (not_ours, sender), (b"", sender)]
    finally:
        other.close()


def test_forged_replayed_and_bad_packets_are_dropped_and_the_rest_kept(pair: Pair) -> None:
    b_addr = pair.socks[1].getsockname()
    a_sock = pair.socks[0]
    good = _sealed_by_a(bytes([0x31, 3]) + b"abc", 0)
    forged = bytearray(_sealed_by_a(bytes([0x31, 3]) + b"xyz", 1))
    forged[-1] ^= 1  # fails the AEAD
    unknown_frame = _sealed_by_a(bytes([0x1F]) + b"junk", 2)
    never_sent = _sealed_by_a(bytes([0x02, 50, 0, 0, 50]), 3)  # ACK of packets b never sent
    two = _sealed_by_a(bytes([0x31, 1]) + b"d" + bytes([0x30]) + b"ef", 4)
    for packet in (good, bytes(forged), good, unknown_frame, never_sent, two):
        a_sock.sendto(packet, b_addr)
    got, foreign, errors, count, packets = read_lists(pair.b, pair.now)
    assert count == packets == 6 and foreign == []  # the dropped ones counted too
    assert got == [b"abc", b"d", b"ef"]  # the replay and the forgery dropped
    assert errors == [
        "malformed frames in a data-plane packet",
        "an ACK of a packet never sent (RFC 9000 §13.1)",
    ]
    stats = pair.b.stats()
    assert stats["replayed"] == 1 and stats["not_opened"] == 1


def test_jumbo_datagrams_are_never_truncated() -> None:
    pair = Pair()
    try:
        other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        big = os.urandom(65507)  # the largest UDP payload over IPv4
        other.sendto(big, pair.socks[1].getsockname())
        other.close()
        assert read_lists(pair.b, pair.now)[1][0][0] == big
    finally:
        pair.close()


def test_a_socket_error_is_an_os_error(pair: Pair) -> None:
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    pair.socks[1].connect(("127.0.0.1", port))
    pair.socks[1].send(b"to nobody")  # loopback answers with ICMP port unreachable
    with pytest.raises(ConnectionRefusedError):
        read_lists(pair.b, pair.now)
    assert read_lists(pair.b, pair.now) == ([], [], [], 0, 0)  # reported once, then serving


def test_a_reads_datagrams_stay_where_they_were_read_until_the_next_read(pair: Pair) -> None:
    sent = datagrams(3, pair.a.datagram_bytes, seed=11)
    send_all(pair, sent)
    got, foreign, errors, buffers, packets = pair.b.read(pair.now)
    assert isinstance(got, ReadDatagrams) and (foreign, errors, buffers, packets) == ([], [], 3, 3)
    assert len(got) == 3 and got[0] == sent[0] and got[-1] == sent[2] and list(got) == sent
    assert type(got[1]) is bytes
    with pytest.raises(IndexError):
        got[3]
    pair.b.read(pair.now)  # the next read reuses the buffers: these are gone
    with pytest.raises(LocalProtocolError, match="before the reader's latest read"):
        got[0]
    with pytest.raises(LocalProtocolError, match="before the reader's latest read"):
        place_shards(got, {7: bytearray(MSG)}, 0, 0)
    with pytest.raises(TypeError, match="list or ReadDatagrams"):
        place_shards(tuple(sent), {7: bytearray(MSG)}, 0, 0)  # type: ignore[arg-type]


def test_a_reads_shards_are_placed_where_they_lie_as_from_a_list(pair: Pair) -> None:
    """The same read, placed in place and as bytes: the same runs and datagrams left to
    the session, the same bodies."""
    rng = random.Random(3)
    size = pair.a.datagram_bytes - 20  # a usual shard's header is 20 bytes
    sent = [shard(1, 0, 0, b"h" * size)]  # the first: the session's
    sent += [shard(2 + i, i, size * (1 + i), rng.randbytes(size)) for i in range(20)]
    sent += [encode_probe(22, 0), shard(23, 0, size * 2, rng.randbytes(size), msg_id=8)]
    sent += [shard(24 + i, 0, size * (21 + i), rng.randbytes(size)) for i in range(3)]
    send_all(pair, sent)
    got = pair.b.read(pair.now)[0]
    as_read = {7: bytearray(MSG), 8: bytearray(MSG)}
    as_bytes = {7: bytearray(MSG), 8: bytearray(MSG)}
    by_list = place_shards(list(got), as_bytes, 0, 0)
    in_place = place_shards(got, as_read, 0, 0)
    assert in_place == by_list and as_read == as_bytes
    assert [type(item) for item in in_place] == [bytes, tuple, bytes, tuple, tuple]
    assert [run[2:4] for run in in_place if isinstance(run, tuple)] == [
        (size, size * 21),
        (size * 2, size * 3),
        (size * 21, size * 24),
    ]
    assert as_read[8] == bytes(size * 2) + sent[22][20:] + bytes(MSG - size * 3)
    assert as_read[7][size * 21 : size * 24] == b"".join(d[20:] for d in sent[23:])
    assert place_shards(got, {}, 0, 0) == sent  # nothing placeable: all as bytes
