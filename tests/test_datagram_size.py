"""A link's datagram size: what a 1-RTT QUIC packet of aioquic carries beside an ACK.

Two real aioquic connections (real TLS, in memory: the bytes go from one to the other
without sockets) finish their handshake, then one sends DATAGRAM frames: one of
``max_datagram_size - DATAGRAM_OVERHEAD_BYTES`` bytes leaves in one packet with the
ACK it owes; alone, one of ``max_datagram_size - 30`` fills a packet exactly, and one
byte more never leaves (it would block the queue).
"""

from __future__ import annotations

from pathlib import Path

from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import DatagramFrameReceived, HandshakeCompleted
from aioquic.quic.packet import pull_quic_header

from wangate.certs import create_ca, issue_site_certificate
from wangate.net.link import DATAGRAM_OVERHEAD_BYTES, QUIC_PACKET_OVERHEAD_BYTES

MAX_DATAGRAM_SIZE = 1472  # a 1500-byte IPv4 path


def _pair(tmp_path: Path) -> tuple[QuicConnection, QuicConnection]:
    create_ca(tmp_path)
    cert, key = issue_site_certificate(tmp_path, "sh")
    common = {"max_datagram_frame_size": 65536, "max_datagram_size": MAX_DATAGRAM_SIZE}
    server_cfg = QuicConfiguration(is_client=False, alpn_protocols=["t"], **common)
    server_cfg.load_cert_chain(cert, key)
    client_cfg = QuicConfiguration(is_client=True, alpn_protocols=["t"], **common)
    client_cfg.load_verify_locations(cafile=str(tmp_path / "ca.pem"))
    client_cfg.server_name = "sh"
    client = QuicConnection(configuration=client_cfg)
    client.connect(("127.0.0.2", 4433), now=0.0)
    first = [data for data, _ in client.datagrams_to_send(now=0.0)]
    header = pull_quic_header(Buffer(data=first[0]), host_cid_length=8)
    server = QuicConnection(
        configuration=server_cfg, original_destination_connection_id=header.destination_cid
    )
    pending = first
    now = 0.0
    for _ in range(10):  # the handshake's flights
        for data in pending:
            server.receive_datagram(data, ("127.0.0.1", 1234), now=now)
        back = [data for data, _ in server.datagrams_to_send(now=now)]
        for data in back:
            client.receive_datagram(data, ("127.0.0.2", 4433), now=now)
        pending = [data for data, _ in client.datagrams_to_send(now=now)]
        now += 0.01
    done = []
    for connection in (client, server):
        while (event := connection.next_event()) is not None:
            done.append(isinstance(event, HandshakeCompleted))
    assert sum(done) == 2
    return client, server


def test_a_full_size_datagram_rides_with_an_ack_and_the_packet_limit_is_exact(
    tmp_path: Path,
) -> None:
    client, server = _pair(tmp_path)
    assert QUIC_PACKET_OVERHEAD_BYTES == 30 and DATAGRAM_OVERHEAD_BYTES == 40
    # the server sends something, so the client owes it an ACK when it sends next
    server.send_datagram_frame(b"x" * 100)
    for data, _ in server.datagrams_to_send(now=1.0):
        client.receive_datagram(data, ("127.0.0.2", 4433), now=1.0)
    size = MAX_DATAGRAM_SIZE - DATAGRAM_OVERHEAD_BYTES
    client.send_datagram_frame(b"d" * size)
    packets = [data for data, _ in client.datagrams_to_send(now=1.01)]
    assert len(packets) == 1  # the ACK and the datagram in one packet
    assert len(packets[0]) <= MAX_DATAGRAM_SIZE
    server.receive_datagram(packets[0], ("127.0.0.1", 1234), now=1.01)
    assert _received(server) == [b"d" * size]

    # alone, a datagram may take all but QUIC's 30 bytes; one byte more never leaves
    limit = MAX_DATAGRAM_SIZE - QUIC_PACKET_OVERHEAD_BYTES
    client.send_datagram_frame(b"e" * limit)
    packets = [data for data, _ in client.datagrams_to_send(now=2.0)]
    assert [len(p) for p in packets] == [MAX_DATAGRAM_SIZE]
    server.receive_datagram(packets[0], ("127.0.0.1", 1234), now=2.0)
    assert _received(server) == [b"e" * limit]
    client.send_datagram_frame(b"f" * (limit + 1))
    assert [data for data, _ in client.datagrams_to_send(now=3.0)] == []
    assert len(client._datagrams_pending) == 1  # stuck: no packet can hold it


def _received(connection: QuicConnection) -> list[bytes]:
    received = []
    while (event := connection.next_event()) is not None:
        if isinstance(event, DatagramFrameReceived):
            received.append(event.data)
    return received
