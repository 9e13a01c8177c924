"""CPU of writing a full DATAGRAM frame: aioquic's writer against wangate's length-less one.

    python -m bench transport datagram

Process time per 1-RTT packet built with one DATAGRAM frame (a fresh packet builder,
the frame, encryption), best of 5 rounds of 20 000, for a link's full datagram (the
length form: the wrapper's check, then aioquic's writer) and for one that fills the
packet (the length-less form, RFC 9221 §4), against aioquic's own writer on a datagram
of the same packet size with its length.
"""

from __future__ import annotations

import argparse
import time

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.crypto import CryptoPair
from aioquic.quic.packet import QuicFrameType, QuicPacketType, QuicProtocolVersion
from aioquic.quic.packet_builder import QuicPacketBuilder

from wangate.net import aioquic_compat as compat
from wangate.net.link import ACK_ROOM_BYTES, SERVER_CID_BYTES, datagram_overhead_bytes

MAX_DATAGRAM_SIZE = 1472  # a 1500-byte IPv4 path
ROUNDS, PACKETS = 5, 20_000


def per_packet_us(connection: QuicConnection, size: int) -> float:
    crypto = CryptoPair()
    crypto.setup_initial(b"12345678", is_client=True, version=QuicProtocolVersion.VERSION_1)
    data = b"x" * size
    peer_cid = bytes(SERVER_CID_BYTES)
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.process_time()
        for _ in range(PACKETS):
            builder = QuicPacketBuilder(
                host_cid=b"",
                peer_cid=peer_cid,
                version=QuicProtocolVersion.VERSION_1,
                is_client=True,
                max_datagram_size=MAX_DATAGRAM_SIZE,
            )
            builder.start_packet(QuicPacketType.ONE_RTT, crypto)
            compat.write_datagram_frame(
                connection, builder, data, QuicFrameType.DATAGRAM_WITH_LENGTH
            )
            builder.flush()
        best = min(best, (time.process_time() - start) / PACKETS)
    return best * 1e6


def main(argv: list[str]) -> None:
    argparse.ArgumentParser(
        prog="python -m bench transport datagram", description=__doc__
    ).parse_args(argv)
    plain = QuicConnection(configuration=QuicConfiguration(is_client=True))
    wrapped = QuicConnection(configuration=QuicConfiguration(is_client=True))
    compat.datagram_frames_without_length(wrapped)
    link = MAX_DATAGRAM_SIZE - datagram_overhead_bytes(SERVER_CID_BYTES)
    full = link + ACK_ROOM_BYTES
    for label, size, aioquic_size in (
        ("a link's full datagram (length form)", link, link),
        ("a datagram filling the packet (no length)", full, full - 2),
    ):
        before, after = per_packet_us(plain, aioquic_size), per_packet_us(wrapped, size)
        print(
            f"{label}: aioquic {before:.2f} us, wangate {after:.2f} us per packet "
            f"(+{after - before:.2f} us)"
        )
