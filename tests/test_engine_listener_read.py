"""ListenerReader: the paths a listening socket accepted share it; their data planes are
read in batches (recvmmsg, UDP GRO), each packet opened by the channel its connection ID
is routed to, and what no route claims comes back untouched, with its sender."""

from __future__ import annotations

import errno
import gc
import os
import socket
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_engine_channel import PACKET_BYTES, SUITE, datagrams, read_lists
from wangate.engine import ListenerReader, PathChannel, _engine
from wangate.errors import LocalProtocolError

NOW = 100.0


class Shared:
    """Two dialers (a socket and a channel each) and a listening socket with the two
    channels that answer them, both on its descriptor."""

    def __init__(self) -> None:
        self.listening = self._socket()
        self.dialing = [self._socket(), self._socket()]
        here = self.listening.getsockname()
        self.secrets = [(os.urandom(32), os.urandom(32)) for _ in self.dialing]
        self.a = [
            PathChannel(s.fileno(), here, SUITE, out, back, PACKET_BYTES, 0.01)
            for s, (out, back) in zip(self.dialing, self.secrets, strict=True)
        ]
        self.b = [
            PathChannel(self.listening.fileno(), s.getsockname(), SUITE, back, out,
                        PACKET_BYTES, 0.01)
            for s, (out, back) in zip(self.dialing, self.secrets, strict=True)
        ]  # fmt: skip
        self.reader = ListenerReader(self.listening.fileno())

    @staticmethod
    def _socket() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        return sock

    def sealed_by(self, index: int, frames: bytes, pn: int) -> bytes:
        dp_secret, cid = _engine.derive_data_plane(SUITE, self.secrets[index][0])
        return _engine.seal_short_packet(SUITE, dp_secret, cid, 0, pn, frames)

    def close(self) -> None:
        for sock in (self.listening, *self.dialing):
            sock.close()


@pytest.fixture
def shared() -> Iterator[Shared]:
    s = Shared()
    yield s
    s.close()


def read_groups(reader: ListenerReader) -> tuple[Any, ...]:
    """``reader.read(NOW)`` with each group's datagrams (a ReadDatagrams, valid until the
    next read) taken as a list of bytes."""
    groups, foreign, buffers, packets = reader.read(NOW)
    return [(o, list(d), e) for o, d, e in groups], foreign, buffers, packets


def send(channel: PathChannel, sent: list[bytes]) -> None:
    assert channel.queue_many(sent) == len(sent)
    assert channel.flush(NOW) >= 1


def test_each_paths_packets_go_to_its_owner_in_order_and_are_acknowledged(
    shared: Shared,
) -> None:
    owners = ("bj/fiber-a", "sg/fiber-a")
    for channel, owner in zip(shared.b, owners, strict=True):
        shared.reader.add(channel, owner)
    assert len(shared.reader) == 2
    assert read_groups(shared.reader) == ([], [], 0, 0)  # the first read turns GRO on
    first = datagrams(40, shared.a[0].datagram_bytes, seed=1)
    second = [b"x" * 100, b"y" * 7]
    send(shared.a[0], first)
    send(shared.a[1], second)
    groups, foreign, buffers, packets = read_groups(shared.reader)
    assert foreign == [] and buffers >= 2 and packets == 42
    assert groups == [(owners[0], first, []), (owners[1], second, [])]
    assert shared.b[0].stats()["datagrams_received"] == 40
    assert shared.b[1].stats()["datagrams_received"] == 2
    # each channel acknowledges what it opened, to its own dialer
    for a, b, n in zip(shared.a, shared.b, (40, 2), strict=True):
        assert b.flush(NOW + 0.002) == 1
        assert read_lists(a, NOW + 0.002) == ([], [], [], 1, 1)
        assert a.stats()["acked_packets"] == n


def test_a_groups_datagrams_are_gone_with_the_next_read(shared: Shared) -> None:
    shared.reader.add(shared.b[0], "bj")
    shared.reader.add(shared.b[1], "sg")
    assert read_groups(shared.reader) == ([], [], 0, 0)
    send(shared.a[0], [b"one", b"two"])
    send(shared.a[1], [b"three"])
    (_, first, _), (_, second, _) = shared.reader.read(NOW)[0]
    assert isinstance(first, _engine.ReadDatagrams) and list(first) == [b"one", b"two"]
    assert list(second) == [b"three"]
    assert read_groups(shared.reader) == ([], [], 0, 0)
    for gone in (first, second):
        with pytest.raises(LocalProtocolError, match="before the reader's latest read"):
            gone[0]


def test_a_coalesced_run_is_cut_into_its_packets(shared: Shared) -> None:
    shared.reader.add(shared.b[0], "bj")
    assert read_groups(shared.reader) == ([], [], 0, 0)
    assert shared.reader.gro is True
    sent = datagrams(64, shared.a[0].datagram_bytes, seed=7)
    send(shared.a[0], sent)
    assert read_groups(shared.reader) == ([("bj", sent, [])], [], 2, 64)  # 45 and 19 packets
    assert shared.reader.stats() == {"coalesced_reads": 2, "read_overflow": 0, "foreign_packets": 0}


def test_what_no_route_claims_comes_back_untouched_with_its_sender(shared: Shared) -> None:
    shared.reader.add(shared.b[0], "bj")
    here = shared.listening.getsockname()
    other = shared.dialing[1]
    long_header = b"\xc0" + os.urandom(1250)  # a handshake packet: aioquic's
    unrouted = shared.sealed_by(1, bytes([0x30]) + b"data", 0)  # a path not routed (yet)
    short_garbage = b"\x40" + os.urandom(5)
    for packet in (long_header, unrouted, short_garbage, b""):
        other.sendto(packet, here)
    send(shared.a[0], [b"mine"])
    groups, foreign, buffers, packets = read_groups(shared.reader)
    sender = other.getsockname()
    assert groups == [("bj", [b"mine"], [])] and buffers == packets == 5
    assert foreign == [(p, sender) for p in (long_header, unrouted, short_garbage, b"")]
    assert shared.reader.stats()["foreign_packets"] == 4


def test_a_removed_route_hands_its_packets_back_and_can_be_added_again(shared: Shared) -> None:
    shared.reader.add(shared.b[1], "sg")
    assert shared.reader.remove(shared.b[1].recv_cid) is True
    assert shared.reader.remove(shared.b[1].recv_cid) is False
    assert shared.reader.remove(b"short") is False
    assert len(shared.reader) == 0
    packet = shared.sealed_by(1, bytes([0x30]) + b"late", 0)
    shared.dialing[1].sendto(packet, shared.listening.getsockname())
    assert read_groups(shared.reader) == ([], [(packet, shared.dialing[1].getsockname())], 1, 1)
    shared.reader.add(shared.b[1], "sg again")
    shared.dialing[1].sendto(packet, shared.listening.getsockname())
    assert read_groups(shared.reader) == ([("sg again", [b"late"], [])], [], 1, 1)


def test_a_peers_bad_packets_are_its_errors_and_forgeries_are_dropped(shared: Shared) -> None:
    for channel, owner in zip(shared.b, ("bj", "sg"), strict=True):
        shared.reader.add(channel, owner)
    here = shared.listening.getsockname()
    good = shared.sealed_by(0, bytes([0x31, 3]) + b"abc", 0)
    forged = bytearray(shared.sealed_by(1, bytes([0x31, 3]) + b"xyz", 0))
    forged[-1] ^= 1  # fails the AEAD
    unknown_frame = shared.sealed_by(1, bytes([0x1F]) + b"junk", 1)
    for sock, packet in ((0, good), (1, bytes(forged)), (0, good), (1, unknown_frame)):
        shared.dialing[sock].sendto(packet, here)
    groups, foreign, buffers, packets = read_groups(shared.reader)
    assert buffers == packets == 4 and foreign == []  # the dropped ones counted too
    assert groups == [
        ("bj", [b"abc"], []),  # its replay dropped
        ("sg", [], ["malformed frames in a data-plane packet"]),
    ]
    assert shared.b[0].stats()["replayed"] == 1
    assert shared.b[1].stats()["not_opened"] == 1


def test_routes_are_checked(shared: Shared) -> None:
    shared.reader.add(shared.b[0], "bj")
    with pytest.raises(LocalProtocolError, match="connection ID is routed"):
        shared.reader.add(shared.b[0], "again")
    with pytest.raises(TypeError, match="PathChannel"):
        shared.reader.add("not a channel", "x")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="not set up"):
        shared.reader.add(PathChannel.__new__(PathChannel), "x")
    with pytest.raises(TypeError):
        shared.reader.add(shared.b[1])  # type: ignore[call-arg]
    with pytest.raises(LocalProtocolError, match="once"):
        shared.reader.__init__(shared.listening.fileno())  # type: ignore[misc]
    assert len(shared.reader) == 1


def test_a_socket_error_is_an_os_error() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    reader = ListenerReader(sock.fileno())
    sock.close()
    with pytest.raises(OSError) as info:
        reader.read(NOW)
    assert info.value.errno == errno.EBADF


def test_a_reader_in_a_cycle_with_its_owners_is_collected(shared: Shared) -> None:
    class Link:
        reader: ListenerReader | None = None

    link = Link()
    link.reader = ListenerReader(shared.listening.fileno())
    link.reader.add(shared.b[0], link)  # link -> reader -> link
    gone = weakref.ref(link)
    del link
    gc.collect()
    assert gone() is None
