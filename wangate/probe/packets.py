"""Probe packets (``proto/probe.md``): encode, decode, and refuse anything malformed.

Every packet is one UDP datagram with a fixed 36-byte head; echo and rate-data packets
are padded with zero bytes to the size the prober chose, rate queries and reports have
exactly ``REPORT_BYTES``. All integers are unsigned and big-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from wangate.errors import LocalProtocolError, RemoteProtocolError

MAGIC = b"WGPR"
VERSION = 1
HEAD = struct.Struct(">4sBBHQIQQ")  # magic, version, kind, flags, test_id, seq, sent_ns, echo_ns
HEAD_BYTES = HEAD.size  # 36
COUNTS = struct.Struct(">IQQQI")  # packets, bytes, first_ns, last_ns, max_seq
REPORT_BYTES = HEAD_BYTES + COUNTS.size  # 68: rate queries are padded to this too
MAX_PACKET_BYTES = 9000  # a jumbo frame's payload; larger datagrams are refused
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


class PacketKind(IntEnum):
    ECHO_REQUEST = 1
    ECHO_REPLY = 2
    RATE_DATA = 3
    RATE_QUERY = 4
    RATE_REPORT = 5


PADDED_KINDS = (PacketKind.ECHO_REQUEST, PacketKind.ECHO_REPLY, PacketKind.RATE_DATA)


@dataclass(frozen=True)
class RateCounts:
    """What the responder saw of one rate test (from one prober address)."""

    packets: int
    received_bytes: int  # whole UDP payloads
    first_ns: int  # responder clock at the first and the last packet
    last_ns: int
    max_seq: int


NO_COUNTS = RateCounts(0, 0, 0, 0, 0)


@dataclass(frozen=True)
class ProbePacket:
    kind: PacketKind
    test_id: int  # chosen by the prober, one per phase or rate step
    seq: int
    sent_ns: int  # prober clock; echoed back unchanged
    echo_ns: int = 0  # responder clock in replies and reports; 0 in what the prober sends
    size_bytes: int = HEAD_BYTES  # datagram size (padding included)
    counts: RateCounts | None = None  # rate reports only


def encode(packet: ProbePacket) -> bytes:
    kind = packet.kind
    size = packet.size_bytes
    if kind in PADDED_KINDS:
        if not HEAD_BYTES <= size <= MAX_PACKET_BYTES:
            raise LocalProtocolError(f"probe packets are {HEAD_BYTES}..{MAX_PACKET_BYTES} bytes")
    elif size != REPORT_BYTES:
        raise LocalProtocolError(f"rate queries and reports are {REPORT_BYTES} bytes")
    if (packet.counts is not None) != (kind == PacketKind.RATE_REPORT):
        raise LocalProtocolError("counts go in rate reports and nowhere else")
    _check_range(packet.test_id, U64_MAX, "test_id")
    _check_range(packet.seq, U32_MAX, "seq")
    _check_range(packet.sent_ns, U64_MAX, "sent_ns")
    _check_range(packet.echo_ns, U64_MAX, "echo_ns")
    head = HEAD.pack(
        MAGIC, VERSION, kind, 0, packet.test_id, packet.seq, packet.sent_ns, packet.echo_ns
    )
    if packet.counts is not None:
        c = packet.counts
        for value, limit, name in (
            (c.packets, U32_MAX, "packets"),
            (c.received_bytes, U64_MAX, "received_bytes"),
            (c.first_ns, U64_MAX, "first_ns"),
            (c.last_ns, U64_MAX, "last_ns"),
            (c.max_seq, U32_MAX, "max_seq"),
        ):
            _check_range(value, limit, name)
        return head + COUNTS.pack(c.packets, c.received_bytes, c.first_ns, c.last_ns, c.max_seq)
    return head + bytes(size - HEAD_BYTES)


def decode(data: bytes | bytearray | memoryview) -> ProbePacket:
    """One datagram; raises ``RemoteProtocolError`` unless it is exactly well-formed."""
    size = len(data)
    if size < HEAD_BYTES:
        raise RemoteProtocolError(f"probe packet of {size} bytes is shorter than its head")
    if size > MAX_PACKET_BYTES:
        raise RemoteProtocolError(f"probe packet of {size} bytes exceeds {MAX_PACKET_BYTES}")
    magic, version, kind_code, flags, test_id, seq, sent_ns, echo_ns = HEAD.unpack_from(data)
    if magic != MAGIC:
        raise RemoteProtocolError("not a wangate probe packet (bad magic)")
    if version != VERSION:
        raise RemoteProtocolError(f"probe version {version}; this side speaks {VERSION}")
    try:
        kind = PacketKind(kind_code)
    except ValueError:
        raise RemoteProtocolError(f"unknown probe packet kind {kind_code}") from None
    if flags != 0:
        raise RemoteProtocolError(f"reserved flags set: {flags:#06x}")
    if kind in (PacketKind.ECHO_REQUEST, PacketKind.RATE_DATA, PacketKind.RATE_QUERY) and echo_ns:
        raise RemoteProtocolError("echo_ns must be 0 in what a prober sends")
    counts = None
    if kind in PADDED_KINDS:
        body = memoryview(data)[HEAD_BYTES:]
    else:
        if size != REPORT_BYTES:
            raise RemoteProtocolError(f"{kind.name} of {size} bytes; it must be {REPORT_BYTES}")
        body = memoryview(data)[HEAD_BYTES:]
        if kind == PacketKind.RATE_REPORT:
            counts = RateCounts(*COUNTS.unpack_from(data, HEAD_BYTES))
            body = body[:0]
    if bytes(body).count(0) != len(body):  # C speed: rate data arrives by the thousand
        raise RemoteProtocolError("padding must be zero bytes")
    return ProbePacket(kind, test_id, seq, sent_ns, echo_ns, size, counts)


def _check_range(value: int, limit: int, name: str) -> None:
    if not 0 <= value <= limit:
        raise LocalProtocolError(f"{name} {value} out of range 0..{limit}")
