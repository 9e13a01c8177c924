"""Prometheus metrics: the families for fixed rows, histogram math, the HTTP endpoint, a
live daemon."""

from __future__ import annotations

import asyncio
import math
import socket
import time
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from wangate.errors import GatewayError, LocalProtocolError
from wangate.loopback import LoopbackSites, site_address
from wangate.metrics import CONTENT_TYPE, GatewayMetrics, Histogram
from wangate.metrics_http import MetricsServer, parse_request_head
from wangate.rows import GatewayStatus, PathRow

pytestmark = pytest.mark.timeout(120)

# ---------------------------------------------------------------- histogram


def test_histogram_buckets_are_cumulative_and_upper_inclusive() -> None:
    histogram = Histogram((0.01, 0.1, 1.0))
    for value in (0.0, 0.01, 0.010001, 0.1, 0.5, 1.0, 1.5, 100.0, math.nan):
        histogram.observe(value)
    assert histogram.cumulative_counts() == [(0.01, 2), (0.1, 4), (1.0, 6), (math.inf, 8)]
    assert histogram.count == 8  # NaN is not an observation
    assert histogram.sum == pytest.approx(0.0 + 0.01 + 0.010001 + 0.1 + 0.5 + 1.0 + 1.5 + 100.0)


@pytest.mark.parametrize("bounds", [(), (1.0, 1.0), (2.0, 1.0), (1.0, math.inf)])
def test_histogram_refuses_bad_bounds(bounds: tuple[float, ...]) -> None:
    with pytest.raises(LocalProtocolError):
        Histogram(bounds)


def test_delivery_latency_goes_to_the_class_of_the_message() -> None:
    metrics = GatewayMetrics((0.01, 0.1))
    metrics.message_delivered("sh", False, 0.05)
    metrics.message_delivered("sh", True, 0.005)
    metrics.message_failed("gz")
    assert metrics.latency("sh", "critical").cumulative_counts() == [
        (0.01, 1), (0.1, 1), (math.inf, 1)
    ]  # fmt: skip
    assert metrics.latency("sh", "bulk").cumulative_counts() == [
        (0.01, 0), (0.1, 1), (math.inf, 1)
    ]  # fmt: skip
    assert metrics.latency("gz", "bulk").count == 0


# ------------------------------------------------------------ gateway render

ROW_UP: dict[str, Any] = {
    "peer": "sh", "path": "fiber-a", "local": "127.0.10.1:40000", "remote": "127.0.11.1:7443",
    "state": "up", "state_reason": "ok", "srtt_ms": 12.3, "min_rtt_ms": 10.0,
    "rtt_p99_ms": 20.5, "jitter_ms": 0.25, "loss": 0.01, "loss_samples": 100,
    "rate_mbps": 80.0, "inflight_bytes": 3000, "rto_ms": 200.0, "sent_bytes": 123456,
    "recv_bytes": 654321, "acked_bytes": 120000, "lost_bytes": 1200, "spurious_losses": 2,
    "role": "critical", "peer_state": "degraded", "capacity_mbps": 96.0,
    "jobs": {"default": {"bytes_sent": 100, "datagrams_sent": 1},
             "llama": {"bytes_sent": 123356, "datagrams_sent": 90}},
    "data_plane": {"packets_sent": 91, "packets_received": 50, "lost_packets": 1,
                   "not_opened": 4, "replayed": 3, "send_dropped": 0, "key_updates": 0,
                   "congestion_window": 92928, "pacing_rate_bytes": 6250000.0},
}  # fmt: skip
ROW_DOWN: dict[str, Any] = {
    "peer": "sh", "path": 'we"ird', "local": "*", "remote": "(peer dials)", "state": "down",
    "state_reason": "not connected", "srtt_ms": None, "min_rtt_ms": None, "jitter_ms": None,
    "loss": None, "loss_samples": 0, "rate_mbps": None, "sent_bytes": 0, "recv_bytes": 0,
    "role": "bulk", "peer_state": "degraded",
}  # fmt: skip
STATUS: dict[str, Any] = {
    "site": "bj", "version": "0.1.0", "uptime_s": 3.5, "local_messages": 4,
    "inbox": {"queued": 0, "waiting_recvs": 0},
    "peers": {"sh": {
        "state": "degraded", "state_reason": "loss", "silent_s": 0.25, "messages_held": 3,
        "paths_up": ["fiber-a"], "messages_sent": 5, "messages_received": 6,
        "bytes_sent": 7000, "bytes_received": 8000, "messages_waiting": 1,
        "messages_in_flight": 2, "repair_datagrams": 3, "repair_bytes": 3600,
        "source_bytes": 9000, "fec_bytes": 2400, "fec_repair_per_block": 2,
        "bulk_limit_bps": 40_000_000, "bulk_limit_cuts": 7,
    }},
    "jobs": {"llama": {"weight": 3.0, "paths": None, "sites": None, "inbox_queued": 0,
                       "inbox_bytes": 0, "claims": 0, "recent_failures": [],
                       "peers": {"sh": {"bytes_sent": 123356, "bytes_received": 5000,
                                        "messages_in_flight": 2, "held_bytes": 4096,
                                        "waiting_bytes": 8192, "waiting_messages": 1}}}},
}  # fmt: skip

# The exposition the hand-written writer produced for these rows, before the metrics moved
# to prometheus_client: the names, label sets and values may not change.
GOLDEN = """\
# HELP wangate_info This gateway: site name and version.
# TYPE wangate_info gauge
wangate_info{site="bj",version="0.1.0"} 1
# HELP wangate_uptime_seconds Seconds since the gateway started.
# TYPE wangate_uptime_seconds gauge
wangate_uptime_seconds 3.5
# HELP wangate_local_messages_total Messages delivered within this site.
# TYPE wangate_local_messages_total counter
wangate_local_messages_total 4
# HELP wangate_path_info A configured path and its current endpoints (always 1).
# TYPE wangate_path_info gauge
wangate_path_info{peer="sh",path="fiber-a",local="127.0.10.1:40000",remote="127.0.11.1:7443"} 1
wangate_path_info{peer="sh",path="we\\"ird",local="*",remote="(peer dials)"} 1
# HELP wangate_path_state 1 for the path's current state (up, degraded, down).
# TYPE wangate_path_state gauge
wangate_path_state{peer="sh",path="fiber-a",state="up"} 1
wangate_path_state{peer="sh",path="fiber-a",state="degraded"} 0
wangate_path_state{peer="sh",path="fiber-a",state="down"} 0
wangate_path_state{peer="sh",path="we\\"ird",state="up"} 0
wangate_path_state{peer="sh",path="we\\"ird",state="degraded"} 0
wangate_path_state{peer="sh",path="we\\"ird",state="down"} 1
# HELP wangate_path_role 1 for the path's role for our sends (critical, backup, bulk).
# TYPE wangate_path_role gauge
wangate_path_role{peer="sh",path="fiber-a",role="critical"} 1
wangate_path_role{peer="sh",path="fiber-a",role="backup"} 0
wangate_path_role{peer="sh",path="fiber-a",role="bulk"} 0
wangate_path_role{peer="sh",path="we\\"ird",role="critical"} 0
wangate_path_role{peer="sh",path="we\\"ird",role="backup"} 0
wangate_path_role{peer="sh",path="we\\"ird",role="bulk"} 1
# HELP wangate_path_srtt_seconds Smoothed RTT (RFC 9002).
# TYPE wangate_path_srtt_seconds gauge
wangate_path_srtt_seconds{peer="sh",path="fiber-a"} 0.0123
# HELP wangate_path_min_rtt_seconds Minimum RTT over the last 10 s.
# TYPE wangate_path_min_rtt_seconds gauge
wangate_path_min_rtt_seconds{peer="sh",path="fiber-a"} 0.01
# HELP wangate_path_rtt_p99_seconds 99th percentile RTT over the last 10 s.
# TYPE wangate_path_rtt_p99_seconds gauge
wangate_path_rtt_p99_seconds{peer="sh",path="fiber-a"} 0.0205
# HELP wangate_path_jitter_seconds Interarrival jitter (RFC 3550 6.4.1).
# TYPE wangate_path_jitter_seconds gauge
wangate_path_jitter_seconds{peer="sh",path="fiber-a"} 0.00025
# HELP wangate_path_loss_ratio Fraction of the last datagrams (up to 1000) lost.
# TYPE wangate_path_loss_ratio gauge
wangate_path_loss_ratio{peer="sh",path="fiber-a"} 0.01
# HELP wangate_path_loss_samples Datagram outcomes behind the loss ratio.
# TYPE wangate_path_loss_samples gauge
wangate_path_loss_samples{peer="sh",path="fiber-a"} 100
wangate_path_loss_samples{peer="sh",path="we\\"ird"} 0
# HELP wangate_path_delivery_rate_bytes_per_second Delivery rate: highest acknowledged-bytes \
rate over the last 10 s.
# TYPE wangate_path_delivery_rate_bytes_per_second gauge
wangate_path_delivery_rate_bytes_per_second{peer="sh",path="fiber-a"} 10000000.0
# HELP wangate_path_capacity_bytes_per_second Capacity: highest delivery rate over the \
last 10 s of busy time, kept while idle.
# TYPE wangate_path_capacity_bytes_per_second gauge
wangate_path_capacity_bytes_per_second{peer="sh",path="fiber-a"} 12000000.0
# HELP wangate_path_inflight_bytes Bytes sent and not yet acknowledged or lost.
# TYPE wangate_path_inflight_bytes gauge
wangate_path_inflight_bytes{peer="sh",path="fiber-a"} 3000
# HELP wangate_path_rto_seconds Current loss-detection timeout.
# TYPE wangate_path_rto_seconds gauge
wangate_path_rto_seconds{peer="sh",path="fiber-a"} 0.2
# HELP wangate_path_sent_bytes_total Datagram bytes sent on the path.
# TYPE wangate_path_sent_bytes_total counter
wangate_path_sent_bytes_total{peer="sh",path="fiber-a"} 123456
wangate_path_sent_bytes_total{peer="sh",path="we\\"ird"} 0
# HELP wangate_path_received_bytes_total Datagram bytes received on the path.
# TYPE wangate_path_received_bytes_total counter
wangate_path_received_bytes_total{peer="sh",path="fiber-a"} 654321
wangate_path_received_bytes_total{peer="sh",path="we\\"ird"} 0
# HELP wangate_path_acked_bytes_total Datagram bytes the peer acknowledged.
# TYPE wangate_path_acked_bytes_total counter
wangate_path_acked_bytes_total{peer="sh",path="fiber-a"} 120000
# HELP wangate_path_lost_bytes_total Datagram bytes declared lost.
# TYPE wangate_path_lost_bytes_total counter
wangate_path_lost_bytes_total{peer="sh",path="fiber-a"} 1200
# HELP wangate_path_spurious_losses_total Datagrams declared lost that were acknowledged later.
# TYPE wangate_path_spurious_losses_total counter
wangate_path_spurious_losses_total{peer="sh",path="fiber-a"} 2
# HELP wangate_data_plane_packets_sent_total Data-plane packets sent.
# TYPE wangate_data_plane_packets_sent_total counter
wangate_data_plane_packets_sent_total{peer="sh",path="fiber-a"} 91
# HELP wangate_data_plane_packets_received_total Data-plane packets received and opened.
# TYPE wangate_data_plane_packets_received_total counter
wangate_data_plane_packets_received_total{peer="sh",path="fiber-a"} 50
# HELP wangate_data_plane_packets_lost_total Data-plane packets declared lost (RFC 9002).
# TYPE wangate_data_plane_packets_lost_total counter
wangate_data_plane_packets_lost_total{peer="sh",path="fiber-a"} 1
# HELP wangate_data_plane_not_opened_total Packets for this path failing header checks or the AEAD.
# TYPE wangate_data_plane_not_opened_total counter
wangate_data_plane_not_opened_total{peer="sh",path="fiber-a"} 4
# HELP wangate_data_plane_replayed_total Packets seen before, or older than the replay window.
# TYPE wangate_data_plane_replayed_total counter
wangate_data_plane_replayed_total{peer="sh",path="fiber-a"} 3
# HELP wangate_data_plane_send_dropped_total Packets the socket's full send buffer refused.
# TYPE wangate_data_plane_send_dropped_total counter
wangate_data_plane_send_dropped_total{peer="sh",path="fiber-a"} 0
# HELP wangate_data_plane_key_updates_total Key phases moved to (RFC 9001 6).
# TYPE wangate_data_plane_key_updates_total counter
wangate_data_plane_key_updates_total{peer="sh",path="fiber-a"} 0
# HELP wangate_data_plane_congestion_window_bytes The controller's window.
# TYPE wangate_data_plane_congestion_window_bytes gauge
wangate_data_plane_congestion_window_bytes{peer="sh",path="fiber-a"} 92928
# HELP wangate_data_plane_pacing_rate_bytes_per_second The pacer's rate.
# TYPE wangate_data_plane_pacing_rate_bytes_per_second gauge
wangate_data_plane_pacing_rate_bytes_per_second{peer="sh",path="fiber-a"} 6250000
# HELP wangate_peer_paths_up Paths to the peer now connected.
# TYPE wangate_peer_paths_up gauge
wangate_peer_paths_up{peer="sh"} 1
# HELP wangate_peer_state 1 for the peer's current state (up, degraded, unreachable, restarted).
# TYPE wangate_peer_state gauge
wangate_peer_state{peer="sh",state="up"} 0
wangate_peer_state{peer="sh",state="degraded"} 1
wangate_peer_state{peer="sh",state="unreachable"} 0
wangate_peer_state{peer="sh",state="restarted"} 0
# HELP wangate_peer_silent_seconds Seconds since anything was heard from the peer.
# TYPE wangate_peer_silent_seconds gauge
wangate_peer_silent_seconds{peer="sh"} 0.25
# HELP wangate_peer_messages_sent_total Messages the peer acknowledged in full.
# TYPE wangate_peer_messages_sent_total counter
wangate_peer_messages_sent_total{peer="sh"} 5
# HELP wangate_peer_messages_received_total Messages received whole and verified.
# TYPE wangate_peer_messages_received_total counter
wangate_peer_messages_received_total{peer="sh"} 6
# HELP wangate_peer_sent_bytes_total Message body bytes delivered to the peer.
# TYPE wangate_peer_sent_bytes_total counter
wangate_peer_sent_bytes_total{peer="sh"} 7000
# HELP wangate_peer_received_bytes_total Message body bytes received.
# TYPE wangate_peer_received_bytes_total counter
wangate_peer_received_bytes_total{peer="sh"} 8000
# HELP wangate_peer_repair_bytes_total Message bytes sent again to repair losses.
# TYPE wangate_peer_repair_bytes_total counter
wangate_peer_repair_bytes_total{peer="sh"} 3600
# HELP wangate_peer_repair_datagrams_total Datagrams sent to repair losses.
# TYPE wangate_peer_repair_datagrams_total counter
wangate_peer_repair_datagrams_total{peer="sh"} 3
# HELP wangate_peer_source_bytes_total Message bytes sent for the first time.
# TYPE wangate_peer_source_bytes_total counter
wangate_peer_source_bytes_total{peer="sh"} 9000
# HELP wangate_peer_fec_bytes_total Forward error correction (repair symbol) bytes.
# TYPE wangate_peer_fec_bytes_total counter
wangate_peer_fec_bytes_total{peer="sh"} 2400
# HELP wangate_peer_fec_blocks_decoded_total Received blocks rebuilt from repair symbols.
# TYPE wangate_peer_fec_blocks_decoded_total counter
wangate_peer_fec_blocks_decoded_total{peer="sh"} 0
# HELP wangate_peer_ranges_missing_sent_total Confirmation requests answered with missing ranges.
# TYPE wangate_peer_ranges_missing_sent_total counter
wangate_peer_ranges_missing_sent_total{peer="sh"} 0
# HELP wangate_peer_ranges_resent_total Missing-range answers from the peer, sent again.
# TYPE wangate_peer_ranges_resent_total counter
wangate_peer_ranges_resent_total{peer="sh"} 0
# HELP wangate_peer_fec_repair_per_block Repair symbols now sent per block (from the measured loss).
# TYPE wangate_peer_fec_repair_per_block gauge
wangate_peer_fec_repair_per_block{peer="sh"} 2
# HELP wangate_peer_messages_waiting Messages waiting for the peer's credit.
# TYPE wangate_peer_messages_waiting gauge
wangate_peer_messages_waiting{peer="sh"} 1
# HELP wangate_peer_messages_in_flight Messages being sent.
# TYPE wangate_peer_messages_in_flight gauge
wangate_peer_messages_in_flight{peer="sh"} 2
# HELP wangate_peer_messages_held Messages the peer holds that no trainer there has taken yet.
# TYPE wangate_peer_messages_held gauge
wangate_peer_messages_held{peer="sh"} 3
# HELP wangate_peer_bulk_limit_bits_per_second Bulk rate allowed while critical traffic flows \
and the gateways are busy (0: no limit).
# TYPE wangate_peer_bulk_limit_bits_per_second gauge
wangate_peer_bulk_limit_bits_per_second{peer="sh"} 40000000
# HELP wangate_peer_bulk_limit_cuts_total Times bulk was slowed down because the gateways \
delayed critical traffic.
# TYPE wangate_peer_bulk_limit_cuts_total counter
wangate_peer_bulk_limit_cuts_total{peer="sh"} 7
# HELP wangate_peer_messages_failed_total Messages that could not be delivered.
# TYPE wangate_peer_messages_failed_total counter
wangate_peer_messages_failed_total{peer="sh"} 1
# HELP wangate_job_sent_bytes_total Bytes of a job's messages sent to a peer (data and repairs).
# TYPE wangate_job_sent_bytes_total counter
wangate_job_sent_bytes_total{job="llama",peer="sh"} 123356
# HELP wangate_job_received_bytes_total Payload bytes of a job's messages that arrived from a peer.
# TYPE wangate_job_received_bytes_total counter
wangate_job_received_bytes_total{job="llama",peer="sh"} 5000
# HELP wangate_job_messages_in_flight A job's messages to a peer started and not yet confirmed.
# TYPE wangate_job_messages_in_flight gauge
wangate_job_messages_in_flight{job="llama",peer="sh"} 2
# HELP wangate_job_held_bytes Bytes of a job's messages a peer holds that no trainer there took yet.
# TYPE wangate_job_held_bytes gauge
wangate_job_held_bytes{job="llama",peer="sh"} 4096
# HELP wangate_job_waiting_bytes Bytes of a job's messages waiting for credit or the job's cap.
# TYPE wangate_job_waiting_bytes gauge
wangate_job_waiting_bytes{job="llama",peer="sh"} 8192
# HELP wangate_job_path_sent_bytes_total Bytes of a job's messages sent on a path (data, repairs).
# TYPE wangate_job_path_sent_bytes_total counter
wangate_job_path_sent_bytes_total{job="default",path="fiber-a",peer="sh"} 100
wangate_job_path_sent_bytes_total{job="llama",path="fiber-a",peer="sh"} 123356
# HELP wangate_message_delivery_seconds Time from a message's submission until the peer \
acknowledged all of it.
# TYPE wangate_message_delivery_seconds histogram
wangate_message_delivery_seconds_bucket{peer="sh",class="critical",le="0.01"} 1
wangate_message_delivery_seconds_bucket{peer="sh",class="critical",le="0.1"} 1
wangate_message_delivery_seconds_bucket{peer="sh",class="critical",le="+Inf"} 1
wangate_message_delivery_seconds_sum{peer="sh",class="critical"} 0.004
wangate_message_delivery_seconds_count{peer="sh",class="critical"} 1
wangate_message_delivery_seconds_bucket{peer="sh",class="bulk",le="0.01"} 0
wangate_message_delivery_seconds_bucket{peer="sh",class="bulk",le="0.1"} 1
wangate_message_delivery_seconds_bucket{peer="sh",class="bulk",le="+Inf"} 2
wangate_message_delivery_seconds_sum{peer="sh",class="bulk"} 2.05
wangate_message_delivery_seconds_count{peer="sh",class="bulk"} 2
"""


CRITICAL = {"class": "critical"}  # "class" cannot be a keyword argument
BULK = {"class": "bulk"}
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[dict[str, tuple[str, str]], Series]:
    """({family: (type, help)}, {(sample name, labels): value}), no duplicates."""
    families: dict[str, tuple[str, str]] = {}
    series: Series = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families
        families[family.name] = (family.type, family.documentation)
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in series, f"duplicate series {key}"
            series[key] = float(sample.value)
    return families, series


def value(series: Series, name: str, **labels: str) -> float:
    return series[name, frozenset(labels.items())]


def fixed_metrics() -> GatewayMetrics:
    metrics = GatewayMetrics((0.01, 0.1))
    metrics.message_delivered("sh", True, 0.004)
    metrics.message_delivered("sh", False, 0.05)
    metrics.message_delivered("sh", False, 2.0)
    metrics.message_failed("sh")
    return metrics


def render_fixed() -> str:
    rows = [PathRow.from_dict(ROW_UP), PathRow.from_dict(ROW_DOWN)]
    text = fixed_metrics().render(rows, GatewayStatus.from_dict(STATUS)).decode("utf-8")
    assert text.endswith("\n")
    return text


def test_families_names_labels_and_values_are_the_golden_ones() -> None:
    families, series = parse(render_fixed())
    golden_families, golden_series = parse(GOLDEN)
    assert families == golden_families  # names, types and help texts
    assert series == golden_series  # every series: name, label set, exact value
    assert list(families) == list(golden_families)  # in the same order


def test_text_format_lines_for_fixed_rows() -> None:
    lines = render_fixed().splitlines()
    # counters keep their _total names in HELP/TYPE (text format 0.0.4)
    assert "# TYPE wangate_path_sent_bytes_total counter" in lines
    # label values escaped: quote, backslash and line feed (the path is named we"ird)
    assert 'wangate_path_info{local="*",path="we\\"ird",peer="sh",remote="(peer dials)"} 1.0' in (
        lines
    )
    # unit conversion leaves no noise: 12.3 ms is 0.0123 s
    assert 'wangate_path_srtt_seconds{path="fiber-a",peer="sh"} 0.0123' in lines
    # a path never measured has no RTT series at all
    assert not [line for line in lines if "srtt" in line and "ird" in line]


def test_label_values_with_backslashes_and_line_feeds_parse_back_exactly() -> None:
    odd = 'a\\b"c\nd'
    row = PathRow.from_dict({**ROW_DOWN, "path": odd, "remote": "[::1]:7443"})
    text = GatewayMetrics().render([row], GatewayStatus.from_dict(STATUS)).decode("utf-8")
    _, series = parse(text)
    assert value(series, "wangate_path_state", peer="sh", path=odd, state="down") == 1.0
    info = {"peer": "sh", "path": odd, "local": "*", "remote": "[::1]:7443"}
    assert value(series, "wangate_path_info", **info) == 1.0


def test_the_collector_reads_the_rows_at_scrape_time() -> None:
    from wangate.metrics import GatewayCollector, render

    reads: list[int] = []
    status = GatewayStatus.from_dict(STATUS)

    def read() -> tuple[list[PathRow], GatewayStatus]:
        reads.append(1)
        return [PathRow.from_dict({**ROW_UP, "sent_bytes": 1000 * len(reads)})], status

    collector = GatewayCollector(GatewayMetrics(), read)
    assert reads == []
    for expected in (1000.0, 2000.0):
        _, series = parse(render(collector).decode("utf-8"))
        sent = value(series, "wangate_path_sent_bytes_total", peer="sh", path="fiber-a")
        assert sent == expected


# --------------------------------------------------------------------- HTTP


def test_request_head_parsing() -> None:
    assert parse_request_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n") == (
        "GET",
        "/metrics",
    )
    assert parse_request_head(b"GET /metrics\r\n\r\n") is None  # HTTP/0.9
    assert parse_request_head(b"GET metrics HTTP/1.1\r\n\r\n") is None
    assert parse_request_head(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n") is None


async def http_exchange(
    address: tuple[str, int], request: bytes
) -> tuple[str, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("ascii").split("\r\n")
    headers = {}
    for line in header_lines:
        key, _, value = line.partition(": ")
        headers[key.lower()] = value
    return status_line, headers, body


def test_metrics_server_answers_get_metrics_and_refuses_the_rest() -> None:
    renders = []

    def render() -> bytes:
        renders.append(1)
        return b"# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"

    async def main() -> None:
        server = MetricsServer(render, max_request_bytes=1024, read_timeout_s=0.3)
        await server.start("127.0.0.1", 0)
        assert server.address is not None
        addr = server.address
        try:
            status, headers, body = await http_exchange(
                addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"
            )
            assert status == "HTTP/1.1 200 OK"
            assert headers["content-type"] == CONTENT_TYPE
            assert headers["content-length"] == str(len(body))
            assert headers["connection"] == "close"
            assert body == b"# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"

            status, _, body = await http_exchange(addr, b"GET / HTTP/1.1\r\n\r\n")
            assert status == "HTTP/1.1 404 Not Found"
            status, headers, _ = await http_exchange(addr, b"POST /metrics HTTP/1.1\r\n\r\n")
            assert status == "HTTP/1.1 405 Method Not Allowed"
            assert headers["allow"] == "GET, HEAD"
            status, headers, body = await http_exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n")
            assert status == "HTTP/1.1 200 OK" and body == b""
            status, _, _ = await http_exchange(addr, b"\x16\x03\x01garbage\r\n\r\n")
            assert status == "HTTP/1.1 400 Bad Request"
            status, _, _ = await http_exchange(
                addr, b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 4000 + b"\r\n\r\n"
            )
            assert status == "HTTP/1.1 431 Request Header Fields Too Large"
            status, _, _ = await http_exchange(addr, b"GET /metrics HTTP/1.1\r\n")  # no end
            assert status == "HTTP/1.1 408 Request Timeout"
        finally:
            await server.close()
        assert len(renders) == 2  # only the two successful GET/HEAD rendered

    asyncio.run(main())


def test_metrics_server_reports_a_busy_address_as_a_config_problem() -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            server = MetricsServer(lambda: b"")
            with pytest.raises(GatewayError, match=r"\[metrics\] listen"):
                await server.start("127.0.0.1", port)

    asyncio.run(main())


# ------------------------------------------------------------- live daemon


def free_tcp_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_get(host: str, port: int, path: str) -> tuple[str, bytes]:
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], body


def test_a_running_gateway_serves_its_paths_as_metrics(tmp_path: Any) -> None:
    lab = LoopbackSites(2, 2, directory=tmp_path, mtu=1500)
    host = site_address(0, 0)  # bj's first address
    port = free_tcp_port(host)
    bj = lab["bj"]
    bj.config_path.write_text(
        bj.config_path.read_text() + f'\n[metrics]\nlisten = "{host}:{port}"\n'
    )
    with lab:
        with bj.client() as gw:
            gw.send("sh", "g", np.arange(1000, dtype=np.float32), step=1, critical=True)
            gw.send("sh", "g", np.arange(50_000, dtype=np.float32), step=2)
        with lab["sh"].client() as gw:
            gw.recv("g", source="bj", step=1, timeout=30)
            gw.recv("g", source="bj", step=2, timeout=30)
        deadline = time.monotonic() + 10
        while True:  # the sender learns of delivery one ack after the receiver has it
            status, body = http_get(host, port, "/metrics")
            assert status == "HTTP/1.1 200 OK"
            _, series = parse(body.decode())
            done = value(series, "wangate_message_delivery_seconds_count", peer="sh", **BULK)
            if done == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert http_get(host, port, "/")[0] == "HTTP/1.1 404 Not Found"
    count = "wangate_message_delivery_seconds_count"
    assert value(series, count, peer="sh", **CRITICAL) == 1
    assert value(series, count, peer="sh", **BULK) == 1
    assert value(series, "wangate_peer_messages_sent_total", peer="sh") == 2
    for path in ("fiber-a", "fiber-b"):
        states = {
            s: value(series, "wangate_path_state", peer="sh", path=path, state=s)
            for s in ("up", "degraded", "down")
        }
        # up or degraded (a busy test machine can inflate RTTs), never down
        assert states["down"] == 0 and states["up"] + states["degraded"] == 1, states
        assert 0 < value(series, "wangate_path_srtt_seconds", peer="sh", path=path) < 1
        assert 0 < value(series, "wangate_path_min_rtt_seconds", peer="sh", path=path) < 1
        assert value(series, "wangate_path_sent_bytes_total", peer="sh", path=path) > 0
        assert value(series, "wangate_path_loss_ratio", peer="sh", path=path) >= 0
        roles = [
            value(series, "wangate_path_role", peer="sh", path=path, role=r)
            for r in ("critical", "backup", "bulk")
        ]
        assert sorted(roles) == [0, 0, 1]
    sent = sum(
        value(series, "wangate_path_sent_bytes_total", peer="sh", path=p)
        for p in ("fiber-a", "fiber-b")
    )
    assert sent >= 4 * 50_000  # the bulk message's body crossed some path


def test_byte_counters_stay_exact_and_floats_lose_only_conversion_noise() -> None:
    big = (1 << 50) + 1  # 1 PiB and a byte: more digits than 12
    row = PathRow.from_dict({**ROW_UP, "sent_bytes": big, "srtt_ms": 0.1 + 0.2})
    status = GatewayStatus.from_dict(
        {**STATUS, "uptime_s": 1 / 3, "peers": {"sh": {**STATUS["peers"]["sh"], "silent_s": 2 / 3}}}
    )
    _, series = parse(GatewayMetrics().render([row], status).decode("utf-8"))
    assert value(series, "wangate_path_sent_bytes_total", peer="sh", path="fiber-a") == big
    assert value(series, "wangate_path_srtt_seconds", peer="sh", path="fiber-a") == 0.0003
    assert value(series, "wangate_uptime_seconds") == 0.333333333333
    assert value(series, "wangate_peer_silent_seconds", peer="sh") == 0.666666666667
