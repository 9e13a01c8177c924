"""The "wangate" congestion controller, driven sans-IO by a fake bottleneck under a fake
clock, then once for real between two aioquic endpoints on loopback."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aioquic.asyncio.client import connect
from aioquic.asyncio.server import serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.congestion.base import QuicCongestionControl, create_congestion_control
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.tls import Epoch

from wangate.certs import create_ca, issue_site_certificate
from wangate.net.congestion import (
    CONGESTION_CONTROL_NAME,
    DRAIN,
    PROBE_BW,
    PROBE_RTT,
    STARTUP,
    WangateCongestionControl,
)

MSS = 1200
RATE_BPS = 2_500_000.0  # bytes/s: 20 Mbit/s
BASE_RTT_S = 0.040
BDP = RATE_BPS * BASE_RTT_S  # 100 kB


# ------------------------------------------------------------- a fake bottleneck


@dataclass
class Flow:
    cc: QuicCongestionControl
    start_s: float = 0.0
    next_pn: int = 0
    next_send_s: float = 0.0
    srtt_s: float | None = None  # as aioquic's pacer sees it (RFC 9002 §5.3)
    delivered_bytes: int = 0
    lost: int = 0
    sent: int = 0
    send_scheduled: bool = False
    app_interval_s: float = 0.0  # > 0: the application has a few packets this often
    app_burst: int = 1  # packets each time
    next_app_s: float = 0.0
    app_left: int = 0


@dataclass
class Link:
    """One FIFO bottleneck shared by every flow, a drop-tail buffer, then random loss.

    ``extra_delay_s(t)`` adds a delay after the bottleneck (a queue we do not cause)."""

    rate_bps: float = RATE_BPS
    base_rtt_s: float = BASE_RTT_S
    buffer_bytes: float = BDP
    loss: float = 0.0
    seed: int = 1
    extra_delay_s: Callable[[float], float] = lambda t: 0.0
    rate_at: Callable[[float], float] | None = None
    free_at: float = 0.0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


class Simulation:
    def __init__(self, link: Link, flows: list[Flow]) -> None:
        self.link = link
        self.flows = flows
        self.events: list[tuple[float, int, str, int, QuicSentPacket | None]] = []
        self.order = 0
        self.now = 0.0
        self.trace: list[tuple[float, int, int]] = []  # (time, flow, cwnd) per ack

    def push(self, at: float, kind: str, flow: int, packet: QuicSentPacket | None) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, kind, flow, packet))

    def run(self, until_s: float, observe: Callable[[Simulation], None] | None = None) -> None:
        for index, flow in enumerate(self.flows):
            self.push(flow.start_s, "send", index, None)
        while self.events and self.events[0][0] <= until_s:
            at, _, kind, index, packet = heapq.heappop(self.events)
            self.now = at
            flow = self.flows[index]
            if kind == "send":
                flow.send_scheduled = False
            elif kind == "ack":
                assert packet is not None
                flow.cc.on_packet_acked(now=at, packet=packet)
                flow.delivered_bytes += packet.sent_bytes
                assert packet.sent_time is not None
                rtt = at - packet.sent_time
                flow.srtt_s = rtt if flow.srtt_s is None else 0.875 * flow.srtt_s + 0.125 * rtt
                flow.cc.on_rtt_measurement(now=at, rtt=rtt)
                self.trace.append((at, index, flow.cc.congestion_window))
            else:
                assert packet is not None
                flow.lost += 1
                flow.cc.on_packets_lost(now=at, packets=[packet])
            if observe is not None:
                observe(self)
            self.try_send(index)

    def try_send(self, index: int) -> None:
        flow, link, now = self.flows[index], self.link, self.now
        while flow.cc.congestion_window - flow.cc.bytes_in_flight >= MSS:
            if flow.app_interval_s > 0.0:
                if flow.app_left == 0:
                    if now < flow.next_app_s:
                        self.push(flow.next_app_s, "send", index, None)
                        return
                    flow.next_app_s, flow.app_left = now + flow.app_interval_s, flow.app_burst
                flow.app_left -= 1
            if now < flow.next_send_s:
                if not flow.send_scheduled:
                    flow.send_scheduled = True
                    self.push(flow.next_send_s, "send", index, None)
                return
            packet = QuicSentPacket(
                epoch=Epoch.ONE_RTT,
                in_flight=True,
                is_ack_eliciting=True,
                is_crypto_packet=False,
                packet_number=flow.next_pn,
                packet_type=QuicPacketType.ONE_RTT,
                sent_time=now,
                sent_bytes=MSS,
            )
            flow.next_pn += 1
            flow.sent += 1
            flow.cc.on_packet_sent(packet=packet)
            if flow.srtt_s is not None:  # at the controller's rate, else as aioquic: cwnd / srtt
                rate = _pacing_rate(flow.cc, flow.srtt_s)
                flow.next_send_s = max(flow.next_send_s, now - 0.002) + MSS / rate
            rate = link.rate_at(now) if link.rate_at is not None else link.rate_bps
            queued = max(0.0, link.free_at - now) * rate
            if queued + MSS > link.buffer_bytes:
                self.push(now + link.base_rtt_s * 1.125 + queued / rate, "lost", index, packet)
                continue
            link.free_at = max(now, link.free_at) + MSS / rate
            delay = link.base_rtt_s + link.extra_delay_s(link.free_at)
            if link.rng.random() < link.loss:
                self.push(link.free_at + delay * 1.125, "lost", index, packet)
            else:
                self.push(link.free_at + delay, "ack", index, packet)


def _pacing_rate(cc: QuicCongestionControl, srtt_s: float) -> float:
    """What ``net/pacing.py``'s pacer paces at, in bytes per second."""
    rate = cc.pacing_rate_bytes(srtt_s) if hasattr(cc, "pacing_rate_bytes") else None
    return rate if rate is not None else cc.congestion_window / srtt_s


def _wangate() -> WangateCongestionControl:
    cc = create_congestion_control(CONGESTION_CONTROL_NAME, max_datagram_size=MSS)
    assert isinstance(cc, WangateCongestionControl)
    return cc


def _goodput_bps(flow: Flow, seconds: float) -> float:
    return flow.delivered_bytes / seconds


# ----------------------------------------------------------------- the model


def test_startup_grows_exponentially_then_settles_at_bdp() -> None:
    # 16x the usual rate: from the 64-datagram initial window, several rounds to the BDP
    rate_bps, bdp = 16 * RATE_BPS, 16 * BDP
    cc = _wangate()
    sim = Simulation(Link(rate_bps=rate_bps, buffer_bytes=2 * bdp), [Flow(cc)])
    windows: list[int] = []  # the window as each round trip starts

    def observe(s: Simulation) -> None:
        if cc.round_count > len(windows):
            windows.append(cc.congestion_window)

    sim.run(0.3, observe)
    # slow-start-like while below the BDP: pacing at cwnd / srtt keeps it a little under
    # doubling per round, but never linear
    growing = [w for w in windows if w < bdp]
    assert len(growing) >= 4
    for before, after in itertools.pairwise(growing):
        assert after >= 1.4 * before
    assert growing[-1] >= 1.5 ** (len(growing) - 1) * growing[0]
    sim.run(3.0)
    assert cc.state == PROBE_BW
    assert cc.filled_pipe
    assert cc.btl_bw_bps == pytest.approx(rate_bps, rel=0.1)
    assert cc.min_rtt_s == pytest.approx(BASE_RTT_S, rel=0.05)
    # the window caps the flight (1.25 x (1 + allowance) BDP); the pacer sets the rate
    assert 1.2 * bdp <= cc.congestion_window <= 1.8 * bdp
    assert cc.pacing_rate_bytes(BASE_RTT_S) == cc.pacing_gain * cc.sending_rate_bps
    assert _goodput_bps(sim.flows[0], 3.0) > 0.8 * rate_bps


def test_one_percent_random_loss_keeps_window_near_bdp_and_reno_does_not() -> None:
    cc = _wangate()
    sim = Simulation(Link(loss=0.01, seed=3), [Flow(cc)])
    low_window_after_startup = []

    def observe(s: Simulation) -> None:
        if s.now > 1.0:
            low_window_after_startup.append(cc.congestion_window < 0.8 * BDP)

    sim.run(1.0)
    events_after_startup = cc.congestion_events  # a 1-BDP buffer may overflow in Startup
    sim.run(8.0, observe)
    flow = sim.flows[0]
    assert flow.lost > 200  # the loss really happened
    assert cc.congestion_events == events_after_startup
    assert 1.2 * BDP <= cc.congestion_window <= 1.8 * BDP
    # the window dips below 0.8 BDP only in ProbeRTT
    assert sum(low_window_after_startup) < 0.2 * len(low_window_after_startup)
    assert _goodput_bps(flow, 8.0) > 0.85 * RATE_BPS

    reno = create_congestion_control("reno", max_datagram_size=MSS)
    baseline = Simulation(Link(loss=0.01, seed=3), [Flow(reno)])
    baseline.run(8.0)
    assert _goodput_bps(baseline.flows[0], 8.0) < 0.5 * _goodput_bps(flow, 8.0)


def test_five_percent_random_loss_without_queue_is_not_congestion() -> None:
    cc = _wangate()
    sim = Simulation(Link(loss=0.05, seed=5), [Flow(cc)])
    sim.run(1.0)
    events_after_startup = cc.congestion_events
    sim.run(6.0)
    assert cc.congestion_events == events_after_startup
    assert _goodput_bps(sim.flows[0], 6.0) > 0.75 * RATE_BPS


@pytest.mark.parametrize(("loss", "busy", "goodput"), [(0.0, 0.97, 0.97), (0.05, 0.97, 0.92)])
def test_random_loss_leaves_no_part_of_the_link_unused(
    loss: float, busy: float, goodput: float
) -> None:
    """The delivery rate counts what arrived; sending only that much would leave the
    lost packets' share of the link idle (5 % here: busy 0.95, goodput 0.90 before)."""
    cc = _wangate()
    sim = Simulation(Link(loss=loss, seed=5), [Flow(cc)])
    sim.run(2.0)
    flow = sim.flows[0]
    sent, delivered, events = flow.sent, flow.delivered_bytes, cc.congestion_events
    sim.run(10.0)
    assert (flow.sent - sent) * MSS >= busy * RATE_BPS * 8.0
    assert flow.delivered_bytes - delivered >= goodput * RATE_BPS * 8.0
    assert cc.congestion_events == events  # without a queue: no loss read as congestion
    assert cc.random_loss == pytest.approx(loss, abs=0.01)


def test_keep_alives_of_an_idle_connection_do_not_end_startup() -> None:
    """3 datagrams every 50 ms for 2 s (probes, keep-alives), then a bulk transfer: the
    model's bandwidth is the keep-alives' and must not make them look like a full pipe
    (Startup ended at 0.05 Mbit/s on a 50 Mbit/s lab path, then climbed for a second)."""
    cc = _wangate()
    flow = Flow(cc, app_interval_s=0.050, app_burst=3)
    sim = Simulation(Link(), [flow])
    sim.run(2.0)
    assert cc.state == STARTUP and cc.btl_bw_bps < 0.05 * RATE_BPS
    flow.app_interval_s = 0.0
    sim.push(2.0, "send", 0, None)
    sim.run(2.5)  # about 10 round trips
    assert cc.filled_pipe and cc.btl_bw_bps >= 0.9 * RATE_BPS


def test_probe_bw_cycle_leaves_the_link_busy() -> None:
    """ProbeBW's 0.75 phase drains the probe's queue without idling the link: with the
    rate tied to the window (aioquic's cwnd / srtt) it capped the flight below the BDP
    for part of every cycle (0.982 of the link delivered on this path before)."""
    cc = _wangate()
    flow = Flow(cc)
    sim = Simulation(Link(buffer_bytes=BDP), [flow])
    sim.run(2.0)
    delivered = flow.delivered_bytes
    sim.run(10.0)
    assert flow.delivered_bytes - delivered >= 0.99 * RATE_BPS * 8.0


def test_a_slow_path_with_a_shallow_queue_is_not_overfilled() -> None:
    """5 Mbit/s, 40 ms, a 50 ms drop-tail queue (the collectives lab's slowest links):
    the window's 64-datagram floor is more than its BDP and queue together, and paced
    at cwnd / srtt it kept the queue overflowing (2241 of 3400 datagrams dropped over
    these 8 s before). Paced at the model's rate, only the path's 0.2 % is lost."""
    rate = 625_000.0
    cc = _wangate()
    flow = Flow(cc)
    link = Link(rate_bps=rate, base_rtt_s=0.040, buffer_bytes=0.050 * rate, loss=0.002, seed=1)
    sim = Simulation(link, [flow])
    sim.run(2.0)
    lost, delivered = flow.lost, flow.delivered_bytes
    sim.run(10.0)
    assert flow.lost - lost <= 20  # random loss: 0.2 % of ~4100 datagrams
    assert flow.delivered_bytes - delivered >= 0.99 * rate * 8.0
    assert cc.congestion_window == cc.min_target_window  # the floor caps flight only


def test_drops_of_a_queue_too_shallow_to_show_are_not_random_loss() -> None:
    """A 0.1-BDP buffer drops the probes' excess without a rise in RTT. Counted as random
    loss, those drops raised the 1 / (1 - loss) compensation, which overfilled the
    buffer further (random loss 0.017 and 0.954 of the link delivered before)."""
    cc = _wangate()
    flow = Flow(cc)
    sim = Simulation(Link(buffer_bytes=0.1 * BDP), [flow])
    sim.run(2.0)
    delivered = flow.delivered_bytes
    sim.run(10.0)
    assert flow.lost > 0  # the buffer did overflow
    assert cc.random_loss < 0.001
    assert flow.delivered_bytes - delivered >= 0.98 * RATE_BPS * 8.0


def test_rising_rtt_slows_sending_and_window_does_not_follow_it() -> None:
    # after 2 s a queue we do not cause adds delay: +100 ms per second, up to 200 ms
    def extra(t: float) -> float:
        return min(max(0.0, t - 2.0) * 0.1, 0.2)

    cc = _wangate()
    sim = Simulation(Link(extra_delay_s=extra, buffer_bytes=10 * BDP), [Flow(cc)])
    sim.run(2.0)
    window_before = cc.congestion_window
    rate_before = cc.congestion_window / (sim.flows[0].srtt_s or 1.0)
    sim.run(5.0)
    srtt = sim.flows[0].srtt_s
    assert srtt is not None and srtt > 0.2
    pacing_after = cc.congestion_window / srtt
    assert pacing_after < 0.5 * rate_before
    assert cc.congestion_window <= 1.6 * window_before


def test_bandwidth_drop_builds_a_queue_that_is_drained() -> None:
    # the bottleneck halves at 2 s with a deep buffer: our own queue raises the RTT
    def rate(t: float) -> float:
        return RATE_BPS if t < 2.0 else RATE_BPS / 2

    cc = _wangate()
    sim = Simulation(Link(rate_at=rate, buffer_bytes=20 * BDP), [Flow(cc)])
    sim.run(2.0)
    before = sim.flows[0].delivered_bytes
    sim.run(8.0)
    srtt = sim.flows[0].srtt_s
    assert srtt is not None and srtt < 2.0 * BASE_RTT_S  # no standing queue left
    assert cc.btl_bw_bps == pytest.approx(RATE_BPS / 2, rel=0.15)
    assert (sim.flows[0].delivered_bytes - before) / 6.0 > 0.85 * RATE_BPS / 2


def test_heavy_loss_with_rising_rtt_backs_off() -> None:
    def extra(t: float) -> float:
        return 0.0 if t < 2.0 else 0.03

    cc = _wangate()
    link = Link(extra_delay_s=extra, seed=9)
    sim = Simulation(link, [Flow(cc)])
    sim.run(2.0)
    events_before = cc.congestion_events
    bw_before = cc.btl_bw_bps
    link.loss = 0.05  # 5 % alone is tolerated; with the queue it is congestion
    sim.run(2.6)
    assert cc.congestion_events > events_before
    assert cc.btl_bw_bps <= 0.75 * bw_before


def test_the_usual_random_loss_is_not_congestion_when_busy_hosts_raise_the_rtt() -> None:
    # 5 % random loss from the start; after 3 s the hosts add 30 ms to every RTT, as a
    # queue would: the loss rate is the one the path always had, so it is not congestion
    def extra(t: float) -> float:
        return 0.0 if t < 3.0 else 0.03

    cc = _wangate()
    sim = Simulation(Link(loss=0.05, extra_delay_s=extra, seed=13), [Flow(cc)])
    sim.run(3.0)
    assert 0.03 < cc.loss_baseline < 0.07
    events_before = cc.congestion_events
    sim.run(6.0)
    # (the window still stops following the RTT past the allowance: that is the delay
    # response, not a loss response)
    assert cc.congestion_events == events_before


def test_loss_well_above_the_usual_with_a_queue_is_congestion() -> None:
    def extra(t: float) -> float:
        return 0.0 if t < 3.0 else 0.03

    cc = _wangate()
    link = Link(loss=0.01, extra_delay_s=extra, seed=14)
    sim = Simulation(link, [Flow(cc)])
    sim.run(3.0)
    events_before, bw_before = cc.congestion_events, cc.btl_bw_bps
    # 1 % usual, 10 % now, and a queue: more than 2 % over the usual plus the noise of an
    # 83-packet round (3 sigma: 3.3 %)
    link.loss = 0.10
    sim.run(3.6)
    assert cc.congestion_events > events_before
    assert cc.btl_bw_bps <= 0.75 * bw_before


def test_very_heavy_loss_alone_backs_off() -> None:
    cc = _wangate()
    link = Link(seed=11)
    sim = Simulation(link, [Flow(cc)])
    sim.run(2.0)
    bw_before = cc.btl_bw_bps
    link.loss = 0.3
    sim.run(2.5)
    assert cc.congestion_events >= 1
    assert cc.btl_bw_bps <= 0.75 * bw_before


def test_startup_exits_on_congestion_loss_from_a_shallow_buffer() -> None:
    cc = _wangate()
    sim = Simulation(Link(buffer_bytes=0.1 * BDP), [Flow(cc)])
    sim.run(3.0)
    assert cc.state in (DRAIN, PROBE_BW, PROBE_RTT)
    assert _goodput_bps(sim.flows[0], 3.0) > 0.6 * RATE_BPS


def test_startup_leaves_on_loss_without_waiting_for_the_round_to_end() -> None:
    # judged only at round ends, Startup lost 174 packets to a 1.25-BDP buffer in its
    # first second: the round it waited for doubled the window once more
    cc = _wangate()
    flow = Flow(cc)
    sim = Simulation(Link(buffer_bytes=1.25 * BDP), [flow])
    sim.run(1.0)
    assert cc.filled_pipe and cc.congestion_events == 1
    assert flow.lost <= 100
    sim.run(5.0)
    assert cc.btl_bw_bps == pytest.approx(RATE_BPS, rel=0.05)


def test_shares_a_bottleneck_with_reno() -> None:
    # BBR v1-style cycling and the RTT clamp leave a loss-based flow its share
    ours = _wangate()
    reno = create_congestion_control("reno", max_datagram_size=MSS)
    sim = Simulation(Link(buffer_bytes=BDP, seed=13), [Flow(ours), Flow(reno, start_s=1.0)])
    sim.run(16.0)
    ours_bps = sim.flows[0].delivered_bytes / 16.0
    reno_bps = sim.flows[1].delivered_bytes / 15.0
    assert ours_bps + reno_bps > 0.85 * RATE_BPS
    assert reno_bps > 0.25 * RATE_BPS
    assert ours_bps > 0.25 * RATE_BPS


def test_probe_rtt_after_ten_seconds_without_a_new_min_rtt() -> None:
    cc = _wangate()
    states: set[str] = set()
    sim = Simulation(Link(), [Flow(cc)])
    sim.run(3.0)
    # from now on the path's RTT is 5 ms higher: the 40 ms minimum is never seen again
    sim.link.extra_delay_s = lambda t: 0.005
    sim.run(14.5, lambda s: states.add(cc.state))
    assert PROBE_RTT in states
    assert cc.state == PROBE_BW
    assert cc.min_rtt_s == pytest.approx(BASE_RTT_S + 0.005, rel=0.05)


def test_persistent_congestion_collapses_then_regrows() -> None:
    cc = _wangate()
    sim = Simulation(Link(), [Flow(cc)])
    sim.run(3.0)
    cc.on_persistent_congestion()
    assert cc.congestion_window == 4 * MSS
    sim.run(3.6)
    assert cc.congestion_window >= 0.9 * BDP


def test_new_controller_starts_at_initial_window() -> None:
    cc = _wangate()
    assert cc.state == STARTUP
    assert cc.congestion_window == cc.initial_window == 64 * MSS
    assert cc.bytes_in_flight == 0
    assert cc.get_log_data()["state"] == STARTUP


# ----------------------------------------------------------- a real transfer


def _configurations(tmp_path: Path) -> tuple[QuicConfiguration, QuicConfiguration]:
    ca_cert, _ = create_ca(tmp_path)
    cert_file, key_file = issue_site_certificate(tmp_path, "sh")
    server = QuicConfiguration(
        is_client=False,
        alpn_protocols=["wgtest"],
        congestion_control_algorithm=CONGESTION_CONTROL_NAME,
    )
    server.load_cert_chain(cert_file, key_file)
    client = QuicConfiguration(
        is_client=True,
        alpn_protocols=["wgtest"],
        congestion_control_algorithm=CONGESTION_CONTROL_NAME,
        server_name="sh",
    )
    client.load_verify_locations(str(ca_cert))
    client.verify_mode = ssl.CERT_REQUIRED
    return server, client


def test_real_aioquic_transfer_with_wangate_controller(tmp_path: Path) -> None:
    payload = random.Random(21).randbytes(4 << 20)
    server_config, client_config = _configurations(tmp_path)

    async def main() -> bytes:
        received = asyncio.get_running_loop().create_future()
        tasks: list[asyncio.Task[None]] = []

        def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async def consume() -> None:
                data = await reader.read()
                writer.write(len(data).to_bytes(8, "big"))
                writer.write_eof()
                received.set_result(data)

            tasks.append(asyncio.ensure_future(consume()))

        server = await serve("127.0.0.1", 0, configuration=server_config, stream_handler=on_stream)
        assert server._transport is not None
        port = server._transport.get_extra_info("sockname")[1]
        try:
            async with connect("127.0.0.1", port, configuration=client_config) as client:
                loss = client._quic._loss
                assert isinstance(loss._cc, WangateCongestionControl)
                reader, writer = await client.create_stream()
                writer.write(payload)
                writer.write_eof()
                echoed = await asyncio.wait_for(reader.read(), 30)
                assert int.from_bytes(echoed, "big") == len(payload)
                assert loss._cc.btl_bw_bps > 0
                assert loss._cc.min_rtt_s is not None
                return await asyncio.wait_for(received, 5)
        finally:
            server.close()

    assert asyncio.run(main()) == payload


def _startup_round_with_losses(rtt_s: float, rounds_before: int = 2) -> WangateCongestionControl:
    """Startup, mid-round: 43 packets acked, then 9 of the round declared lost at once
    (17 %: what 5 % random loss can show this early in a round). ``rounds_before``: the
    rounds Startup has had (the first two left at the initial window's rate)."""
    cc = _wangate()
    cc.round_count = rounds_before
    packets = []
    for pn in range(60):
        packet = QuicSentPacket(
            epoch=Epoch.ONE_RTT,
            in_flight=True,
            is_ack_eliciting=True,
            is_crypto_packet=False,
            packet_number=pn,
            packet_type=QuicPacketType.ONE_RTT,
            sent_time=0.001 * pn,
            sent_bytes=MSS,
        )
        cc.on_packet_sent(packet=packet)
        packets.append(packet)
    cc.on_rtt_measurement(now=0.080, rtt=0.080)  # the path's min RTT
    for packet in packets[:44]:
        assert packet.sent_time is not None
        cc.on_rtt_measurement(now=packet.sent_time + rtt_s, rtt=rtt_s)
        cc.on_packet_acked(now=packet.sent_time + rtt_s, packet=packet)
    cc.on_packets_lost(now=0.060 + rtt_s, packets=packets[44:53])
    return cc


def test_random_loss_early_in_a_round_does_not_end_startup() -> None:
    cc = _startup_round_with_losses(rtt_s=0.080)
    assert (cc.state, cc.congestion_events) == (STARTUP, 0)


def test_loss_with_a_queue_ends_startup_without_waiting_for_the_round() -> None:
    cc = _startup_round_with_losses(rtt_s=0.120)  # 40 ms above the min: a queue
    assert (cc.state, cc.congestion_events) == (DRAIN, 1)


def test_losses_of_the_initial_window_do_not_end_startup() -> None:
    # the first flight leaves at the initial window's rate, not the model's: on a path
    # slower than 64 datagrams per RTT its losses would end Startup at a tenth of the rate
    cc = _startup_round_with_losses(rtt_s=0.120, rounds_before=0)
    assert (cc.state, cc.congestion_events) == (STARTUP, 0)


def _cruising(bw_bytes: float, min_rtt_s: float, random_loss: float) -> WangateCongestionControl:
    cc = _wangate()
    cc.state, cc._phase = PROBE_BW, 2  # gain 1
    cc.btl_bw_bps, cc.min_rtt_s, cc.random_loss = bw_bytes, min_rtt_s, random_loss
    return cc


def test_pacing_rate_fills_the_loss_and_slows_for_a_standing_queue() -> None:
    cc = _cruising(2_500_000.0, 0.040, 0.05)
    assert cc.pacing_rate_bytes(0.040) == pytest.approx(2_500_000.0 / 0.95)
    cc.on_rtt_measurement(now=1.0, rtt=0.045)  # within the allowance
    assert cc.pacing_rate_bytes(0.045) == pytest.approx(2_500_000.0 / 0.95)
    # a 50 ms queue under every sample of the round: the rate falls as
    # (min RTT + allowance) / the round's lowest RTT
    cc = _cruising(2_500_000.0, 0.040, 0.05)
    cc.on_rtt_measurement(now=1.0, rtt=0.090)
    cc.on_rtt_measurement(now=1.0, rtt=0.095)
    assert cc.pacing_rate_bytes(0.094) == pytest.approx(2_500_000.0 / 0.95 * 0.045 / 0.090)
    # a probe's queue that drains within the round leaves the rate alone, however the
    # smoothed RTT lags
    cc = _cruising(2_500_000.0, 0.040, 0.05)
    cc.on_rtt_measurement(now=1.0, rtt=0.060)
    cc.on_rtt_measurement(now=1.0, rtt=0.041)
    assert cc.pacing_rate_bytes(0.058) == pytest.approx(2_500_000.0 / 0.95)
    # ... but not below the window floor per RTT: 8 Mbit/s and a 160 ms queue,
    # 64 x 1200 B / 200 ms (the delay alone would give 1e6 x 45 / 200 = 225 kB/s)
    slow = _cruising(1_000_000.0, 0.040, 0.0)
    slow.on_rtt_measurement(now=1.0, rtt=0.200)
    assert slow.pacing_rate_bytes(0.200) == pytest.approx(64 * MSS / 0.200)
    assert _wangate().pacing_rate_bytes(0.040) is None  # no model yet: aioquic's cwnd / srtt


def test_pacing_rate_never_exceeds_the_model_on_a_slow_path() -> None:
    # 5 Mbit/s: the floor (64 x 1200 B / 90 ms = 6.8 Mbit/s) is above the path's rate
    cc = _cruising(625_000.0, 0.040, 0.0)
    cc.on_rtt_measurement(now=1.0, rtt=0.090)
    assert cc.pacing_rate_bytes(0.090) == 625_000.0


def test_an_app_limited_sender_is_paced_at_least_at_the_window_floor() -> None:
    # critical messages alone: the model is their average rate (10 Mbit/s here); paced
    # at it, each 64 KiB message would take 52 ms, as long as the gap to the next
    cc = _cruising(1_250_000.0, 0.020, 0.0)
    cc.on_rtt_measurement(now=1.0, rtt=0.020)
    assert cc.pacing_rate_bytes(0.020) == 1_250_000.0
    packet = QuicSentPacket(
        epoch=Epoch.ONE_RTT,
        in_flight=True,
        is_ack_eliciting=True,
        is_crypto_packet=False,
        packet_number=0,
        packet_type=QuicPacketType.ONE_RTT,
        sent_time=1.0,
        sent_bytes=MSS,
    )
    cc.on_packet_sent(packet=packet)  # nothing else in flight: application-limited
    assert cc.pacing_rate_bytes(0.020) == pytest.approx(64 * MSS / 0.020)
