"""BurstablePacer: aioquic's pacing, switched off while critical data waits."""

from __future__ import annotations

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from wangate.net.pacing import BurstablePacer, install_burstable_pacer


def paced() -> BurstablePacer:
    pacer = BurstablePacer(max_datagram_size=1452)
    # 10 datagrams per 100 ms: one every 10 ms, a bucket of 3630 bytes = 25 ms
    pacer.update_rate(congestion_window=14520, smoothed_rtt=0.1)
    assert pacer.packet_time == pytest.approx(0.01)
    assert pacer.bucket_max == pytest.approx(0.025)
    return pacer


def test_paced_like_aioquic_when_no_burst() -> None:
    pacer = paced()
    assert pacer.next_send_time(1.0) is None  # the bucket filled while idle
    for _ in range(3):
        pacer.update_after_send(1.0)
    assert pacer.next_send_time(1.0) == pytest.approx(1.01)


def test_burst_sends_at_once_and_keeps_the_bucket() -> None:
    pacer = paced()
    pacer.next_send_time(1.0)
    pacer.burst = True
    for _ in range(50):
        assert pacer.next_send_time(1.0) is None
        pacer.update_after_send(1.0)
    assert pacer.bucket_time == pytest.approx(0.025)  # the burst did not drain it
    pacer.burst = False
    for _ in range(3):
        pacer.update_after_send(1.0)
    assert pacer.next_send_time(1.0) == pytest.approx(1.01)


def test_install_replaces_a_connections_pacer() -> None:
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    before = quic._loss._pacer
    pacer = install_burstable_pacer(quic)
    assert quic._loss._pacer is pacer and isinstance(pacer, BurstablePacer)
    assert pacer._max_datagram_size == before._max_datagram_size
    assert (pacer.bucket_max, pacer.packet_time) == (before.bucket_max, before.packet_time)


class FixedRate:
    def __init__(self, rate_bytes: float | None) -> None:
        self.rate_bytes = rate_bytes
        self.asked: list[float] = []

    def pacing_rate_bytes(self, smoothed_rtt_s: float) -> float | None:
        self.asked.append(smoothed_rtt_s)
        return self.rate_bytes


def test_paced_at_the_controllers_rate_not_the_windows() -> None:
    # 5 Mbit/s with a 64-datagram window: aioquic would pace at 92928 B / 40 ms (18.6 Mbit/s)
    source = FixedRate(625_000.0)
    pacer = BurstablePacer(max_datagram_size=1452, rate_source=source)
    pacer.update_rate(congestion_window=64 * 1452, smoothed_rtt=0.04)
    assert source.asked == [0.04]
    assert pacer.pacing_rate_bytes == 625_000.0
    assert pacer.packet_time == pytest.approx(1452 / 625_000.0)
    # the bucket: a quarter of the RTT, 10 ms (6250 B, 4.3 datagrams), not 16 datagrams
    assert pacer.bucket_max == pytest.approx(0.010)


def test_bucket_catches_up_a_quarter_rtt_at_most_10_ms() -> None:
    pacer = BurstablePacer(max_datagram_size=1452, rate_source=FixedRate(6_250_000.0))
    pacer.update_rate(congestion_window=1_000_000, smoothed_rtt=0.08)  # 50 Mbit/s, 80 ms
    assert pacer.bucket_max == pytest.approx(0.010)
    pacer.update_rate(congestion_window=1_000_000, smoothed_rtt=0.02)
    assert pacer.bucket_max == pytest.approx(0.005)
    pacer.update_rate(congestion_window=100_000, smoothed_rtt=0.08)  # a quarter of the window
    assert pacer.bucket_max == pytest.approx(25_000 / 6_250_000.0)
    # a fast short path: aioquic's 16 datagrams (1.2 ms at 150 Mbit/s, not 0.25 ms)
    pacer = BurstablePacer(max_datagram_size=1452, rate_source=FixedRate(18_750_000.0))
    pacer.update_rate(congestion_window=64 * 1452, smoothed_rtt=0.001)
    assert pacer.bucket_max == pytest.approx(16 * 1452 / 18_750_000.0)
    # slow and short: 2 datagrams
    pacer = BurstablePacer(max_datagram_size=1452, rate_source=FixedRate(125_000.0))
    pacer.update_rate(congestion_window=64 * 1452, smoothed_rtt=0.004)
    assert pacer.bucket_max == pytest.approx(2 * 1452 / 125_000.0)


def test_paced_like_aioquic_before_the_controller_has_a_rate() -> None:
    pacer = BurstablePacer(max_datagram_size=1452, rate_source=FixedRate(None))
    pacer.update_rate(congestion_window=14520, smoothed_rtt=0.1)
    assert pacer.packet_time == pytest.approx(0.01)
    assert pacer.bucket_max == pytest.approx(0.025)
    assert pacer.pacing_rate_bytes == pytest.approx(145_200.0)


def test_install_paces_by_a_wangate_controller() -> None:
    from wangate.net.congestion import CONGESTION_CONTROL_NAME, WangateCongestionControl

    config = QuicConfiguration(is_client=True, congestion_control_algorithm=CONGESTION_CONTROL_NAME)
    quic = QuicConnection(configuration=config)
    pacer = install_burstable_pacer(quic)
    assert isinstance(pacer.rate_source, WangateCongestionControl)
    assert pacer.rate_source is quic._loss._cc
    reno = QuicConnection(configuration=QuicConfiguration(is_client=True))
    assert install_burstable_pacer(reno).rate_source is None
