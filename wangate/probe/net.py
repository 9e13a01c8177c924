"""The asyncio shell of ``wangate probe``: a UDP responder and a UDP prober.

Timestamps are ``time.monotonic_ns()`` taken next to the socket calls; everything else
(packet format, counting, statistics, verdict) lives in the pure modules beside this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from wangate.errors import ConfigError, RemoteProtocolError
from wangate.net.address import host_port
from wangate.net.sockbuf import enlarge_socket_buffers
from wangate.probe.analysis import (
    DEFAULT_THRESHOLDS,
    EchoSample,
    LatencySummary,
    RateStep,
    RateSummary,
    VerdictThresholds,
    judge,
    rate_plan,
    report_dict,
    summarize_latency,
    summarize_rate,
)
from wangate.probe.packets import (
    HEAD_BYTES,
    MAX_PACKET_BYTES,
    NO_COUNTS,
    REPORT_BYTES,
    PacketKind,
    ProbePacket,
    RateCounts,
    decode,
    encode,
)
from wangate.probe.responder import ProbeResponder

log = logging.getLogger("wangate.probe")

DEFAULT_PORT = 7444
IDLE_CHECK_S = 0.5
MAX_SEND_BUFFER_BYTES = 256 * 1024  # beyond this queued locally, the sender is the limit
QUERY_ATTEMPTS = 5
MAX_LOGGED_CLIENTS = 100
MAX_PROBE_RATE_HZ = 400.0  # the responder answers 500 a second at most
MIN_STEP_S = 0.2


def parse_address(text: str, *, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``IP``, ``IP:PORT`` or ``[IPv6]:PORT``; IP literals only (a probe names a route)."""
    host, port_text = text, str(default_port)
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError(f"{text!r}: write an IPv6 address as [ADDRESS]:PORT")
        port_text = rest[1:] or port_text
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{text!r}: {host!r} is not an IP address") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{text!r}: port {port_text!r} is not a number in 0..65535")
    return str(address), int(port_text)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET


# ------------------------------------------------------------------ responder


class _ResponderProtocol(asyncio.DatagramProtocol):
    def __init__(self, responder: ProbeResponder) -> None:
        self.responder = responder
        self.transport: asyncio.DatagramTransport | None = None
        self.clients: set[Any] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        reply = self.responder.handle(data, addr, time.monotonic_ns())
        if reply is None or self.transport is None:
            return
        self.transport.sendto(reply, addr)
        if addr[0] not in self.clients and len(self.clients) < MAX_LOGGED_CLIENTS:
            self.clients.add(addr[0])
            log.warning("probed by %s", host_port(*addr[:2]))

    def error_received(self, exc: Exception) -> None:
        log.debug("responder socket error: %s", exc)


async def serve_responder(
    listen: tuple[str, int],
    *,
    idle_timeout_s: float | None,
    ready: Callable[[tuple[str, int]], None] | None = None,
) -> ProbeResponder:
    """Answer probes on ``listen`` until idle for ``idle_timeout_s`` (None: until cancelled)."""
    loop = asyncio.get_running_loop()
    responder = ProbeResponder(time.monotonic_ns())
    transport, _ = await loop.create_datagram_endpoint(
        lambda: _ResponderProtocol(responder), local_addr=listen, family=_family(listen[0])
    )
    enlarge_socket_buffers(transport.get_extra_info("socket"))  # bursts of rate data
    try:
        bound = transport.get_extra_info("sockname")
        if ready is not None:
            ready((str(bound[0]), int(bound[1])))
        while idle_timeout_s is None or responder.idle_for_s(time.monotonic_ns()) < idle_timeout_s:
            await asyncio.sleep(IDLE_CHECK_S)
        log.warning("no probe for %g s: responder exits", idle_timeout_s)
    finally:
        transport.close()
    return responder


# --------------------------------------------------------------------- prober


@dataclass(frozen=True)
class ProbeOptions:
    target: tuple[str, int]
    local: str | None = None
    duration_s: float = 10.0  # latency phase, then rate phase, about half each
    rate_cap_bps: float = 100e6
    probe_rate_hz: float = 20.0
    echo_bytes: int = 64
    data_bytes: int = 1200
    rate_test: bool = True

    def __post_init__(self) -> None:
        if not self.duration_s > 0 or not self.rate_cap_bps > 0:
            raise ConfigError("--duration and --rate-mbps must be > 0")
        if not 0 < self.probe_rate_hz <= MAX_PROBE_RATE_HZ:
            raise ConfigError(f"--probe-rate must be in (0, {MAX_PROBE_RATE_HZ:g}] per second")
        for name, size in (("echo", self.echo_bytes), ("--size", self.data_bytes)):
            if not HEAD_BYTES <= size <= MAX_PACKET_BYTES:
                raise ConfigError(f"{name}: packets are {HEAD_BYTES}..{MAX_PACKET_BYTES} bytes")
        if self.local is not None:
            try:
                local = ipaddress.ip_address(self.local)
            except ValueError:
                raise ConfigError(f"--local {self.local!r} is not an IP address") from None
            if local.version != ipaddress.ip_address(self.target[0]).version:
                raise ConfigError(f"--local {self.local} and {self.target[0]}: IPv4 and IPv6 mixed")


@dataclass(frozen=True)
class ProbeResult:
    target: str
    local: str
    latency: LatencySummary
    rate: RateSummary | None


class _ProberProtocol(asyncio.DatagramProtocol):
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = (ipaddress.ip_address(target[0]), target[1])
        self.echo_test_id = 0  # replies to other ids (an earlier run, a stray) do not count
        self.replies: dict[int, tuple[int, int]] = {}  # seq: (reply_ns, echo_ns)
        self.reports: dict[int, asyncio.Future[RateCounts]] = {}
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        now_ns = time.monotonic_ns()
        if (ipaddress.ip_address(addr[0]), addr[1]) != self.target:
            return
        try:
            packet = decode(data)
        except RemoteProtocolError:
            return
        if packet.kind == PacketKind.ECHO_REPLY and packet.test_id == self.echo_test_id:
            self.replies.setdefault(packet.seq, (now_ns, packet.echo_ns))
        elif packet.kind == PacketKind.RATE_REPORT and packet.counts is not None:
            future = self.reports.get(packet.test_id)
            if future is not None and not future.done():
                future.set_result(packet.counts)

    def error_received(self, exc: Exception) -> None:
        log.debug("prober socket error: %s", exc)  # e.g. ICMP port unreachable


def _queued_bytes(transport: asyncio.DatagramTransport) -> int:
    """Bytes the event loop holds because the socket would block (0 if it cannot say)."""
    size = getattr(transport, "get_write_buffer_size", None)
    return int(size()) if callable(size) else 0


async def _sleep_until(deadline: float) -> None:
    delay_s = deadline - time.monotonic()
    if delay_s > 0:
        await asyncio.sleep(delay_s)


async def run_probe(options: ProbeOptions) -> ProbeResult:
    loop = asyncio.get_running_loop()
    family = _family(options.target[0])
    local_host = options.local or ("::" if family == socket.AF_INET6 else "0.0.0.0")
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: _ProberProtocol(options.target),
        local_addr=(local_host, 0),
        remote_addr=options.target,
        family=family,
    )
    enlarge_socket_buffers(transport.get_extra_info("socket"))
    try:
        local = host_port(*transport.get_extra_info("sockname")[:2])
        phase_s = options.duration_s / 2 if options.rate_test else options.duration_s
        latency = await _latency_phase(protocol, transport, options, phase_s)
        rate = None
        if options.rate_test and latency.received:
            rate = await _rate_phase(protocol, transport, options, phase_s, latency)
        return ProbeResult(host_port(*options.target), local, latency, rate)
    finally:
        transport.close()


async def probe_report(
    options: ProbeOptions, thresholds: VerdictThresholds = DEFAULT_THRESHOLDS
) -> dict[str, Any]:
    """Probe, judge, and return the report document (``--json`` prints it as is)."""
    result = await run_probe(options)
    verdict = judge(result.latency, result.rate, thresholds)
    return report_dict(
        result.target, result.local, result.latency, result.rate, verdict, thresholds
    )


async def _latency_phase(
    protocol: _ProberProtocol,
    transport: asyncio.DatagramTransport,
    options: ProbeOptions,
    phase_s: float,
) -> LatencySummary:
    protocol.echo_test_id = random.getrandbits(64)
    interval_s = 1 / options.probe_rate_hz
    count = max(1, round(phase_s * options.probe_rate_hz))
    sent: list[int] = []
    start = time.monotonic()
    for seq in range(count):
        await _sleep_until(start + seq * interval_s)
        sent_ns = time.monotonic_ns()
        packet = ProbePacket(
            PacketKind.ECHO_REQUEST, protocol.echo_test_id, seq, sent_ns,
            size_bytes=options.echo_bytes,
        )  # fmt: skip
        transport.sendto(encode(packet))
        sent.append(sent_ns)
    # Late replies: wait a few of the slowest round trips seen, within bounds.
    rtts = [reply - sent[seq] for seq, (reply, _) in protocol.replies.items()]
    grace_s = min(1.0, max(0.2, 4 * max(rtts, default=250_000_000) / 1e9))
    deadline = time.monotonic() + grace_s
    while len(protocol.replies) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    samples = []
    for seq, sent_ns in enumerate(sent):
        reply = protocol.replies.get(seq)
        samples.append(
            EchoSample(seq, sent_ns, None)
            if reply is None
            else EchoSample(seq, sent_ns, reply[0], reply[1])
        )
    protocol.echo_test_id = 0  # later replies are not counted
    return summarize_latency(samples)


async def _rate_phase(
    protocol: _ProberProtocol,
    transport: asyncio.DatagramTransport,
    options: ProbeOptions,
    phase_s: float,
    latency: LatencySummary,
) -> RateSummary:
    plan = rate_plan(options.rate_cap_bps)
    step_s = max(MIN_STEP_S, phase_s / len(plan))
    rtt_s = latency.rtt_p99_s or 0.25
    steps: list[RateStep] = []
    for target_bps in plan:
        step = await _rate_step(protocol, transport, options, target_bps, step_s, rtt_s)
        steps.append(step)
        if step.ends_phase():
            break
    return summarize_rate(steps, len(plan))


async def _rate_step(
    protocol: _ProberProtocol,
    transport: asyncio.DatagramTransport,
    options: ProbeOptions,
    target_bps: float,
    step_s: float,
    rtt_s: float,
) -> RateStep:
    test_id = random.getrandbits(64)
    size = options.data_bytes
    packets = bytes_sent = 0
    start = time.monotonic()
    end = start + step_s
    while (now := time.monotonic()) < end:
        # credit by elapsed time, so timer granularity makes bursts, not a lower rate
        due_bytes = (now - start) * target_bps / 8 + size
        if _queued_bytes(transport) < MAX_SEND_BUFFER_BYTES:
            while bytes_sent + size <= due_bytes:
                packets += 1
                packet = ProbePacket(
                    PacketKind.RATE_DATA, test_id, packets, time.monotonic_ns(), size_bytes=size
                )
                transport.sendto(encode(packet))
                bytes_sent += size
        await asyncio.sleep(0.001)
    send_duration_s = time.monotonic() - start
    await asyncio.sleep(min(0.5, max(0.05, 2 * rtt_s)))  # the last packets still arrive
    counts = await _query(protocol, transport, test_id, rtt_s)
    return RateStep(
        target_bps,
        packets,
        bytes_sent,
        send_duration_s,
        counts if counts is not None else NO_COUNTS,
        reported=counts is not None,
    )


async def _query(
    protocol: _ProberProtocol, transport: asyncio.DatagramTransport, test_id: int, rtt_s: float
) -> RateCounts | None:
    future: asyncio.Future[RateCounts] = asyncio.get_running_loop().create_future()
    protocol.reports[test_id] = future
    try:
        for attempt in range(QUERY_ATTEMPTS):
            query = ProbePacket(
                PacketKind.RATE_QUERY, test_id, attempt, time.monotonic_ns(),
                size_bytes=REPORT_BYTES,
            )  # fmt: skip
            transport.sendto(encode(query))
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(future), max(0.2, 3 * rtt_s))
        return None
    finally:
        del protocol.reports[test_id]
