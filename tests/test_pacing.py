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
