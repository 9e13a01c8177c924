"""PathChannel.read: a channel reads its own socket in batches (recvmmsg), opens each
packet where it lies, and hands back what is not its own untouched, with its sender."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from tests.test_engine_channel import Pair, _sealed_by_a, datagrams

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
    assert pair.b.read(pair.now) == (sent, [], [], BATCH, BATCH)
    assert pair.b.read(pair.now) == ([], [], [], 0, 0)  # nothing waiting: no block, no error
    assert pair.b.stats()["datagrams_received"] == BATCH
    pair.now += 0.002
    assert pair.b.flush(pair.now) == 1  # the batch is acknowledged like any other packets
    assert pair.a.read(pair.now) == ([], [], [], 1, 1)
    assert pair.a.stats()["acked_packets"] == BATCH


def test_more_than_a_batch_is_read_in_batches(pair: Pair) -> None:
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    try:
        sent = [i.to_bytes(2, "big") * 600 for i in range(100)]
        for datagram in sent:
            other.sendto(datagram, pair.socks[1].getsockname())
        first, second = pair.b.read(pair.now), pair.b.read(pair.now)
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
        got, foreign, errors, count, packets = pair.b.read(pair.now)
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
    got, foreign, errors, count, packets = pair.b.read(pair.now)
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
        assert pair.b.read(pair.now)[1][0][0] == big
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
        pair.b.read(pair.now)
    assert pair.b.read(pair.now) == ([], [], [], 0, 0)  # reported once, then serving
