"""A link's datagram size and the bytes of its packets, on real aioquic connections.

Two aioquic connections configured as wangate configures them (real TLS, in memory: the
bytes go from one to the other without sockets) finish their handshake: the client's
first Initial carries an 8-byte Destination Connection ID although the client issues
zero-length IDs, the server issues 4-byte IDs, and short headers carry those. Then
DATAGRAM frames: one that fills its packet goes without its length (RFC 9221 §4), so a
datagram of ``max_datagram_size - 20 - peer ID`` makes a packet of exactly
``max_datagram_size`` bytes; a link's own datagrams leave room for an ACK; one byte
more than a packet holds never leaves (it would block the queue).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import DatagramFrameReceived, HandshakeCompleted
from aioquic.quic.packet import pull_quic_header

from wangate.certs import create_ca, issue_site_certificate
from wangate.config import load_config
from wangate.daemon import Gateway
from wangate.loopback import write_site_configs
from wangate.net import aioquic_compat as compat
from wangate.net.link import (
    ACK_ROOM_BYTES,
    CLIENT_CID_BYTES,
    QUIC_PACKET_OVERHEAD_BYTES,
    SERVER_CID_BYTES,
    datagram_overhead_bytes,
)

MAX_DATAGRAM_SIZE = 1472  # a 1500-byte IPv4 path
SERVER = ("127.0.0.2", 4433)
CLIENT = ("127.0.0.1", 1234)


class Pair:
    def __init__(self, tmp_path: Path) -> None:
        create_ca(tmp_path)
        cert, key = issue_site_certificate(tmp_path, "sh")
        common = {"max_datagram_frame_size": 65536, "max_datagram_size": MAX_DATAGRAM_SIZE}
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
        for connection in (client, server):
            compat.datagram_frames_without_length(connection)
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


def _received(connection: QuicConnection) -> list[bytes]:
    received = []
    while (event := connection.next_event()) is not None:
        if isinstance(event, DatagramFrameReceived):
            received.append(event.data)
    return received


def test_connection_ids_client_none_server_four_first_initial_eight(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    header = pair.first_header
    assert len(header.destination_cid) == 8  # RFC 9000 §7.2
    assert header.source_cid == b""  # the client's own ID: zero-length
    assert pair.client.original_destination_connection_id == header.destination_cid
    assert len(pair.server.host_cid) == SERVER_CID_BYTES == 4
    assert compat.peer_cid_bytes(pair.client) == 4 and compat.peer_cid_bytes(pair.server) == 0
    # short headers: to the server its 4-byte ID, to the client no ID at all
    pair.client.send_datagram_frame(b"c" * 100)
    (to_server,) = pair.client_sends(now=1.0)
    assert to_server[0] & 0x80 == 0
    short = pull_quic_header(Buffer(data=to_server), host_cid_length=4)
    assert short.destination_cid == pair.server.host_cid
    pair.server.send_datagram_frame(b"s" * 100)
    packets = pair.server_sends(now=1.1)
    assert packets[-1][0] & 0x80 == 0
    assert pull_quic_header(Buffer(data=packets[-1]), host_cid_length=0).destination_cid == b""
    assert _received(pair.server) == [b"c" * 100] and _received(pair.client) == [b"s" * 100]
    # the client issued no further IDs (RFC 9000 §5.1.1), the server its usual 7 more
    assert [len(c.cid) for c in pair.client._host_cids] == [0]
    assert all(len(c.cid) == 4 for c in pair.server._host_cids)


def test_a_datagram_that_fills_the_packet_goes_without_its_length(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    for send, sender_to, peer_cid in (
        (pair.client_sends, pair.server, SERVER_CID_BYTES),
        (pair.server_sends, pair.client, CLIENT_CID_BYTES),
    ):
        sender = pair.client if sender_to is pair.server else pair.server
        # QUIC's 20 bytes and the connection ID: the rest is the datagram's
        limit = MAX_DATAGRAM_SIZE - QUIC_PACKET_OVERHEAD_BYTES - peer_cid
        assert QUIC_PACKET_OVERHEAD_BYTES == 20
        now = pair.settle(2.0 if sender is pair.client else 3.0)
        for size in (limit, limit - 1):  # exactly; one byte short: a PADDING frame first
            sender.send_datagram_frame(bytes([size % 251]) * size)
            packets = send(now=now)
            assert [len(p) for p in packets] == [MAX_DATAGRAM_SIZE]
            assert _received(sender_to) == [bytes([size % 251]) * size]
            now += 0.001
        # two bytes short: the length form fits exactly (no PADDING), 1 + 2 bytes of frame
        sender.send_datagram_frame(b"l" * (limit - 2))
        assert [len(p) for p in send(now=now)] == [MAX_DATAGRAM_SIZE]
        now += 0.05
        # a small one keeps its length: header, type, 2-byte length, data, tag
        sender.send_datagram_frame(b"m" * 100)
        assert [len(p) for p in send(now=now)] == [1 + peer_cid + 2 + 1 + 2 + 100 + 16]
        assert _received(sender_to) == [b"l" * (limit - 2), b"m" * 100]
        sender.send_datagram_frame(b"f" * (limit + 1))  # one byte more never leaves
        assert send(now=now + 1.0) == []  # the pacer long open
        assert len(sender._datagrams_pending) == 1
        sender._datagrams_pending.clear()


def test_a_links_full_datagram_rides_with_the_ack_it_owes(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    assert ACK_ROOM_BYTES == 10
    assert datagram_overhead_bytes(4) == 34 and datagram_overhead_bytes(0) == 30
    pair.server.send_datagram_frame(b"x" * 100)  # the client owes the server an ACK
    pair.server_sends(now=1.0)
    size = MAX_DATAGRAM_SIZE - datagram_overhead_bytes(SERVER_CID_BYTES)
    pair.client.send_datagram_frame(b"d" * size)
    packets = pair.client_sends(now=1.01)
    assert len(packets) == 1  # the ACK and the datagram in one packet
    assert len(packets[0]) <= MAX_DATAGRAM_SIZE
    assert _received(pair.server) == [b"d" * size]
    # alone, it leaves a packet 8 bytes short of full: the length takes 2 of the room's 10
    pair.client.send_datagram_frame(b"e" * size)
    assert [len(p) for p in pair.client_sends(now=2.0)] == [MAX_DATAGRAM_SIZE - 8]
    assert _received(pair.server) == [b"e" * size]


async def _gateway_links(directory: Path) -> None:
    bj_site, sh_site = write_site_configs(directory, 2, 1, mtu=1500)
    bj = Gateway(load_config(bj_site.config_path))
    sh = Gateway(load_config(sh_site.config_path))  # not started: it only dials
    await bj.start()
    try:
        path = sh.config.peer("bj").paths[0]
        dialed = await sh.backend.endpoint.open_link("bj", path)
        await dialed.wait_handshake(10.0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while path.name not in bj.peers["sh"].links or path.name not in sh.peers["bj"].links:
            assert loop.time() < deadline, "the path never came up"
            await asyncio.sleep(0.01)
        accepted = bj.peers["sh"].links[path.name]
        assert path.max_datagram_size == MAX_DATAGRAM_SIZE
        # the dialer sends to the listener's 4-byte ID, the listener to the dialer's none
        assert len(dialed._quic.host_cid) == 0 and len(accepted._quic.host_cid) == 4
        assert compat.peer_cid_bytes(dialed._quic) == 4
        assert compat.peer_cid_bytes(accepted._quic) == 0
        assert dialed.datagram_bytes == MAX_DATAGRAM_SIZE - 34 == 1438
        assert accepted.datagram_bytes == MAX_DATAGRAM_SIZE - 30 == 1442
        senders = (
            sh.peers["bj"].view._paths[path.name].sender,
            bj.peers["sh"].view._paths[path.name].sender,
        )
        assert [s.datagram_bytes for s in senders] == [1438, 1442]
    finally:
        await sh.close()
        await bj.close()


def test_a_gateway_pairs_links_size_datagrams_by_the_peers_connection_id(
    tmp_path: Path,
) -> None:
    asyncio.run(_gateway_links(tmp_path))
