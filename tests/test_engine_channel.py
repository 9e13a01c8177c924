"""Two data-plane channels over real UDP sockets on loopback, no event loop: every
packet is read by the test, which decides whether it arrives (drop, duplicate, damage)."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_shard_spans import expected, span
from wangate.engine import PathChannel, _engine
from wangate.errors import LocalProtocolError, RemoteProtocolError

SUITE = 0x1301  # TLS_AES_128_GCM_SHA256
SECRET_AB = bytes(range(32))  # a's application traffic secret: a -> b
SECRET_BA = bytes(range(32, 64))
PACKET_BYTES = 1452


class Pair:
    def __init__(self, key_update_packets: int = 1 << 22) -> None:
        self.socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        for sock in self.socks:
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        a_addr, b_addr = (sock.getsockname() for sock in self.socks)
        self.a = PathChannel(
            self.socks[0].fileno(), b_addr, SUITE, SECRET_AB, SECRET_BA, PACKET_BYTES, 0.01,
            key_update_packets,
        )  # fmt: skip
        self.b = PathChannel(
            self.socks[1].fileno(), a_addr, SUITE, SECRET_BA, SECRET_AB, PACKET_BYTES, 0.01,
            key_update_packets,
        )  # fmt: skip
        self.now = 100.0

    def packets_to(self, index: int) -> Iterator[bytes]:
        while True:
            try:
                yield self.socks[index].recv(65536)
            except BlockingIOError:
                return

    def deliver(self, index: int, keep: float = 1.0, rng: random.Random | None = None) -> list:
        channel = self.b if index == 1 else self.a
        got: list = []
        for packet in list(self.packets_to(index)):
            if rng is not None and rng.random() >= keep:
                continue
            result = channel.receive(packet, self.now)
            if isinstance(result, bytes):
                got.append(result)
            elif isinstance(result, list):
                got.extend(result)
        return got

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


def read_lists(channel: PathChannel, now: float) -> tuple[Any, ...]:
    """``channel.read(now)`` with its datagrams (a ReadDatagrams, valid until the next
    read) taken as a list of bytes."""
    got, foreign, errors, buffers, packets = channel.read(now)
    return list(got), foreign, errors, buffers, packets


def datagrams(count: int, size: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def test_connection_ids_are_derived_the_same_on_both_ends(pair: Pair) -> None:
    assert pair.a.send_cid == pair.b.recv_cid and pair.b.send_cid == pair.a.recv_cid
    assert pair.a.recv_cid != pair.b.recv_cid and len(pair.a.recv_cid) == 8
    # the largest datagram: 1452 less header 13, tag 16, frame type 1, ACK room 10
    assert pair.a.datagram_bytes == 1452 - 40


def test_datagrams_arrive_exactly_in_order_and_are_acked(pair: Pair) -> None:
    sent = datagrams(40, pair.a.datagram_bytes)
    for datagram in sent:
        assert pair.a.queue(datagram) is True
    assert len(pair.a) == 40
    assert pair.a.flush(pair.now) == 40
    assert len(pair.a) == 0
    assert pair.deliver(1) == sent
    pair.now += 0.002  # b's ACK is due: every second packet, at once
    assert pair.b.flush(pair.now) == 1  # one ACK-only packet
    assert pair.deliver(0) == []
    a, b = pair.a.stats(), pair.b.stats()
    assert a["datagrams_sent"] == 40 and b["datagrams_received"] == 40
    assert a["acked_packets"] == 40 and a["lost_packets"] == 0 and a["bytes_in_flight"] == 0
    assert b["packets_received"] == 40 and a["packets_received"] == 1
    # the pacer's rate, as the driver sizes a channel's queue by it
    assert pair.a.pacing_rate_bytes == a["pacing_rate_bytes"] > 0


def test_short_and_empty_datagrams(pair: Pair) -> None:
    sent = [b"", b"x", bytes(17)]
    for datagram in sent:
        pair.a.queue(datagram)
    pair.a.flush(pair.now)
    assert pair.deliver(1) == sent


def test_loss_is_detected_and_counted_never_resent() -> None:
    pair = Pair()
    rng = random.Random(7)
    try:
        sent = datagrams(200, 1000)
        arrived: list[bytes] = []
        for start in range(0, 200, 10):
            for datagram in sent[start : start + 10]:
                pair.a.queue(datagram)
            pair.a.flush(pair.now)
            arrived += pair.deliver(1, keep=0.9, rng=rng)
            pair.now += 0.002
            pair.b.flush(pair.now)
            pair.deliver(0)
        pair.now += 1.0  # past every loss timer and probe timeout
        pair.a.on_timer(pair.now)
        pair.a.flush(pair.now)
        pair.deliver(1)
        pair.b.flush(pair.now + 0.002)
        pair.deliver(0)
        dropped = 200 - len(arrived)
        assert dropped > 0
        assert arrived == [d for d in sent if d in set(arrived)]  # order kept, nothing twice
        a = pair.a.stats()
        assert a["lost_packets"] == dropped and a["datagrams_sent"] == 200
    finally:
        pair.close()


def test_replayed_damaged_and_foreign_packets_are_dropped(pair: Pair) -> None:
    pair.a.queue(b"once")
    pair.a.flush(pair.now)
    (packet,) = list(pair.packets_to(1))
    assert pair.b.receive(packet, pair.now) == b"once"
    assert pair.b.receive(packet, pair.now) is None  # replayed
    damaged = bytearray(packet)
    damaged[-1] ^= 1
    pair.a.queue(b"twice")
    pair.a.flush(pair.now)
    (second,) = list(pair.packets_to(1))
    damaged = bytearray(second)
    damaged[20] ^= 0x40
    assert pair.b.receive(bytes(damaged), pair.now) is None  # fails the AEAD
    assert pair.b.receive(second, pair.now) == b"twice"  # the real one still opens
    assert pair.b.receive(b"\x40" + pair.b.recv_cid + os.urandom(40), pair.now) is None
    assert pair.b.receive(b"\x40" + bytes(8) + os.urandom(40), pair.now) is False  # not ours
    assert pair.b.receive(b"\xc0" + os.urandom(1300), pair.now) is False  # a long header
    assert pair.b.receive(b"", pair.now) is False
    for cut in range(len(second)):
        assert pair.b.receive(second[:cut], pair.now) in (None, False)
    b = pair.b.stats()
    assert b["replayed"] >= 1 and b["not_opened"] >= 2 and b["datagrams_received"] == 2


def test_key_update_both_ways() -> None:
    pair = Pair(key_update_packets=16)
    try:
        sent = datagrams(300, 500)
        got_b: list[bytes] = []
        got_a: list[bytes] = []
        for start in range(0, 300, 8):
            for datagram in sent[start : start + 8]:
                pair.a.queue(datagram)
                pair.b.queue(datagram[::-1])
            pair.a.flush(pair.now)
            pair.b.flush(pair.now)
            got_b += pair.deliver(1)
            got_a += pair.deliver(0)
            pair.now += 0.002
        assert got_b == sent and got_a == [d[::-1] for d in sent]
        a, b = pair.a.stats(), pair.b.stats()
        assert a["key_updates"] >= 5 and b["key_updates"] >= 5
        assert a["not_opened"] == 0 and b["not_opened"] == 0
    finally:
        pair.close()


def test_misuse_is_a_local_error(pair: Pair) -> None:
    with pytest.raises(LocalProtocolError, match="does not fit"):
        pair.a.queue(bytes(pair.a.datagram_bytes + 1))
    for _ in range(256):
        assert pair.a.queue(b"q") is True
    assert pair.a.queue(b"q") is False  # the queue is full
    with pytest.raises(LocalProtocolError, match="cipher suite"):
        PathChannel(
            pair.socks[0].fileno(), ("127.0.0.1", 9), 0x9999, SECRET_AB, SECRET_BA, 1452, 0.01
        )
    with pytest.raises(LocalProtocolError, match=r"wrong length|cipher suite"):
        PathChannel(
            pair.socks[0].fileno(), ("127.0.0.1", 9), SUITE, b"short", SECRET_BA, 1452, 0.01
        )
    with pytest.raises(LocalProtocolError, match="1200"):
        PathChannel(
            pair.socks[0].fileno(), ("127.0.0.1", 9), SUITE, SECRET_AB, SECRET_BA, 1000, 0.01
        )
    with pytest.raises(ValueError, match="numeric"):
        PathChannel(
            pair.socks[0].fileno(), ("localhost", 9), SUITE, SECRET_AB, SECRET_BA, 1452, 0.01
        )


def test_a_list_is_queued_in_order_until_the_queue_is_full(pair: Pair) -> None:
    sent = datagrams(3, pair.a.datagram_bytes)
    assert pair.a.queue_many(sent) == 3
    assert pair.a.flush(pair.now) == 3
    assert pair.deliver(1) == sent
    assert pair.a.queue_many([b"q"] * 250) == 250
    assert pair.a.queue_many([b"r"] * 10) == 6  # 256 slots: the rest are the caller's
    assert len(pair.a) == 256


def test_a_bad_list_is_refused_and_what_came_before_stays_queued(pair: Pair) -> None:
    with pytest.raises(TypeError, match="list"):
        pair.a.queue_many((b"tuple",))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pair.a.queue_many([b"one", 2])  # type: ignore[list-item]
    with pytest.raises(LocalProtocolError, match="does not fit"):
        pair.a.queue_many([b"two", bytes(pair.a.datagram_bytes + 1)])
    assert len(pair.a) == 2  # b"one" and b"two"


def _sealed_by_a(frames: bytes, pn: int) -> bytes:
    """A packet as a's channel would seal it, frames chosen by the test."""
    dp_secret, cid = _engine.derive_data_plane(SUITE, SECRET_AB)
    return _engine.seal_short_packet(SUITE, dp_secret, cid, 0, pn, frames)


def test_an_authenticated_peers_bad_frames_are_its_error(pair: Pair) -> None:
    datagram = bytes([0x31, 3]) + b"abc"  # DATAGRAM with a length
    assert pair.b.receive(_sealed_by_a(datagram, 0), pair.now) == b"abc"
    two = datagram + bytes([0x30]) + b"rest"
    assert pair.b.receive(_sealed_by_a(two, 1), pair.now) == [b"abc", b"rest"]
    with pytest.raises(RemoteProtocolError, match="malformed frames"):
        pair.b.receive(_sealed_by_a(bytes([0x1F]) + b"junk", 2), pair.now)  # unknown type
    never_sent = _engine.encode_ack([(0, 50)], 0)  # b has sent nothing
    with pytest.raises(RemoteProtocolError, match="never sent"):
        pair.b.receive(_sealed_by_a(never_sent, 3), pair.now)
    assert pair.b.receive(_sealed_by_a(datagram, 4), pair.now) == b"abc"  # still serving


def test_a_channel_frames_a_span_into_its_queue_and_sends_it(pair: Pair) -> None:
    # as encode_shard frames each datagram (tests/test_shard_spans.py holds the two alike)
    stride = pair.a.datagram_bytes - 20
    s = span(stride=stride, end=40 + 3 * stride + 7)
    other = b"\x40" + bytes(30)  # what comes before and after it keeps its place
    assert pair.a.queue_many([other, s, other]) == 6
    assert len(pair.a) == 6
    assert pair.a.flush(pair.now) == 6
    assert pair.deliver(1) == [other, *expected(s), other]


def test_a_channel_refuses_a_span_it_cannot_carry_and_queues_what_fits(pair: Pair) -> None:
    with pytest.raises(LocalProtocolError, match="do not fit"):
        pair.a.queue_many([span(stride=pair.a.datagram_bytes - 19)])
    assert len(pair.a) == 0
    many = span(stride=50, end=40 + 300 * 50)  # 300 datagrams; the queue holds 256
    assert pair.a.queue_many([many, b"\x40" + bytes(30)]) == 256
    assert len(pair.a) == 256


@pytest.mark.parametrize(
    ("rtt_s", "paced"), [(0.0, False), (0.0015, False), (0.0025, True), (0.02, True)]
)
def test_a_path_at_the_round_trip_floor_is_not_paced(pair: Pair, rtt_s: float, paced: bool) -> None:
    # a first exchange measures the round trip (under 1 ms counts as 1 ms): a path of
    # under 2 ms is not paced, the window bounds its bursts
    for datagram in datagrams(20, 1000):
        pair.a.queue(datagram)
    assert pair.a.flush(pair.now) == 20
    assert len(pair.deliver(1)) == 20
    pair.now += rtt_s
    pair.b.flush(pair.now)
    pair.deliver(0)
    assert pair.a.stats()["acked_packets"] == 20
    # then 60 at once: the window takes them all; only the pacer could hold some back
    for datagram in datagrams(60, 1000, seed=2):
        pair.a.queue(datagram)
    sent = pair.a.flush(pair.now)
    if paced:
        assert 0 < sent < 60 and len(pair.a) == 60 - sent
        assert pair.now < pair.a.timer(pair.now) < pair.now + 0.02  # when more may go
    else:
        assert sent == 60 and len(pair.a) == 0
