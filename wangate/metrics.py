"""Prometheus metrics: what ``wangate paths`` and ``wangate status`` show, as time series.

* ``Histogram`` and ``GatewayMetrics``: send-to-acknowledged latency per peer and message
  class, fed by the daemon's message events. Pure.
* ``GatewayCollector``: a ``prometheus_client`` collector that turns a gateway's
  ``PathRow``s and ``GatewayStatus`` into metric families at scrape time;
  ``render`` writes them in the text exposition format 0.0.4 (``generate_latest``).
* ``MetricsServer`` (``wangate.metrics_http``): GET /metrics on the daemon's event loop.

Units follow Prometheus conventions: seconds, bytes, ratios; counters end in ``_total``.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from wangate.errors import LocalProtocolError
from wangate.rows import PATH_ROLES, PATH_STATES, PEER_STATES, GatewayStatus, PathRow, PeerStatus

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

MetricKind = Literal["gauge", "counter"]

# Send -> acknowledged: a few ms for small messages on short paths, up to minutes for a
# multi-GiB gradient on a slow one.
DELIVERY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0,
)  # fmt: skip

MESSAGE_CLASSES = ("critical", "bulk")


# ------------------------------------------------------------------ histogram


class Histogram:
    """Prometheus-style histogram: a value ``v`` counts in every bucket with ``le >= v``."""

    def __init__(self, bounds: Sequence[float] = DELIVERY_BUCKETS_S) -> None:
        if not bounds or any(not math.isfinite(b) for b in bounds):
            raise LocalProtocolError("histogram bounds must be finite and at least one")
        if any(a >= b for a, b in itertools.pairwise(bounds)):
            raise LocalProtocolError("histogram bounds must increase strictly")
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # per bucket, last = above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        if math.isnan(value):
            return
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative_counts(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it), ending with (+inf, count)."""
        result: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self._counts, strict=True):
            running += n
            result.append((bound, running))
        return result


# -------------------------------------------------------------- gateway view


class GatewayMetrics:
    """Per-message outcomes the daemon feeds; turned into families at scrape time."""

    def __init__(self, bounds_s: Sequence[float] = DELIVERY_BUCKETS_S) -> None:
        self._bounds_s = tuple(bounds_s)
        Histogram(self._bounds_s)  # validate once, early
        self._le = [_le(bound) for bound in (*self._bounds_s, math.inf)]  # bucket labels
        self._latency: dict[tuple[str, str], Histogram] = {}
        self._failed: dict[str, int] = {}

    def message_delivered(self, peer: str, critical: bool, elapsed_s: float) -> None:
        self.latency(peer, "critical" if critical else "bulk").observe(elapsed_s)

    def message_failed(self, peer: str) -> None:
        self._failed[peer] = self._failed.get(peer, 0) + 1

    def failed(self, peer: str) -> int:
        return self._failed.get(peer, 0)

    def latency(self, peer: str, message_class: str) -> Histogram:
        key = (peer, message_class)
        histogram = self._latency.get(key)
        if histogram is None:
            histogram = self._latency[key] = Histogram(self._bounds_s)
        return histogram

    def families(self, rows: Sequence[PathRow], status: GatewayStatus) -> Iterator[Metric]:
        """Every family for these rows and this status, in a fixed order."""
        yield from _site_families(status)
        yield from _path_families(rows)
        yield from _peer_families(status.peers, self)
        yield from _job_families(rows, status)
        delivery = HistogramMetricFamily(
            "wangate_message_delivery_seconds",
            "Time from a message's submission until the peer acknowledged all of it.",
            labels=("peer", "class"),
        )
        for peer in status.peers:
            for message_class in MESSAGE_CLASSES:
                histogram = self.latency(peer, message_class)
                counts = (n for _, n in histogram.cumulative_counts())
                buckets = list(zip(self._le, counts, strict=True))
                delivery.add_metric((peer, message_class), buckets, _clean(histogram.sum))
        yield delivery

    def render(self, rows: Sequence[PathRow], status: GatewayStatus) -> bytes:
        """The exposition text (format 0.0.4) for these rows and this status."""
        return render(GatewayCollector(self, lambda: (rows, status)))


class GatewayCollector:
    """A ``prometheus_client`` collector: reads the rows when scraped, never before."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        read: Callable[[], tuple[Sequence[PathRow], GatewayStatus]],
    ) -> None:
        self._metrics = metrics
        self._read = read

    def collect(self) -> Iterator[Metric]:
        rows, status = self._read()
        yield from self._metrics.families(rows, status)


def render(collector: GatewayCollector) -> bytes:
    return generate_latest(collector)


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it ("0.25", "1.0", "+Inf")."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]


def _clean(value: float) -> float:
    """A float to 12 significant digits: drops unit-conversion noise (12.3 ms -> 0.0123 s,
    not 0.012300000000000002). Integers (byte counters) stay exact."""
    if isinstance(value, int) or not math.isfinite(value):
        return value
    return float(f"{value:.12g}")


def _family(
    name: str, kind: MetricKind, help_text: str, labels: Sequence[str]
) -> CounterMetricFamily | GaugeMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


# (metric, kind, help, key in status()["jobs"][job]["peers"][peer])
_JOB_SERIES: tuple[tuple[str, MetricKind, str, str], ...] = (
    ("wangate_job_sent_bytes_total", "counter",
     "Bytes of a job's messages sent to a peer (data and repairs).", "bytes_sent"),
    ("wangate_job_received_bytes_total", "counter",
     "Payload bytes of a job's messages that arrived from a peer.", "bytes_received"),
    ("wangate_job_messages_in_flight", "gauge",
     "A job's messages to a peer started and not yet confirmed.", "messages_in_flight"),
    ("wangate_job_held_bytes", "gauge",
     "Bytes of a job's messages a peer holds that no trainer there took yet.", "held_bytes"),
    ("wangate_job_waiting_bytes", "gauge",
     "Bytes of a job's messages waiting for credit or the job's cap.",
     "waiting_bytes"),
)  # fmt: skip


def _job_families(rows: Sequence[PathRow], status: GatewayStatus) -> Iterator[Metric]:
    """Per job (the ``job`` label): what it sent on each path, and per peer its bytes
    and messages (``status()["jobs"]``)."""
    for name, kind, help_text, key in _JOB_SERIES:
        family = _family(name, kind, help_text, ("job", "peer"))
        for job, info in status.jobs.items():
            for peer, counts in info["peers"].items():
                family.add_metric((job, peer), counts[key])
        yield family
    per_worker = any(row.worker is not None for row in rows)
    labels = ("job", "peer", "path", "worker") if per_worker else ("job", "peer", "path")
    on_path = CounterMetricFamily(
        "wangate_job_path_sent_bytes",
        "Bytes of a job's messages sent on a path (data, repairs).",
        labels=labels,
    )
    for row in rows:
        where = (row.peer, row.path, str(row.worker)) if per_worker else (row.peer, row.path)
        for job, counts in row.jobs.items():
            on_path.add_metric((job, *where), counts["bytes_sent"])
    yield on_path


def _site_families(status: GatewayStatus) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "wangate_info", "This gateway: site name and version.", labels=("site", "version")
    )
    info.add_metric((status.site, status.version), 1)
    yield info
    yield GaugeMetricFamily(
        "wangate_uptime_seconds",
        "Seconds since the gateway started.",
        value=_clean(status.uptime_s),
    )
    yield CounterMetricFamily(
        "wangate_local_messages_total",
        "Messages delivered within this site.",
        value=status.local_messages,
    )
    if status.workers:
        cpu = CounterMetricFamily(
            "wangate_worker_cpu_seconds_total",
            "CPU seconds (user and system) of each worker process, restarts included.",
            labels=("worker",),
        )
        queued = GaugeMetricFamily(
            "wangate_worker_queued_bytes",
            "Stripe bytes handed to each worker and not yet confirmed.",
            labels=("worker",),
        )
        for worker in status.workers:
            cpu.add_metric((str(worker["index"]),), _clean(float(worker["cpu_s"])))
            queued.add_metric((str(worker["index"]),), worker["queued_bytes"])
        yield from (cpu, queued)


# (metric, kind, help, PathRow field, factor to base units); a row's None is left out
_PATH_VALUES: tuple[tuple[str, MetricKind, str, str, float], ...] = (
    ("wangate_path_srtt_seconds", "gauge", "Smoothed RTT (RFC 9002).", "srtt_ms", 1e-3),
    ("wangate_path_min_rtt_seconds", "gauge", "Minimum RTT over the last 10 s.",
     "min_rtt_ms", 1e-3),
    ("wangate_path_rtt_p99_seconds", "gauge", "99th percentile RTT over the last 10 s.",
     "rtt_p99_ms", 1e-3),
    ("wangate_path_jitter_seconds", "gauge", "Interarrival jitter (RFC 3550 6.4.1).",
     "jitter_ms", 1e-3),
    ("wangate_path_loss_ratio", "gauge", "Fraction of the last datagrams (up to 1000) lost.",
     "loss", 1.0),
    ("wangate_path_loss_samples", "gauge", "Datagram outcomes behind the loss ratio.",
     "loss_samples", 1.0),
    ("wangate_path_delivery_rate_bytes_per_second", "gauge",
     "Delivery rate: highest acknowledged-bytes rate over the last 10 s.", "rate_mbps", 125e3),
    ("wangate_path_capacity_bytes_per_second", "gauge",
     "Capacity: highest delivery rate over the last 10 s of busy time, kept while idle.",
     "capacity_mbps", 125e3),
    ("wangate_path_inflight_bytes", "gauge", "Bytes sent and not yet acknowledged or lost.",
     "inflight_bytes", 1.0),
    ("wangate_path_rto_seconds", "gauge", "Current loss-detection timeout.", "rto_ms", 1e-3),
    ("wangate_path_sent_bytes_total", "counter", "Datagram bytes sent on the path.",
     "sent_bytes", 1.0),
    ("wangate_path_received_bytes_total", "counter", "Datagram bytes received on the path.",
     "recv_bytes", 1.0),
    ("wangate_path_acked_bytes_total", "counter", "Datagram bytes the peer acknowledged.",
     "acked_bytes", 1.0),
    ("wangate_path_lost_bytes_total", "counter", "Datagram bytes declared lost.",
     "lost_bytes", 1.0),
    ("wangate_path_spurious_losses_total", "counter",
     "Datagrams declared lost that were acknowledged later.", "spurious_losses", 1.0),
)  # fmt: skip


# (metric, kind, help, key of PathRow.data_plane): the connection's data plane
_DATA_PLANE_VALUES: tuple[tuple[str, MetricKind, str, str], ...] = (
    ("wangate_data_plane_packets_sent_total", "counter", "Data-plane packets sent.",
     "packets_sent"),
    ("wangate_data_plane_packets_received_total", "counter",
     "Data-plane packets received and opened.", "packets_received"),
    ("wangate_data_plane_packets_lost_total", "counter",
     "Data-plane packets declared lost (RFC 9002).", "lost_packets"),
    ("wangate_data_plane_not_opened_total", "counter",
     "Packets for this path failing header checks or the AEAD.",
     "not_opened"),
    ("wangate_data_plane_replayed_total", "counter",
     "Packets seen before, or older than the replay window.", "replayed"),
    ("wangate_data_plane_send_dropped_total", "counter",
     "Packets the socket's full send buffer refused.", "send_dropped"),
    ("wangate_data_plane_key_updates_total", "counter", "Key phases moved to (RFC 9001 6).",
     "key_updates"),
    ("wangate_data_plane_congestion_window_bytes", "gauge", "The controller's window.",
     "congestion_window"),
    ("wangate_data_plane_pacing_rate_bytes_per_second", "gauge", "The pacer's rate.",
     "pacing_rate_bytes"),
)  # fmt: skip


def _path_families(rows: Sequence[PathRow]) -> Iterator[Metric]:
    # with worker processes a path has one connection per worker: one series each
    per_worker = any(row.worker is not None for row in rows)
    base: tuple[str, ...] = ("peer", "path", "worker") if per_worker else ("peer", "path")

    def key(row: PathRow) -> tuple[str, ...]:
        return (row.peer, row.path, str(row.worker)) if per_worker else (row.peer, row.path)

    info = GaugeMetricFamily(
        "wangate_path_info",
        "A configured path and its current endpoints (always 1).",
        labels=(*base, "local", "remote"),
    )
    states = GaugeMetricFamily(
        "wangate_path_state",
        "1 for the path's current state (up, degraded, down).",
        labels=(*base, "state"),
    )
    roles = GaugeMetricFamily(
        "wangate_path_role",
        "1 for the path's role for our sends (critical, backup, bulk).",
        labels=(*base, "role"),
    )
    for row in rows:
        info.add_metric((*key(row), row.local, row.remote), 1)
        for state in PATH_STATES:
            states.add_metric((*key(row), state), row.state == state)
        for role in PATH_ROLES:
            roles.add_metric((*key(row), role), row.role == role)
    yield from (info, states, roles)
    for name, kind, help_text, field_name, factor in _PATH_VALUES:
        family = _family(name, kind, help_text, base)
        for row in rows:
            value: float | None = getattr(row, field_name)
            if value is not None:
                family.add_metric(key(row), _clean(value if factor == 1 else value * factor))
        yield family
    for name, kind, help_text, data_key in _DATA_PLANE_VALUES:
        family = _family(name, kind, help_text, base)
        for row in rows:
            if data_key in row.data_plane:
                family.add_metric(key(row), _clean(float(row.data_plane[data_key])))
        yield family


_PEER_VALUES: tuple[tuple[str, MetricKind, str, str], ...] = (
    ("wangate_peer_messages_sent_total", "counter", "Messages the peer acknowledged in full.",
     "messages_sent"),
    ("wangate_peer_messages_received_total", "counter", "Messages received whole and verified.",
     "messages_received"),
    ("wangate_peer_sent_bytes_total", "counter", "Message body bytes delivered to the peer.",
     "bytes_sent"),
    ("wangate_peer_received_bytes_total", "counter", "Message body bytes received.",
     "bytes_received"),
    ("wangate_peer_repair_bytes_total", "counter", "Message bytes sent again to repair losses.",
     "repair_bytes"),
    ("wangate_peer_repair_datagrams_total", "counter", "Datagrams sent to repair losses.",
     "repair_datagrams"),
    ("wangate_peer_source_bytes_total", "counter", "Message bytes sent for the first time.",
     "source_bytes"),
    ("wangate_peer_fec_bytes_total", "counter", "Forward error correction (repair symbol) bytes.",
     "fec_bytes"),
    ("wangate_peer_fec_blocks_decoded_total", "counter",
     "Received blocks rebuilt from repair symbols.", "blocks_decoded"),
    ("wangate_peer_ranges_missing_sent_total", "counter",
     "Confirmation requests answered with missing ranges.",
     "ranges_missing_sent"),
    ("wangate_peer_ranges_resent_total", "counter",
     "Missing-range answers from the peer, sent again.",
     "ranges_resent"),
    ("wangate_peer_fec_repair_per_block", "gauge",
     "Repair symbols now sent per block (from the measured loss).", "fec_repair_per_block"),
    ("wangate_peer_messages_waiting", "gauge", "Messages waiting for the peer's credit.",
     "messages_waiting"),
    ("wangate_peer_messages_in_flight", "gauge", "Messages being sent.", "messages_in_flight"),
    ("wangate_peer_messages_held", "gauge",
     "Messages the peer holds that no trainer there has taken yet.", "messages_held"),
    ("wangate_peer_bulk_limit_bits_per_second", "gauge",
     "Bulk rate allowed while critical traffic flows and the gateways are busy (0: no limit).",
     "bulk_limit_bps"),
    ("wangate_peer_bulk_limit_cuts_total", "counter",
     "Times bulk was slowed down because the gateways delayed critical traffic.",
     "bulk_limit_cuts"),
)  # fmt: skip


def _peer_families(peers: Mapping[str, PeerStatus], metrics: GatewayMetrics) -> Iterator[Metric]:
    paths_up = GaugeMetricFamily(
        "wangate_peer_paths_up", "Paths to the peer now connected.", labels=("peer",)
    )
    states = GaugeMetricFamily(
        "wangate_peer_state",
        "1 for the peer's current state (up, degraded, unreachable, restarted).",
        labels=("peer", "state"),
    )
    silent = GaugeMetricFamily(
        "wangate_peer_silent_seconds",
        "Seconds since anything was heard from the peer.",
        labels=("peer",),
    )
    for peer, info in peers.items():
        paths_up.add_metric((peer,), len(info.paths_up))
        for state in PEER_STATES:
            states.add_metric((peer, state), info.state == state)
        silent.add_metric((peer,), _clean(info.silent_s))
    yield from (paths_up, states, silent)
    for name, kind, help_text, key in _PEER_VALUES:
        family = _family(name, kind, help_text, ("peer",))
        for peer, info in peers.items():
            value = info.messages_held if key == "messages_held" else info.counter(key)
            family.add_metric((peer,), _clean(value))
        yield family
    failed = CounterMetricFamily(
        "wangate_peer_messages_failed_total",
        "Messages that could not be delivered.",
        labels=("peer",),
    )
    for peer in peers:
        failed.add_metric((peer,), metrics.failed(peer))
    yield failed
