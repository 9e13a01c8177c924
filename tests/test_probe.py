"""``wangate probe``: packet format, responder rules, statistics, verdict, real sockets."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from wangate.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from wangate.probe.analysis import (
    EchoSample,
    LatencySummary,
    VerdictThresholds,
    format_report,
    judge,
    percentile,
    report_dict,
    rfc3550_jitter,
    summarize_latency,
)
from wangate.probe.loss import LossEstimate
from wangate.probe.net import ProbeOptions, parse_address, probe_report, run_probe, serve_responder
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
from wangate.probe.rate import RateSummary
from wangate.probe.responder import REPLY_PACKET_BURST, ProbeResponder

pytestmark = pytest.mark.timeout(60)

VECTORS = Path(__file__).resolve().parent.parent / "proto" / "vectors"
MS = 1_000_000  # ns

# ------------------------------------------------------------------- packets


def load_vector(path: Path) -> tuple[dict[str, Any], bytes]:
    lines = path.read_text().splitlines()
    (fields_line,) = [line for line in lines if line.startswith("# fields: ")]
    fields = json.loads(fields_line.removeprefix("# fields: "))
    return fields, bytes.fromhex(" ".join(line for line in lines if not line.startswith("#")))


def packet_from_fields(f: dict[str, Any]) -> ProbePacket:
    counts = f.get("counts")
    return ProbePacket(
        PacketKind[f["kind"].upper()],
        f["test_id"],
        f["seq"],
        f["sent_ns"],
        f["echo_ns"],
        f["size_bytes"],
        None if counts is None else RateCounts(**counts),
    )


VECTOR_FILES = sorted(VECTORS.glob("probe_*.hex"))


def test_vectors_cover_every_packet_kind() -> None:
    kinds = {load_vector(p)[0]["kind"] for p in VECTOR_FILES}
    assert kinds == {k.name.lower() for k in PacketKind}


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_golden_vectors_encode_and_decode_exactly(path: Path) -> None:
    fields, raw = load_vector(path)
    packet = packet_from_fields(fields)
    assert encode(packet) == raw
    assert decode(raw) == packet


def test_head_layout() -> None:
    raw = encode(ProbePacket(PacketKind.ECHO_REQUEST, 0x1122334455667788, 0x0A0B0C0D, 0x99))
    assert raw == bytes.fromhex(
        "57475052 01 01 0000 1122334455667788 0a0b0c0d 0000000000000099 0000000000000000"
    )
    assert HEAD_BYTES == 36 and REPORT_BYTES == 68


def valid_echo(size: int = 64) -> bytearray:
    return bytearray(encode(ProbePacket(PacketKind.ECHO_REQUEST, 1, 2, 3, size_bytes=size)))


def with_byte(data: bytes | bytearray, index: int, value: int) -> bytes:
    out = bytearray(data)
    out[index] = value
    return bytes(out)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "shorter than its head"),
        (bytes(valid_echo())[:35], "shorter than its head"),
        (bytes(MAX_PACKET_BYTES + 1), "exceeds"),
        (with_byte(valid_echo(), 0, ord("X")), "bad magic"),
        (with_byte(valid_echo(), 4, 2), "version 2"),
        (with_byte(valid_echo(), 5, 0), "unknown probe packet kind 0"),
        (with_byte(valid_echo(), 5, 6), "unknown probe packet kind 6"),
        (with_byte(valid_echo(), 7, 1), "reserved flags"),
        (with_byte(valid_echo(), 63, 1), "padding must be zero"),
        (with_byte(valid_echo(), 35, 1), "echo_ns must be 0"),  # in a request
        (bytes(valid_echo(68))[:5] + bytes([4]) + bytes(valid_echo(68))[6:67], "must be 68"),
        (
            encode(ProbePacket(PacketKind.RATE_QUERY, 1, 0, 0, size_bytes=REPORT_BYTES)) + b"\0",
            "must be 68",
        ),
        (
            with_byte(
                encode(ProbePacket(PacketKind.RATE_QUERY, 1, 0, 0, size_bytes=REPORT_BYTES)), 67, 1
            ),
            "padding must be zero",
        ),
    ],
)
def test_malformed_packets_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        decode(data)


def test_encode_refuses_what_it_cannot_write() -> None:
    with pytest.raises(LocalProtocolError):
        encode(ProbePacket(PacketKind.ECHO_REQUEST, 1, 1, 1, size_bytes=HEAD_BYTES - 1))
    with pytest.raises(LocalProtocolError):
        encode(ProbePacket(PacketKind.RATE_QUERY, 1, 1, 1, size_bytes=64))
    with pytest.raises(LocalProtocolError):
        encode(ProbePacket(PacketKind.ECHO_REQUEST, 1, 1 << 32, 1))
    with pytest.raises(LocalProtocolError):
        encode(ProbePacket(PacketKind.RATE_REPORT, 1, 1, 1, size_bytes=REPORT_BYTES))  # no counts
    with pytest.raises(LocalProtocolError):
        encode(ProbePacket(PacketKind.ECHO_REPLY, 1, 1, 1, counts=NO_COUNTS))


# ----------------------------------------------------------------- responder

ADDR = ("192.0.2.1", 5000)


def test_echo_reply_has_the_request_size_and_the_responder_clock() -> None:
    responder = ProbeResponder(0)
    request = encode(ProbePacket(PacketKind.ECHO_REQUEST, 9, 4, 1234, size_bytes=200))
    reply = responder.handle(request, ADDR, 5 * MS)
    assert reply is not None
    assert len(reply) == 200
    assert decode(reply) == ProbePacket(
        PacketKind.ECHO_REPLY, 9, 4, 1234, echo_ns=5 * MS, size_bytes=200
    )


def test_arrival_stamps_go_out_and_monotonic_time_paces() -> None:
    responder = ProbeResponder(0)
    request = encode(ProbePacket(PacketKind.ECHO_REQUEST, 9, 4, 1234, size_bytes=64))
    reply = responder.handle(request, ADDR, 5 * MS, arrival_ns=1_700_000_000 * 10**9)
    assert reply is not None and decode(reply).echo_ns == 1_700_000_000 * 10**9
    for seq, arrival_ms in ((1, 100), (2, 103)):
        data = encode(ProbePacket(PacketKind.RATE_DATA, 5, seq, 0, size_bytes=100))
        responder.handle(data, ADDR, 6 * MS, arrival_ns=arrival_ms * MS)
    query = encode(ProbePacket(PacketKind.RATE_QUERY, 5, 0, 0, size_bytes=REPORT_BYTES))
    report = responder.handle(query, ADDR, 7 * MS, arrival_ns=200 * MS)
    assert report is not None
    assert decode(report).counts == RateCounts(2, 200, 100 * MS, 103 * MS, 2)
    assert responder.last_valid_ns == 7 * MS  # idleness on the monotonic clock


def test_rate_data_is_counted_per_address_and_test_and_never_answered() -> None:
    responder = ProbeResponder(0)
    for seq, at_ms in ((1, 10), (3, 12), (2, 11)):
        data = encode(ProbePacket(PacketKind.RATE_DATA, 77, seq, 0, size_bytes=1000))
        assert responder.handle(data, ADDR, at_ms * MS) is None
    other = encode(ProbePacket(PacketKind.RATE_DATA, 77, 1, 0, size_bytes=1000))
    assert responder.handle(other, ("192.0.2.2", 5000), 13 * MS) is None
    query = encode(ProbePacket(PacketKind.RATE_QUERY, 77, 0, 55, size_bytes=REPORT_BYTES))
    reply = responder.handle(query, ADDR, 20 * MS)
    assert reply is not None and len(reply) == len(query)
    report = decode(reply)
    assert report.kind == PacketKind.RATE_REPORT and report.sent_ns == 55
    # first/last are arrival order at the responder, max_seq the highest seen
    assert report.counts == RateCounts(3, 3000, 10 * MS, 11 * MS, 3)
    unknown = encode(ProbePacket(PacketKind.RATE_QUERY, 78, 0, 0, size_bytes=REPORT_BYTES))
    reply = responder.handle(unknown, ADDR, 21 * MS)
    assert reply is not None and decode(reply).counts == NO_COUNTS


def test_malformed_packets_and_replies_get_no_answer() -> None:
    responder = ProbeResponder(0)
    assert responder.handle(b"GET / HTTP/1.1\r\n\r\n" * 3, ADDR, 1) is None
    assert responder.handle(bytes(64), ADDR, 2) is None
    reply = encode(ProbePacket(PacketKind.ECHO_REPLY, 1, 1, 1, echo_ns=5, size_bytes=64))
    assert responder.handle(reply, ADDR, 3) is None  # no ping-pong between two responders
    assert responder.malformed == 2
    assert responder.last_valid_ns == 0  # garbage does not keep it alive
    assert responder.idle_for_s(2_500_000_000) == 2.5


def test_replies_are_rate_limited_and_refill_with_time() -> None:
    responder = ProbeResponder(0, reply_packets_per_s=100)
    request = bytes(valid_echo())
    answered = sum(responder.handle(request, ADDR, 0) is not None for _ in range(300))
    assert answered == REPLY_PACKET_BURST
    assert responder.refused_replies == 300 - REPLY_PACKET_BURST
    # 0.5 s later: 50 more tokens at 100 per second
    answered = sum(responder.handle(request, ADDR, 500 * MS) is not None for _ in range(300))
    assert answered == 50


def test_reply_bytes_are_rate_limited_too() -> None:
    responder = ProbeResponder(0, reply_bytes_per_s=1000)
    request = bytes(valid_echo(9000))
    answered = sum(responder.handle(request, ADDR, 0) is not None for _ in range(100))
    assert answered == 128_000 // 9000  # the byte burst


def test_rate_test_table_is_bounded() -> None:
    responder = ProbeResponder(0, max_rate_tests=2)
    for test_id in (1, 2, 3):
        data = encode(ProbePacket(PacketKind.RATE_DATA, test_id, 1, 0, size_bytes=100))
        responder.handle(data, ADDR, test_id)
    counts = []
    for test_id in (1, 2, 3):
        query = encode(ProbePacket(PacketKind.RATE_QUERY, test_id, 0, 0, size_bytes=REPORT_BYTES))
        reply = responder.handle(query, ADDR, 10)
        assert reply is not None
        report = decode(reply).counts
        assert report is not None
        counts.append(report.packets)
    assert counts == [0, 1, 1]  # the oldest test was forgotten


# ---------------------------------------------------------------- statistics


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.90) == 90.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0  # rank ceil(1.5) = 2


def test_rfc3550_jitter_by_hand() -> None:
    assert rfc3550_jitter([0.1] * 50) == 0.0
    assert rfc3550_jitter([0.1]) == 0.0
    # D = 0.016 each time: J1 = 0.016/16 = 0.001, J2 = 0.001 + (0.016 - 0.001)/16
    assert rfc3550_jitter([0.0, 0.016, 0.0]) == pytest.approx(0.001 + 0.015 / 16)
    # converges to |D| when it never changes
    alternating = [0.010 * (i % 2) for i in range(2000)]
    assert rfc3550_jitter(alternating) == pytest.approx(0.010)


def test_latency_summary_of_synthetic_samples() -> None:
    # 100 probes, RTT 10..109 ms except every 10th lost; one-way transit constant
    # except probe 50, 4 ms late (jitter counts both steps, in responder arrival order)
    samples = []
    for seq in range(100):
        sent = seq * 50 * MS
        lost = seq % 10 == 9
        late = 4 * MS if seq == 50 else 0
        samples.append(
            EchoSample(seq, sent, None if lost else sent + (10 + seq) * MS, sent + 3 * MS + late)
        )
    summary = summarize_latency(samples)
    assert (summary.sent, summary.received) == (100, 90)
    assert summary.loss == 0.1
    rtts = sorted((10 + s) / 1e3 for s in range(100) if s % 10 != 9)
    assert summary.rtt_min_s == pytest.approx(0.010)
    assert summary.rtt_p50_s == pytest.approx(rtts[44])  # rank ceil(45) = 45
    assert summary.rtt_p90_s == pytest.approx(rtts[80])
    assert summary.rtt_p99_s == pytest.approx(rtts[89])
    assert summary.rtt_max_s == pytest.approx(0.108)
    transits = [(7e-3 if s == 50 else 3e-3) for s in range(100) if s % 10 != 9]
    assert summary.jitter_s == pytest.approx(rfc3550_jitter(transits))
    j_after_50 = 0.004 / 16
    assert summary.jitter_s == pytest.approx(
        (j_after_50 + (0.004 - j_after_50) / 16) * (15 / 16) ** (len(transits) - 47)
    )


def test_latency_summary_with_no_reply() -> None:
    summary = summarize_latency([EchoSample(0, 0, None), EchoSample(1, 1, None)])
    assert summary == LatencySummary(2, 0, 1.0, None, None, None, None, None, None)


def latency(loss: float = 0.0, min_ms: float = 80, p99_ms: float = 85, jitter_ms: float = 1,
            received: int = 200) -> LatencySummary:  # fmt: skip
    sent = round(received / (1 - loss)) if loss < 1 else received
    return LatencySummary(
        sent, received, loss, min_ms / 1e3, (min_ms + 1) / 1e3, (min_ms + 2) / 1e3,
        p99_ms / 1e3, (p99_ms + 1) / 1e3, jitter_ms / 1e3,
    )  # fmt: skip


GOOD_RATE = RateSummary(50e6, 48e6, "path", LossEstimate(20, 5000), (), ())


def test_verdicts() -> None:
    assert judge(latency(), GOOD_RATE).text == "good for critical traffic"
    assert judge(latency(), None).kind == "critical"  # rate not measured: 0 of 200 echoes
    # tail allowance at 80 ms min: max(10 ms, 40 ms) = 40 ms
    assert judge(latency(p99_ms=119), GOOD_RATE).kind == "critical"
    assert judge(latency(p99_ms=121), GOOD_RATE).text == "bulk only: p99 RTT 41.0 ms above min"
    # jitter allowance at 80 ms: max(5 ms, 8 ms) = 8 ms; at 2 ms: the 5 ms floor
    assert judge(latency(jitter_ms=9), GOOD_RATE).text == "bulk only: jitter 9.0 ms"
    assert judge(latency(min_ms=2, p99_ms=3, jitter_ms=4.9), GOOD_RATE).kind == "critical"
    assert judge(latency(received=19), GOOD_RATE).text == "bulk only: only 19 replies"
    slow = RateSummary(0.5e6, 0.5e6, "path", LossEstimate(0, 500), (), ())
    assert judge(latency(), slow).text == "unusable: 0.50 Mbit/s achievable"
    no_reply = LatencySummary(20, 0, 1.0, None, None, None, None, None, None)
    assert judge(no_reply, None).text == "unusable: no reply from the responder"
    strict = VerdictThresholds(critical_max_loss=0.001)
    assert judge(latency(), GOOD_RATE, strict).kind == "bulk"  # 0.4 % of 5000


def test_thresholds_are_stated() -> None:
    assert VerdictThresholds().describe() == (
        "critical needs loss <= 1% one way (the 95% interval's upper end; echoes: 1.99% "
        "round trip), p99 - min RTT <= max(10 ms, 50% of min RTT), "
        "jitter <= max(5 ms, 10% of min RTT), >= 20 replies; "
        "unusable when loss is above 10% (the interval's lower end) or the rate below "
        "1 Mbit/s"
    )


def test_parse_address() -> None:
    assert parse_address("10.0.0.1:7000") == ("10.0.0.1", 7000)
    assert parse_address("10.0.0.1") == ("10.0.0.1", 7444)
    assert parse_address("[::1]:9") == ("::1", 9)
    assert parse_address("::1") == ("::1", 7444)
    for bad in ("host:1", "10.0.0.1:x", "10.0.0.1:70000", "[::1", "[10.0.0.1]x"):
        with pytest.raises(ConfigError):
            parse_address(bad)


def test_host_port_writes_what_parse_address_reads() -> None:
    from wangate.net.address import host_port

    assert host_port("10.0.0.1", 7000) == "10.0.0.1:7000"
    assert host_port("fd00::1", 7443) == "[fd00::1]:7443"
    assert host_port("::ffff:10.0.0.1", 0) == "[::ffff:10.0.0.1]:0"
    for host, port in (("10.0.0.1", 7000), ("fd00::1", 7443), ("::", 65535)):
        assert parse_address(host_port(host, port)) == (host, port)


def test_options_are_validated() -> None:
    target = ("127.0.0.1", 1)
    with pytest.raises(ConfigError, match="--size"):
        ProbeOptions(target, data_bytes=10)
    with pytest.raises(ConfigError, match="--probe-rate"):
        ProbeOptions(target, probe_rate_hz=0)
    with pytest.raises(ConfigError, match="mixed"):
        ProbeOptions(target, local="::1")


# ------------------------------------------------------------- real sockets


async def with_responder(body: Any) -> Any:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[tuple[str, int]] = loop.create_future()
    task = asyncio.create_task(
        serve_responder(("127.0.0.1", 0), idle_timeout_s=None, ready=ready.set_result)
    )
    try:
        return await body(await ready)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_probe_against_a_real_responder_on_loopback() -> None:
    async def body(address: tuple[str, int]) -> Any:
        options = ProbeOptions(address, local="127.0.0.1", duration_s=2.0, rate_cap_bps=20e6,
                               probe_rate_hz=25)  # fmt: skip
        return await run_probe(options)

    result = asyncio.run(with_responder(body))
    lat = result.latency
    assert (lat.sent, lat.received, lat.loss) == (25, 25, 0.0)
    assert lat.rtt_min_s is not None and lat.rtt_max_s is not None and lat.jitter_s is not None
    assert 0 < lat.rtt_min_s <= lat.rtt_p50_s <= lat.rtt_p99_s <= lat.rtt_max_s < 1.0
    assert 0 <= lat.jitter_s < 0.1
    assert result.rate is not None
    steps = result.rate.steps
    assert steps and all(s.reported for s in steps)
    assert steps[0].loss == 0.0 and steps[0].packets_received == steps[0].packets_sent
    assert result.rate.kinds[0] == "clean" and result.rate.purposes[-1] == "clean"
    assert result.rate.loss is not None and result.rate.loss.sent > 0
    assert result.rate.achievable_bps > 1e6
    assert result.local.startswith("127.0.0.1:")


def test_the_responder_stamps_arrivals_with_the_kernel_clock() -> None:
    async def body(address: tuple[str, int]) -> int:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.connect(address)
            request = ProbePacket(PacketKind.ECHO_REQUEST, 1, 0, 0, size_bytes=64)
            await loop.sock_sendall(sock, encode(request))
            reply = decode(await asyncio.wait_for(loop.sock_recv(sock, 100), 5))
        return reply.echo_ns

    before_ns = time.time_ns()
    echo_ns = asyncio.run(with_responder(body))
    # SO_TIMESTAMPNS stamps on CLOCK_REALTIME, decades away from the monotonic clock
    assert before_ns - 10**9 <= echo_ns <= time.time_ns()


def test_the_responder_exits_when_idle() -> None:
    async def main() -> ProbeResponder:
        serving = serve_responder(("127.0.0.1", 0), idle_timeout_s=0.2)
        return await asyncio.wait_for(serving, 5)

    responder = asyncio.run(main())
    assert responder.replies == 0


class LossyRelay(asyncio.DatagramProtocol):
    """Forwards prober -> responder dropping every 5th datagram of each kind (echo
    requests, rate data, queries counted apart); replies pass untouched."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.client: Any = None
        self.forwarded: dict[int, int] = {}
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if addr == self.upstream:
            self.transport.sendto(data, self.client)
            return
        self.client = addr
        kind = data[5]
        self.forwarded[kind] = self.forwarded.get(kind, 0) + 1
        if self.forwarded[kind] % 5:
            self.transport.sendto(data, self.upstream)


def test_a_lossy_link_is_judged_unusable_with_its_loss() -> None:
    async def body(address: tuple[str, int]) -> Any:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: LossyRelay(address), local_addr=("127.0.0.1", 0)
        )
        relay = transport.get_extra_info("sockname")
        try:
            options = ProbeOptions(relay, duration_s=2.0, rate_cap_bps=5e6, probe_rate_hz=20)
            return await probe_report(options)
        finally:
            transport.close()

    report = asyncio.run(with_responder(body))
    assert report["latency"]["sent"] == 20
    assert report["latency"]["received"] == 16
    assert report["latency"]["loss"] == 0.2
    # every 5th datagram of the trains is lost, at every rate: random loss, not a
    # bottleneck. The relay counts across trains, so each train loses a fifth of its
    # packets give or take one, and the pooled clean trains as many times that.
    loss = report["rate"]["loss"]
    steps = report["rate"]["steps"]
    clean = [s for s in steps if s["kind"] == "clean"]
    assert loss["sent"] == sum(s["packets_sent"] for s in clean) > 0
    assert abs(loss["lost"] - loss["sent"] / 5) <= len(clean)
    assert "saturated" not in [s["kind"] for s in report["rate"]["steps"]]
    assert report["verdict"]["kind"] == "unusable", report
    assert report["verdict"]["text"].startswith(f"unusable: {loss['fraction'] * 100:.2f}% (95%")


def test_cli_serve_and_probe(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "wangate", "probe", "--serve", "--listen", "127.0.0.1:0",
         "--idle-timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("probe responder on 127.0.0.1:"), line
        port = int(line.split(",")[0].rsplit(":", 1)[1])
        probe = subprocess.run(
            [sys.executable, "-m", "wangate", "probe", f"127.0.0.1:{port}", "--duration", "2",
             "--rate-mbps", "4", "--json"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        # 2 s: the rate steps reach about 2 Mbit/s, twice the least a usable path carries
        # (in 1 s they reach about 1.0, and a busy host measured a link unusable)
        assert probe.returncode == 0, probe.stderr + probe.stdout
        report = json.loads(probe.stdout)
        assert report["latency"]["received"] == report["latency"]["sent"] == 20
        assert report["verdict"]["kind"] in ("critical", "bulk")
        assert report["rate"]["achievable_mbps"] > 1
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=10) == 130
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_report_document_keys() -> None:
    lat = latency()
    doc = report_dict("10.0.0.2:7444", "10.0.0.1:5000", lat, GOOD_RATE, judge(lat, GOOD_RATE),
                      VerdictThresholds())  # fmt: skip
    assert doc["latency"]["rtt_ms"] == {"min": 80.0, "p50": 81.0, "p90": 82.0, "p99": 85.0,
                                        "max": 86.0}  # fmt: skip
    assert doc["rate"] == {
        "achievable_mbps": 50.0, "capped": False, "limit": "path", "confirmed": False,
        "goodput_mbps": 48.0,
        "loss": {"sent": 5000, "lost": 20, "fraction": 0.004, "ci95": [0.002591, 0.006171]},
        "loss_episodes": {"lost": 0, "sent": 0}, "steps": [],
    }  # fmt: skip
    assert doc["latency"]["loss_ci95"] == [0.0, 0.018845]
    assert doc["verdict"] == {"kind": "critical", "text": "good for critical traffic",
                              "reasons": []}  # fmt: skip
    assert not math.isnan(doc["latency"]["loss"])
    text = format_report(doc)
    assert "path loss   0.40% one way, 95% CI 0.26-0.62% (20 of 5000 packets" in text
    assert "achievable  50.00 Mbit/s at the bottleneck (IP bytes), 48.00 Mbit/s of UDP" in text


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_serve_stops_on_signal_even_when_started_with_sigint_ignored(
    signum: signal.Signals, code: int
) -> None:
    # A background job of a script starts with SIGINT ignored; the responder installs
    # its own handlers, so Ctrl-C / kill -INT / kill -TERM still stop it.
    server = subprocess.Popen(
        [sys.executable, "-m", "wangate", "probe", "--serve", "--listen", "127.0.0.1:0",
         "--idle-timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("probe responder on 127.0.0.1:"), line
        server.send_signal(signum)
        assert server.wait(timeout=10) == code
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
