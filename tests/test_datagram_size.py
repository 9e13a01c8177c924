"""A link's datagram size is the most a 1-RTT QUIC packet of aioquic can carry.

Two real aioquic connections (real TLS, in memory: the bytes go from one to the other
without sockets) finish their handshake, then one sends DATAGRAM frames: one of exactly
``max_datagram_size - DATAGRAM_OVERHEAD_BYTES`` bytes leaves in a packet of exactly
``max_datagram_size`` bytes, and one byte more never leaves (it would block the queue).
"""

from __future__ import annotations

from pathlib import Path

from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import DatagramFrameReceived, HandshakeCompleted
from aioquic.quic.packet import pull_quic_header

from wangate.certs import create_ca, issue_site_certificate
from wangate.net.link import DATAGRAM_OVERHEAD_BYTES

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


def test_a_full_size_datagram_fills_a_packet_and_one_more_byte_never_leaves(
    tmp_path: Path,
) -> None:
    client, server = _pair(tmp_path)
    size = MAX_DATAGRAM_SIZE - DATAGRAM_OVERHEAD_BYTES
    assert DATAGRAM_OVERHEAD_BYTES == 30
    client.send_datagram_frame(b"d" * size)
    packets = [data for data, _ in client.datagrams_to_send(now=1.0)]
    assert [len(p) for p in packets] == [MAX_DATAGRAM_SIZE]
    server.receive_datagram(packets[0], ("127.0.0.1", 1234), now=1.0)
    received = []
    while (event := server.next_event()) is not None:
        if isinstance(event, DatagramFrameReceived):
            received.append(event.data)
    assert received == [b"d" * size]

    client.send_datagram_frame(b"e" * (size + 1))
    assert [data for data, _ in client.datagrams_to_send(now=2.0)] == []
    assert len(client._datagrams_pending) == 1  # stuck: no packet can hold it
