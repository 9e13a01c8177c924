"""Forged QUIC packets against a real daemon while real traffic flows between two.

Two daemons on loopback (sh dials bj on two paths); bj's listening socket, which also
carries an accepted real path, takes forged Initials from one address and from
spoofed ones, Initials with forged tokens, short-header garbage, and Initials with
valid Retry tokens (half-open connections). Meanwhile messages flow both ways and are
checked byte for byte. The full-size run is ``python -m bench robustness flood``.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wangate.core.admission import AdmissionLimits
from wangate.lab.flood import RssSampler, flood_in_subprocess, listen_address, rss_mib
from wangate.lab.forge import validated_initials
from wangate.lab.traffic import Traffic
from wangate.loopback import LoopbackSites

pytestmark = pytest.mark.timeout(180)

PACKETS = 20_000
RATE_PPS = 5_000
RSS_SLACK_MIB = 50
MAX_SILENCE_S = 2.0
LINK_DOWN = re.compile(r"INFO wangate.daemon: \S+/\S+ down: .*")
SILENT_FOR = re.compile(r"down: silent for ([\d.]+) s")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    with LoopbackSites(2, 2, directory=tmp_path_factory.mktemp("flood")) as sites:
        yield sites


def log_since(lab: LoopbackSites, offsets: dict[str, int]) -> str:
    return "".join(
        lab[name].log_path.read_bytes()[offset:].decode(errors="replace")
        for name, offset in offsets.items()
    )


def test_floods_leave_memory_bound_paths_up_and_traffic_intact(lab: LoopbackSites) -> None:
    bj = lab["bj"]
    assert bj.process is not None
    target = listen_address(bj.config_path)
    start_rss = rss_mib(bj.process.pid)
    sampler = RssSampler(bj.process.pid)
    offsets = {name: len(lab[name].log_path.read_bytes()) for name in ("bj", "sh")}
    traffic = Traffic(lab)
    traffic.start()
    try:
        one = flood_in_subprocess("one-source", target, PACKETS, RATE_PPS)
        spoofed = flood_in_subprocess("spoofed", target, PACKETS, RATE_PPS)
        flood_in_subprocess("bad-token", target, PACKETS // 4, RATE_PPS)
        flood_in_subprocess("garbage", target, PACKETS // 4, RATE_PPS)
    finally:
        result = traffic.stop()
        sampler.stop()
    # the listener answered with Retry (stateless) rather than building connections
    assert one["sent"] == PACKETS
    assert one["replies"] > 0
    assert spoofed["sent"] == PACKETS
    assert (sampler.peak - start_rss, result.errors) == (pytest.approx(0, abs=RSS_SLACK_MIB), [])
    assert result.messages > 0
    assert result.critical_lost == []
    assert len(result.critical_latency_s) > 0
    log = log_since(lab, offsets)
    # no path connection was lost or replaced, and none went silent for long: on a
    # loaded machine (two cores, the flooder, both daemons, the trainers) a path may
    # miss its 0.5 s silence floor now and then; the listener before address
    # validation lost paths for 6 s (bench/RESULTS.md, "Hostile traffic")
    assert LINK_DOWN.findall(log) == []
    silences_s = [float(s) for s in SILENT_FOR.findall(log)]
    assert max(silences_s, default=0.0) < MAX_SILENCE_S, silences_s
    assert rss_mib(bj.process.pid) - start_rss < RSS_SLACK_MIB
    with bj.client() as gw:
        assert all(row["state"] != "down" for row in gw.paths())


def test_validated_half_open_connections_are_capped_and_closed_after_the_timeout(
    lab: LoopbackSites,
) -> None:
    """A source that completes the Retry exchange gets at most 8 half-open connections;
    each is closed (a CONNECTION_CLOSE comes back) when its handshake times out."""
    bj = lab["bj"]
    target = listen_address(bj.config_path)
    limits = AdmissionLimits()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.97.1", 0))
        packets = validated_initials(sock, target, 20)
        assert len(packets) == 20
        sent_at = time.monotonic()
        for packet in packets:
            sock.sendto(packet, target)
        closes = 0
        sock.settimeout(0.5)
        deadline = sent_at + limits.handshake_timeout_s + 5.0
        while time.monotonic() < deadline and closes < 20:
            try:
                data = sock.recv(2048)
            except TimeoutError:
                if closes:
                    break
                continue
            if data[0] & 0xB0 == 0x80:  # long header, Initial: the server's close
                closes += 1
        waited_s = time.monotonic() - sent_at
    assert closes == limits.max_half_open_per_source
    assert waited_s >= limits.handshake_timeout_s
    # the real paths did not notice
    with bj.client() as gw:
        assert all(row["state"] != "down" for row in gw.paths())


def test_a_reset_path_reconnects_through_retry(lab: LoopbackSites) -> None:
    """After the floods, a path reset by the operator is dialed again, and the dialer's
    first Initial is answered with a Retry (aioquic logs the retry at INFO)."""
    sh_log = Path(lab["sh"].log_path)
    retried = sh_log.read_text(errors="replace").count("Retrying with token")
    assert retried >= 2  # at least the two paths' first connections (a redial adds one)
    with lab["bj"].client() as gw:
        gw.reset_path("sh", "fiber-a")
    lab.wait_all_paths_up(timeout_s=20)
    assert sh_log.read_text(errors="replace").count("Retrying with token") >= retried + 1
    with lab["sh"].client() as gw:
        assert all(row["state"] != "down" for row in gw.paths())
