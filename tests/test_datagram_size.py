"""A link's datagram size, its connection IDs, and the data plane's keys, on real
aioquic connections and real data-plane channels.

Two aioquic connections configured as wangate configures them (real TLS, in memory: the
bytes go from one to the other without sockets) finish their handshake: the client's
first Initial carries an 8-byte Destination Connection ID although the client issues
zero-length IDs, the server issues 4-byte IDs, and short headers carry those. Their
secrets give both ends the same data-plane keys and connection IDs (proto/engine.md).
A data-plane packet adds 40 bytes to its datagram (13 of header, 16 of tag, the frame
type, and 10 of room for the ACK it owes): a full datagram alone makes a packet 10
bytes short of the path's size, and with a one-range ACK it still fits.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import HandshakeCompleted, StreamDataReceived
from aioquic.quic.packet import pull_quic_header

from tests.one_path import one_path
from wangate.certs import create_ca, issue_site_certificate
from wangate.engine import DATAGRAM_OVERHEAD_BYTES, PathChannel, _engine
from wangate.errors import LocalProtocolError
from wangate.net import aioquic_compat as compat
from wangate.net.link import CLIENT_CID_BYTES, SERVER_CID_BYTES

MAX_DATAGRAM_SIZE = 1472  # a 1500-byte IPv4 path
SERVER = ("127.0.0.2", 4433)
CLIENT = ("127.0.0.1", 1234)


class Pair:
    def __init__(self, tmp_path: Path) -> None:
        create_ca(tmp_path)
        cert, key = issue_site_certificate(tmp_path, "sh")
        common = {"max_datagram_size": MAX_DATAGRAM_SIZE}
        server_cfg = QuicConfiguration(
            is_client=False, alpn_protocols=["t"], connection_id_length=SERVER_CID_BYTES, **common
        )
        server_cfg.load_cert_chain(cert, key)
        client_cfg = QuicConfiguration(is_client=True, alpn_protocols=["t"], **common)
        client_cfg.load_verify_locations(cafile=str(tmp_path / "ca.pem"))
        client_cfg.server_name = "sh"
        self.client = client = compat.client_connection(client_cfg, CLIENT_CID_BYTES)
        client.connect(SERVER, now=0.0)
        self.first = first = [data for data, _ in client.datagrams_to_send(now=0.0)]
        self.first_header = pull_quic_header(Buffer(data=first[0]), host_cid_length=8)
        self.server = server = QuicConnection(
            configuration=server_cfg,
            original_destination_connection_id=self.first_header.destination_cid,
        )
        pending = first
        now = 0.0
        for _ in range(10):  # the handshake's flights
            for data in pending:
                server.receive_datagram(data, CLIENT, now=now)
            back = [data for data, _ in server.datagrams_to_send(now=now)]
            for data in back:
                client.receive_datagram(data, SERVER, now=now)
            pending = [data for data, _ in client.datagrams_to_send(now=now)]
            now += 0.01
        done = []
        for connection in (client, server):
            while (event := connection.next_event()) is not None:
                done.append(isinstance(event, HandshakeCompleted))
        assert sum(done) == 2

    def settle(self, now: float) -> float:
        """Exchange packets until neither side owes the other anything (no ACK due)."""
        for _ in range(10):
            if not self.client_sends(now) + self.server_sends(now + 0.005):
                return now
            now += 0.01
        raise AssertionError("the connections never settled")

    def client_sends(self, now: float) -> list[bytes]:
        packets = [data for data, _ in self.client.datagrams_to_send(now=now)]
        for data in packets:
            self.server.receive_datagram(data, CLIENT, now=now)
        return packets

    def server_sends(self, now: float) -> list[bytes]:
        packets = [data for data, _ in self.server.datagrams_to_send(now=now)]
        for data in packets:
            self.client.receive_datagram(data, SERVER, now=now)
        return packets


def _stream(connection: QuicConnection) -> bytes:
    data = b""
    while (event := connection.next_event()) is not None:
        if isinstance(event, StreamDataReceived):
            data += event.data
    return data


def test_connection_ids_client_none_server_four_first_initial_eight(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    header = pair.first_header
    assert len(header.destination_cid) == 8  # RFC 9000 §7.2
    assert header.source_cid == b""  # the client's own ID: zero-length
    assert pair.client.original_destination_connection_id == header.destination_cid
    assert len(pair.server.host_cid) == SERVER_CID_BYTES == 4
    # short headers: to the server its 4-byte ID, to the client no ID at all
    pair.client.send_stream_data(0, b"c" * 100)
    (to_server,) = pair.client_sends(now=1.0)
    assert to_server[0] & 0x80 == 0
    short = pull_quic_header(Buffer(data=to_server), host_cid_length=4)
    assert short.destination_cid == pair.server.host_cid
    assert _stream(pair.server) == b"c" * 100
    pair.server.send_stream_data(0, b"s" * 100)
    packets = pair.server_sends(now=1.1)
    assert packets[-1][0] & 0x80 == 0
    assert pull_quic_header(Buffer(data=packets[-1]), host_cid_length=0).destination_cid == b""
    assert _stream(pair.client) == b"s" * 100
    # the client issued no further IDs (RFC 9000 §5.1.1), the server its usual 7 more
    assert [len(c.cid) for c in pair.client._host_cids] == [0]
    assert all(len(c.cid) == 4 for c in pair.server._host_cids)


def test_both_ends_of_a_handshake_derive_the_same_data_plane(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    suite, client_send, client_recv = compat.one_rtt_secrets(pair.client)
    server_suite, server_send, server_recv = compat.one_rtt_secrets(pair.server)
    assert suite == server_suite == 0x1302  # aioquic's first choice: TLS_AES_256_GCM_SHA384
    assert client_send == server_recv and client_recv == server_send
    assert client_send != client_recv and len(client_send) == 48
    dp_up, cid_up = _engine.derive_data_plane(suite, client_send)
    dp_down, cid_down = _engine.derive_data_plane(suite, client_recv)
    assert cid_up != cid_down and dp_up not in (client_send, dp_down)
    a, b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET)
    try:
        client = PathChannel(
            a.fileno(), SERVER, suite, client_send, client_recv, MAX_DATAGRAM_SIZE, 0.01
        )
        server = PathChannel(
            a.fileno(), CLIENT, suite, server_send, server_recv, MAX_DATAGRAM_SIZE, 0.01
        )
        assert client.send_cid == server.recv_cid == cid_up
        assert server.send_cid == client.recv_cid == cid_down
    finally:
        a.close()
        b.close()


class ChannelPair:
    def __init__(self) -> None:
        self.socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        for sock in self.socks:
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
        up, down = bytes(range(32)), bytes(range(1, 33))
        a, b = (sock.getsockname() for sock in self.socks)
        self.a = PathChannel(self.socks[0].fileno(), b, 0x1301, up, down, MAX_DATAGRAM_SIZE, 0.01)
        self.b = PathChannel(self.socks[1].fileno(), a, 0x1301, down, up, MAX_DATAGRAM_SIZE, 0.01)

    def sent_to(self, index: int) -> list[bytes]:
        packets = []
        while True:
            try:
                packets.append(self.socks[index].recv(65536))
            except BlockingIOError:
                return packets

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


@pytest.fixture
def channels() -> ChannelPair:
    pair = ChannelPair()
    yield pair  # type: ignore[misc]
    pair.close()


def test_a_full_datagram_leaves_room_for_the_ack_it_owes(channels: ChannelPair) -> None:
    a, b = channels.a, channels.b
    assert DATAGRAM_OVERHEAD_BYTES == 40
    assert a.datagram_bytes == MAX_DATAGRAM_SIZE - 40 == 1432
    full = b"d" * a.datagram_bytes
    a.queue(full)
    a.flush(1.0)
    (alone,) = channels.sent_to(1)
    assert len(alone) == MAX_DATAGRAM_SIZE - 10  # the ACK room unused
    assert b.receive(alone, 1.0) == full
    # b now owes a an ACK: one range, 1 + 1 + 1 + 1 + 1 bytes; it rides with b's datagram
    b.queue(full)
    b.flush(1.0)
    (with_ack,) = channels.sent_to(0)
    assert len(with_ack) == MAX_DATAGRAM_SIZE - 10 + 5
    assert a.receive(with_ack, 1.0) == full
    assert a.stats()["acked_packets"] == 1
    with pytest.raises(LocalProtocolError, match="does not fit"):
        a.queue(full + b"+")


def test_a_smaller_path_size_applies_to_what_comes_next(channels: ChannelPair) -> None:
    a, b = channels.a, channels.b
    full = b"q" * a.datagram_bytes
    a.queue(full)  # queued under the old size: it still leaves whole
    a.fit(1300)
    assert a.datagram_bytes == 1300 - 40
    with pytest.raises(LocalProtocolError, match="does not fit"):
        a.queue(full)
    a.queue(b"s" * 1260)
    a.flush(1.0)
    packets = channels.sent_to(1)
    assert [len(p) for p in packets] == [MAX_DATAGRAM_SIZE - 10, 1300 - 10]
    assert [b.receive(p, 1.0) for p in packets] == [full, b"s" * 1260]
    with pytest.raises(LocalProtocolError, match="at least 1200"):
        a.fit(1199)
    with pytest.raises(LocalProtocolError, match="at most 1472"):
        a.fit(1500)


async def _gateway_links(directory: Path) -> None:
    async with one_path(directory) as link:
        bj, sh, path, dialed, accepted = link.bj, link.sh, link.path, link.dialed, link.accepted
        assert path.max_datagram_size == MAX_DATAGRAM_SIZE
        # aioquic: the dialer sends to the listener's 4-byte ID, the listener to none
        assert len(dialed._quic.host_cid) == 0 and len(accepted._quic.host_cid) == 4
        # the data plane: each end sends to the 8-byte ID the other receives on
        assert dialed.channel is not None and accepted.channel is not None
        assert dialed.channel.send_cid == accepted.channel.recv_cid
        assert accepted.channel.send_cid == dialed.channel.recv_cid
        (listener,) = bj.backend.endpoint._servers
        assert listener._by_cid[accepted.channel.recv_cid] is accepted
        assert dialed.datagram_bytes == accepted.datagram_bytes == MAX_DATAGRAM_SIZE - 40
        senders = (
            sh.peers["bj"].view._paths[path.name].sender,
            bj.peers["sh"].view._paths[path.name].sender,
        )
        assert [s.datagram_bytes for s in senders] == [1432, 1432]


def test_a_gateway_routes_and_sizes_the_data_plane(
    tmp_path: Path,
) -> None:
    asyncio.run(_gateway_links(tmp_path))
