"""The far side of ``wangate probe``, without I/O: what to answer, and whether to.

Safe to leave running on a public address for a while:

* only exactly well-formed probe packets (``packets.decode``) get any reaction;
* a reply is never larger than the packet that caused it (echo replies have the
  request's size, rate reports the query's), so the responder cannot amplify;
* replies are rate-limited by two token buckets (packets and bytes per second);
* rate data is only counted, never answered; the table of counts is bounded;
* ``idle_for_s`` lets the shell exit when nobody has probed for a while.

Time comes in as ``now_ns`` (monotonic nanoseconds), for the rate limit and idleness;
a datagram's arrival time (the kernel's stamp, any clock) as ``arrival_ns``: that is what
goes out as ``echo_ns`` and into rate reports, so the prober can compute one-way jitter
and arrival spans from it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from wangate.errors import RemoteProtocolError
from wangate.probe.packets import (
    REPORT_BYTES,
    PacketKind,
    ProbePacket,
    RateCounts,
    decode,
    encode,
)

REPLY_PACKETS_PER_S = 500.0
REPLY_PACKET_BURST = 100.0
REPLY_BYTES_PER_S = 1_000_000.0
REPLY_BYTE_BURST = 128_000.0
MAX_RATE_TESTS = 256  # (address, test id) entries kept for rate reports


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float, now_ns: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = burst
        self.updated_ns = now_ns

    def take(self, amount: float, now_ns: int) -> bool:
        elapsed_s = max(0, now_ns - self.updated_ns) / 1e9
        self.tokens = min(self.burst, self.tokens + elapsed_s * self.rate_per_s)
        self.updated_ns = max(self.updated_ns, now_ns)
        if self.tokens < amount:
            return False
        self.tokens -= amount
        return True


class _RateTest:
    __slots__ = ("first_ns", "last_ns", "max_seq", "packets", "received_bytes")

    def __init__(self, now_ns: int) -> None:
        self.packets = 0
        self.received_bytes = 0
        self.first_ns = now_ns
        self.last_ns = now_ns
        self.max_seq = 0


class ProbeResponder:
    """Feed it datagrams with their source address; send back what it returns."""

    def __init__(
        self,
        now_ns: int,
        *,
        reply_packets_per_s: float = REPLY_PACKETS_PER_S,
        reply_bytes_per_s: float = REPLY_BYTES_PER_S,
        max_rate_tests: int = MAX_RATE_TESTS,
    ) -> None:
        self._packet_bucket = TokenBucket(reply_packets_per_s, REPLY_PACKET_BURST, now_ns)
        self._byte_bucket = TokenBucket(reply_bytes_per_s, REPLY_BYTE_BURST, now_ns)
        self._max_rate_tests = max_rate_tests
        self._tests: OrderedDict[tuple[Any, int], _RateTest] = OrderedDict()
        self.last_valid_ns = now_ns
        self.malformed = 0
        self.refused_replies = 0  # answers withheld by the rate limit
        self.replies = 0

    def idle_for_s(self, now_ns: int) -> float:
        return max(0, now_ns - self.last_valid_ns) / 1e9

    def handle(
        self, data: bytes, address: Any, now_ns: int, *, arrival_ns: int | None = None
    ) -> bytes | None:
        """The reply to send to ``address``, or None. ``arrival_ns``: when the datagram
        arrived, on any clock (the kernel's stamp); what goes out as ``echo_ns`` and in
        rate reports. ``now_ns`` (monotonic) paces replies and tells idleness."""
        stamp_ns = now_ns if arrival_ns is None else arrival_ns
        try:
            packet = decode(data)
        except RemoteProtocolError:
            self.malformed += 1
            return None
        kind = packet.kind
        if kind == PacketKind.RATE_DATA:
            self.last_valid_ns = now_ns
            self._count(packet, len(data), address, stamp_ns)
            return None
        if kind == PacketKind.ECHO_REQUEST:
            reply = ProbePacket(
                PacketKind.ECHO_REPLY,
                packet.test_id,
                packet.seq,
                packet.sent_ns,
                echo_ns=stamp_ns,
                size_bytes=len(data),
            )
        elif kind == PacketKind.RATE_QUERY:
            test = self._tests.get((address, packet.test_id))
            counts = (
                RateCounts(0, 0, 0, 0, 0)
                if test is None
                else RateCounts(
                    test.packets, test.received_bytes, test.first_ns, test.last_ns, test.max_seq
                )
            )
            reply = ProbePacket(
                PacketKind.RATE_REPORT,
                packet.test_id,
                packet.seq,
                packet.sent_ns,
                echo_ns=stamp_ns,
                size_bytes=REPORT_BYTES,
                counts=counts,
            )
        else:
            return None  # replies and reports are for probers, not for us
        self.last_valid_ns = now_ns
        if not self._packet_bucket.take(1, now_ns) or not self._byte_bucket.take(
            reply.size_bytes, now_ns
        ):
            self.refused_replies += 1
            return None
        self.replies += 1
        out = encode(reply)
        assert len(out) <= len(data)  # never amplify
        return out

    def _count(self, packet: ProbePacket, size_bytes: int, address: Any, now_ns: int) -> None:
        key = (address, packet.test_id)
        test = self._tests.get(key)
        if test is None:
            test = self._tests[key] = _RateTest(now_ns)
            while len(self._tests) > self._max_rate_tests:
                self._tests.popitem(last=False)
        test.packets = min(test.packets + 1, (1 << 32) - 1)
        test.received_bytes += size_bytes
        test.last_ns = now_ns
        test.max_seq = max(test.max_seq, packet.seq)
