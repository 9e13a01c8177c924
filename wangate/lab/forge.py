"""Hostile QUIC packets for the flood benchmark and tests, sent only to loopback.

- :func:`forged_initial`: a 1200-byte long-header Initial (RFC 9000 §17.2.2) with
  random connection IDs and an undecryptable payload, optionally with a token;
- :func:`short_header_garbage`: a 1-RTT-looking packet for no known connection;
- :class:`SpoofingSender`: sends UDP datagrams from any 127.0.0.0/8 source through a
  raw socket (root only), for floods from many spoofed addresses;
- :func:`validated_initials`: does the Retry exchange from a real address and returns
  Initials with valid tokens (and garbage payloads), the costliest thing a source that
  is not a peer can send.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

from aioquic.quic.packet import QuicPacketType, pull_quic_header

from wangate.net.aioquic_compat import Buffer

INITIAL_BYTES = 1200
QUIC_V1 = 0x00000001


def _varint(value: int) -> bytes:
    if value < 0x40:
        return bytes([value])
    if value < 0x4000:
        return struct.pack("!H", 0x4000 | value)
    return struct.pack("!I", 0x80000000 | value)


def forged_initial(
    *, token: bytes = b"", destination_cid: bytes | None = None, size: int = INITIAL_BYTES
) -> bytes:
    dcid = destination_cid if destination_cid is not None else os.urandom(8)
    scid = os.urandom(8)
    head = (
        bytes([0xC3])  # long header, fixed bit, Initial, 4-byte packet number
        + struct.pack("!I", QUIC_V1)
        + bytes([len(dcid)])
        + dcid
        + bytes([len(scid)])
        + scid
        + _varint(len(token))
        + token
    )
    rest = size - len(head) - 2
    return head + _varint(rest) + os.urandom(rest)


def short_header_garbage(size: int = 1200) -> bytes:
    return bytes([0x40 | (os.urandom(1)[0] & 0x3F)]) + os.urandom(size - 1)


def looks_like_token() -> bytes:
    """Random bytes of the size of an aioquic Retry token for an IPv4 client."""
    return os.urandom(12 + 7 + 9 + 9 + 8 + 16)


def validated_initials(
    sock: socket.socket, target: tuple[str, int], count: int, timeout_s: float = 1.0
) -> list[bytes]:
    """Initials with tokens the server at ``target`` issued to ``sock``'s address.

    Each Initial has the Retry's connection ID and token, and a payload nobody can
    decrypt; sending them makes the server admit half-open connections.
    """
    sock.settimeout(timeout_s)
    packets: list[bytes] = []
    for _ in range(count):
        sock.sendto(forged_initial(), target)
        try:
            while True:
                data, _addr = sock.recvfrom(2048)
                header = pull_quic_header(Buffer(data=data), host_cid_length=8)
                if header.packet_type == QuicPacketType.RETRY:
                    break
        except TimeoutError:
            continue  # the server's answer budget ran out; this one stays unanswered
        packets.append(forged_initial(token=header.token, destination_cid=header.source_cid))
    return packets


class SpoofingSender:
    """UDP datagrams with any source address in 127.0.0.0/8, built by hand (root only)."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)

    def sendto(self, payload: bytes, source: tuple[str, int], target: tuple[str, int]) -> None:
        for host in (source[0], target[0]):
            if ipaddress.ip_address(host) not in ipaddress.ip_network("127.0.0.0/8"):
                raise ValueError(f"{host} is not a loopback address")
        src = socket.inet_aton(source[0])
        dst = socket.inet_aton(target[0])
        udp = struct.pack("!HHHH", source[1], target[1], 8 + len(payload), 0)  # no checksum
        # version/IHL, TOS, total length, id, fragment, TTL, UDP, checksum (kernel), src, dst
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 0, 0, 64, 17, 0, src, dst)
        self._sock.sendto(ip + udp + payload, (target[0], 0))

    def close(self) -> None:
        self._sock.close()
