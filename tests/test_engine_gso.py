"""UDP GSO on the data plane's send path: runs of equal packets in a batch go to the
kernel as one buffer it cuts into those packets (UDP_SEGMENT); what arrives is the same
packets, in order, whatever the receiver's socket is."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.test_engine_channel import Pair, datagrams

SO_NO_CHECK = 11  # <asm-generic/socket.h>: a socket without UDP checksums cannot segment
PACKET_OVERHEAD = 13 + 16 + 1  # short header, tag, DATAGRAM frame type (proto/engine.md)


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def send(pair: Pair, sent: list[bytes]) -> None:
    for datagram in sent:
        assert pair.a.queue(datagram) is True
    assert pair.a.flush(pair.now) == len(sent)


def arrived(pair: Pair) -> list[int]:
    """The sizes of the UDP datagrams b's socket holds, in order, each one packet."""
    return [len(packet) for packet in pair.packets_to(1)]


def test_a_batch_of_full_packets_goes_as_two_buffers_and_arrives_as_its_packets(
    pair: Pair,
) -> None:
    assert pair.a.gso is True
    sent = datagrams(64, pair.a.datagram_bytes, seed=3)
    send(pair, sent)
    stats = pair.a.stats()
    assert stats["segmented_sends"] == 2  # 45 + 19 packets of 1442 bytes
    assert stats["packets_sent"] == 64 and stats["send_errors"] == 0
    assert pair.b.read(pair.now) == (sent, [], [], 64)


def test_a_shorter_packet_ends_a_run_and_small_packets_go_alone(pair: Pair) -> None:
    full = pair.a.datagram_bytes
    sizes = [full, full, full - 100, full, full, 10, 20, full]
    sent = [bytes([i]) * size for i, size in enumerate(sizes)]
    send(pair, sent)
    # runs: [full, full, shorter], [full, full], then 10 and 20 (under 1200 bytes: alone),
    # then the last full packet alone
    assert pair.a.stats()["segmented_sends"] == 2
    assert arrived(pair) == [size + PACKET_OVERHEAD for size in sizes]


def test_with_gso_off_every_packet_is_its_own_message(pair: Pair) -> None:
    pair.a.gso = False
    sent = datagrams(50, pair.a.datagram_bytes, seed=4)
    send(pair, sent)
    assert pair.a.stats()["segmented_sends"] == 0
    assert pair.b.read(pair.now) == (sent, [], [], 50)


def test_a_socket_that_cannot_segment_turns_gso_off_and_loses_nothing(pair: Pair) -> None:
    pair.socks[0].setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)  # the kernel says EINVAL
    sent = datagrams(64, pair.a.datagram_bytes, seed=5)
    send(pair, sent)
    stats = pair.a.stats()
    assert pair.a.gso is False
    assert (stats["segmented_sends"], stats["send_errors"], stats["send_dropped"]) == (0, 0, 0)
    assert pair.b.read(pair.now) == (sent, [], [], 64)
    pair.now += 0.002
    assert pair.b.flush(pair.now) == 1  # an ACK, so that the window opens again
    pair.a.read(pair.now)
    send(pair, sent[:3])  # and from then on, plain messages
    assert pair.b.read(pair.now) == (sent[:3], [], [], 3)


def test_a_full_batch_is_acknowledged_whole(pair: Pair) -> None:
    sent = datagrams(64, pair.a.datagram_bytes, seed=6)
    send(pair, sent)
    assert pair.b.read(pair.now)[3] == 64
    pair.now += 0.002
    assert pair.b.flush(pair.now) == 1
    assert pair.a.read(pair.now) == ([], [], [], 1)
    assert pair.a.stats()["acked_packets"] == 64
