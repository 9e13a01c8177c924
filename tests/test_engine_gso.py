"""UDP GSO and GRO on the data plane: runs of equal packets in a batch go to the kernel
as one buffer it cuts into those packets (UDP_SEGMENT); a channel that reads its own
socket takes the kernel's coalesced buffers (UDP_GRO) and cuts them at their segment
size. What arrives is the same packets, in order, whatever either socket does."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from tests.test_engine_channel import Pair, _sealed_by_a, datagrams, read_lists
from tests.test_engine_read import send_all

SO_NO_CHECK = 11  # <asm-generic/socket.h>: a socket without UDP checksums cannot segment
PACKET_OVERHEAD = 13 + 16 + 1  # short header, tag, DATAGRAM frame type (proto/engine.md)


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def arrived(pair: Pair) -> list[int]:
    """The sizes of the UDP datagrams b's socket holds, in order, each one packet."""
    return [len(packet) for packet in pair.packets_to(1)]


def test_a_batch_of_full_packets_goes_as_two_buffers_and_arrives_as_its_packets(
    pair: Pair,
) -> None:
    assert pair.a.gso is True
    sent = datagrams(64, pair.a.datagram_bytes, seed=3)
    send_all(pair, sent)
    stats = pair.a.stats()
    assert stats["segmented_sends"] == 2  # 45 + 19 packets of 1442 bytes
    assert stats["packets_sent"] == 64 and stats["send_errors"] == 0
    assert read_lists(pair.b, pair.now) == (sent, [], [], 64, 64)


def test_a_shorter_packet_ends_a_run_and_small_packets_go_alone(pair: Pair) -> None:
    full = pair.a.datagram_bytes
    sizes = [full, full, full - 100, full, full, 10, 20, full]
    sent = [bytes([i]) * size for i, size in enumerate(sizes)]
    send_all(pair, sent)
    # runs: [full, full, shorter], [full, full], then 10 and 20 (under 1200 bytes: alone),
    # then the last full packet alone
    assert pair.a.stats()["segmented_sends"] == 2
    assert arrived(pair) == [size + PACKET_OVERHEAD for size in sizes]


def test_with_gso_off_every_packet_is_its_own_message(pair: Pair) -> None:
    pair.a.gso = False
    sent = datagrams(50, pair.a.datagram_bytes, seed=4)
    send_all(pair, sent)
    assert pair.a.stats()["segmented_sends"] == 0
    assert read_lists(pair.b, pair.now) == (sent, [], [], 50, 50)


def test_a_socket_that_cannot_segment_turns_gso_off_and_loses_nothing(pair: Pair) -> None:
    pair.socks[0].setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)  # the kernel says EINVAL
    sent = datagrams(64, pair.a.datagram_bytes, seed=5)
    send_all(pair, sent)
    stats = pair.a.stats()
    assert pair.a.gso is False
    assert (stats["segmented_sends"], stats["send_errors"], stats["send_dropped"]) == (0, 0, 0)
    assert read_lists(pair.b, pair.now) == (sent, [], [], 64, 64)
    pair.now += 0.002
    assert pair.b.flush(pair.now) == 1  # an ACK, so that the window opens again
    read_lists(pair.a, pair.now)
    send_all(pair, sent[:3])  # and from then on, plain messages
    assert read_lists(pair.b, pair.now) == (sent[:3], [], [], 3, 3)


def test_a_full_batch_is_acknowledged_whole(pair: Pair) -> None:
    sent = datagrams(64, pair.a.datagram_bytes, seed=6)
    send_all(pair, sent)
    assert read_lists(pair.b, pair.now)[3] == 64
    pair.now += 0.002
    assert pair.b.flush(pair.now) == 1
    assert read_lists(pair.a, pair.now) == ([], [], [], 1, 1)
    assert pair.a.stats()["acked_packets"] == 64


UDP_SEGMENT = 103


def send_segmented(sock: socket.socket, packets: list[bytes], to: tuple[str, int]) -> None:
    """One GSO send of equal ``packets`` (the last may be shorter) from a plain socket."""
    size = struct.pack("H", len(packets[0]))
    sock.sendmsg([b"".join(packets)], [(socket.IPPROTO_UDP, UDP_SEGMENT, size)], 0, to)


def test_a_coalesced_batch_is_cut_into_its_packets(pair: Pair) -> None:
    assert read_lists(pair.b, pair.now) == ([], [], [], 0, 0)  # the first read turns GRO on
    assert pair.b.gro is True
    sent = datagrams(64, pair.a.datagram_bytes, seed=7)
    send_all(pair, sent)
    assert read_lists(pair.b, pair.now) == (sent, [], [], 2, 64)  # two buffers: 45 and 19 packets
    assert pair.b.stats()["coalesced_reads"] == 2
    assert pair.b.stats()["datagrams_received"] == 64
    pair.now += 0.002
    assert pair.b.flush(pair.now) == 1
    assert read_lists(pair.a, pair.now) == ([], [], [], 1, 1)
    assert pair.a.stats()["acked_packets"] == 64


def test_with_gro_off_a_segmented_batch_arrives_packet_by_packet(pair: Pair) -> None:
    read_lists(pair.b, pair.now)
    pair.b.gro = False
    assert pair.b.gro is False
    sent = datagrams(64, pair.a.datagram_bytes, seed=8)
    send_all(pair, sent)
    assert pair.a.stats()["segmented_sends"] == 2
    assert read_lists(pair.b, pair.now) == (sent, [], [], 64, 64)
    assert pair.b.stats()["coalesced_reads"] == 0


def test_coalesced_packets_not_the_channels_come_back_one_by_one_with_their_sender(
    pair: Pair,
) -> None:
    read_lists(pair.b, pair.now)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    try:
        packets = [bytes([0xC0 | i]) * 1300 for i in range(3)] + [b"\xc0" * 500]
        send_segmented(other, packets, pair.socks[1].getsockname())
        sender = other.getsockname()
        assert read_lists(pair.b, pair.now) == ([], [(p, sender) for p in packets], [], 1, 4)
    finally:
        other.close()


def test_a_forged_packet_among_coalesced_good_ones_is_dropped_alone(pair: Pair) -> None:
    read_lists(pair.b, pair.now)
    frames = [bytes([0x31, 60]) + bytes([i]) * 60 for i in range(4)]  # DATAGRAM, length 60
    packets = [_sealed_by_a(f, pn) for pn, f in enumerate(frames)]
    forged = bytearray(packets[2])
    forged[-1] ^= 1  # its tag no longer verifies
    packets[2] = bytes(forged)
    send_segmented(pair.socks[0], packets, pair.socks[1].getsockname())
    got = read_lists(pair.b, pair.now)
    assert got == ([f[2:] for i, f in enumerate(frames) if i != 2], [], [], 1, 4)
    assert pair.b.stats()["not_opened"] == 1


def test_more_packets_than_one_read_opens_are_dropped_and_counted(pair: Pair) -> None:
    read_lists(pair.b, pair.now)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    try:
        to = pair.socks[1].getsockname()
        for i in range(40):  # 40 buffers of 128 packets of 32 bytes: 5120 packets
            send_segmented(other, [bytes([0xC0, i]) * 16] * 128, to)
        got, foreign, errors, buffers, packets = read_lists(pair.b, pair.now)
        assert (got, errors, buffers, packets) == ([], [], 40, 4096)
        assert len(foreign) == 4096  # READ_PACKETS
        assert foreign[-1][0] == bytes([0xC0, 31]) * 16
        assert pair.b.stats()["read_overflow"] == 5120 - 4096
        assert read_lists(pair.b, pair.now) == ([], [], [], 0, 0)
    finally:
        other.close()
