"""Prometheus metrics: what ``wangate paths`` shows, as time series.

Three parts, each usable alone:

* ``Exposition``: a tiny writer of the Prometheus text exposition format, version
  0.0.4 (HELP/TYPE lines, label escaping, histogram series). Pure.
* ``Histogram`` and ``GatewayMetrics``: send-to-acknowledged latency per peer and message
  class, fed by the daemon's message events, and the rendering of a gateway's path rows
  and status into metric families. Pure: the daemon passes its rows in.
* ``MetricsServer`` (``wangate.metrics_http``): GET /metrics over HTTP/1.1.

Units follow Prometheus conventions: seconds, bytes, ratios; counters end in ``_total``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from wangate.errors import LocalProtocolError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MetricKind = Literal["gauge", "counter", "histogram"]
Labels = Mapping[str, str]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# Send -> acknowledged: a few ms for small messages on short paths, up to minutes for a
# multi-GiB gradient on a slow one.
DELIVERY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0,
)  # fmt: skip

PEER_STATES = ("up", "degraded", "unreachable", "restarted")
PATH_STATES = ("up", "degraded", "down")
PATH_ROLES = ("critical", "backup", "bulk")
MESSAGE_CLASSES = ("critical", "bulk")


# ---------------------------------------------------------------------- format


def escape_label_value(value: str) -> str:
    """Backslash, double quote and line feed are escaped in label values (format 0.0.4)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """Backslash and line feed are escaped in HELP text; quotes are not."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """Integers exactly; floats to 12 significant digits (drops unit-conversion noise)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(f"{value:.12g}"))


class Exposition:
    """Metric families in declaration order, each with its samples in insertion order."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[MetricKind, str, list[str]]] = {}

    def declare(self, name: str, kind: MetricKind, help_text: str) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise LocalProtocolError(f"invalid metric name {name!r}")
        if kind == "counter" and not name.endswith("_total"):
            raise LocalProtocolError(f"counter {name!r} must end in _total")
        if name in self._families:
            raise LocalProtocolError(f"metric {name!r} declared twice")
        self._families[name] = (kind, help_text, [])

    def add(self, name: str, labels: Labels, value: float) -> None:
        """One sample of a gauge or counter."""
        kind, _, lines = self._family(name)
        if kind == "histogram":
            raise LocalProtocolError(f"{name} is a histogram: use add_histogram")
        lines.append(_sample_line(name, labels, value))

    def add_histogram(self, name: str, labels: Labels, histogram: Histogram) -> None:
        kind, _, lines = self._family(name)
        if kind != "histogram":
            raise LocalProtocolError(f"{name} is a {kind}, not a histogram")
        if "le" in labels:
            raise LocalProtocolError("'le' is reserved for histogram buckets")
        for bound, count in histogram.cumulative_counts():
            bucket_labels = {**labels, "le": format_value(float(bound))}
            lines.append(_sample_line(f"{name}_bucket", bucket_labels, count))
        lines.append(_sample_line(f"{name}_sum", labels, histogram.sum))
        lines.append(_sample_line(f"{name}_count", labels, histogram.count))

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, help_text, lines) in self._families.items():
            out.append(f"# HELP {name} {escape_help(help_text)}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(lines)
        return "".join(line + "\n" for line in out)

    def _family(self, name: str) -> tuple[MetricKind, str, list[str]]:
        family = self._families.get(name)
        if family is None:
            raise LocalProtocolError(f"metric {name!r} was not declared")
        return family


def _sample_line(name: str, labels: Labels, value: float) -> str:
    if not labels:
        return f"{name} {format_value(value)}"
    parts = []
    for key, text in labels.items():
        if not _LABEL_NAME.fullmatch(key) or key.startswith("__"):
            raise LocalProtocolError(f"invalid label name {key!r}")
        parts.append(f'{key}="{escape_label_value(text)}"')
    return f"{name}{{{','.join(parts)}}} {format_value(value)}"


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
    """Per-message outcomes the daemon feeds; renders everything at scrape time."""

    def __init__(self, bounds_s: Sequence[float] = DELIVERY_BUCKETS_S) -> None:
        self._bounds_s = tuple(bounds_s)
        Histogram(self._bounds_s)  # validate once, early
        self._latency: dict[tuple[str, str], Histogram] = {}
        self._failed: dict[str, int] = {}

    def message_delivered(self, peer: str, critical: bool, elapsed_s: float) -> None:
        self.latency(peer, "critical" if critical else "bulk").observe(elapsed_s)

    def message_failed(self, peer: str) -> None:
        self._failed[peer] = self._failed.get(peer, 0) + 1

    def latency(self, peer: str, message_class: str) -> Histogram:
        key = (peer, message_class)
        histogram = self._latency.get(key)
        if histogram is None:
            histogram = self._latency[key] = Histogram(self._bounds_s)
        return histogram

    def render(self, path_rows: Iterable[Mapping[str, Any]], status: Mapping[str, Any]) -> str:
        """The exposition text for ``Gateway.paths()`` rows and ``Gateway.status()``."""
        exposition = Exposition()
        _site_families(exposition, status)
        _path_families(exposition, path_rows)
        peers: Mapping[str, Mapping[str, Any]] = status.get("peers", {})
        _peer_families(exposition, peers, self._failed)
        exposition.declare(
            "wangate_message_delivery_seconds",
            "histogram",
            "Time from a message's submission until the peer acknowledged all of it.",
        )
        for peer in peers:
            for message_class in MESSAGE_CLASSES:
                exposition.add_histogram(
                    "wangate_message_delivery_seconds",
                    {"peer": peer, "class": message_class},
                    self.latency(peer, message_class),
                )
        return exposition.render()


def _site_families(exposition: Exposition, status: Mapping[str, Any]) -> None:
    exposition.declare("wangate_info", "gauge", "This gateway: site name and version.")
    exposition.add(
        "wangate_info",
        {"site": str(status.get("site", "")), "version": str(status.get("version", ""))},
        1,
    )
    exposition.declare("wangate_uptime_seconds", "gauge", "Seconds since the gateway started.")
    exposition.add("wangate_uptime_seconds", {}, float(status.get("uptime_s", 0.0)))
    exposition.declare(
        "wangate_local_messages_total", "counter", "Messages delivered within this site."
    )
    exposition.add("wangate_local_messages_total", {}, int(status.get("local_messages", 0)))


# (metric, kind, help, row key, factor to base units); rows without the key are skipped
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


def _path_families(exposition: Exposition, rows: Iterable[Mapping[str, Any]]) -> None:
    rows = list(rows)
    exposition.declare(
        "wangate_path_info", "gauge", "A configured path and its current endpoints (always 1)."
    )
    exposition.declare(
        "wangate_path_state", "gauge", "1 for the path's current state (up, degraded, down)."
    )
    exposition.declare(
        "wangate_path_role",
        "gauge",
        "1 for the path's role for our sends (critical, backup, bulk).",
    )
    for row in rows:
        labels = {"peer": str(row["peer"]), "path": str(row["path"])}
        exposition.add(
            "wangate_path_info",
            {**labels, "local": str(row.get("local", "")), "remote": str(row.get("remote", ""))},
            1,
        )
        for state in PATH_STATES:
            exposition.add("wangate_path_state", {**labels, "state": state}, row["state"] == state)
        for role in PATH_ROLES:
            exposition.add("wangate_path_role", {**labels, "role": role}, row.get("role") == role)
    for name, kind, help_text, key, factor in _PATH_VALUES:
        exposition.declare(name, kind, help_text)
        for row in rows:
            value = row.get(key)
            if value is None:
                continue
            labels = {"peer": str(row["peer"]), "path": str(row["path"])}
            exposition.add(name, labels, value if factor == 1.0 else value * factor)


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


def _peer_families(
    exposition: Exposition, peers: Mapping[str, Mapping[str, Any]], failed: Mapping[str, int]
) -> None:
    exposition.declare("wangate_peer_paths_up", "gauge", "Paths to the peer now connected.")
    for peer, info in peers.items():
        exposition.add("wangate_peer_paths_up", {"peer": peer}, len(info.get("paths_up", ())))
    exposition.declare(
        "wangate_peer_state",
        "gauge",
        "1 for the peer's current state (up, degraded, unreachable, restarted).",
    )
    for peer, info in peers.items():
        for state in PEER_STATES:
            exposition.add(
                "wangate_peer_state", {"peer": peer, "state": state}, info.get("state") == state
            )
    exposition.declare(
        "wangate_peer_silent_seconds", "gauge", "Seconds since anything was heard from the peer."
    )
    for peer, info in peers.items():
        exposition.add(
            "wangate_peer_silent_seconds", {"peer": peer}, float(info.get("silent_s", 0))
        )
    for name, kind, help_text, key in _PEER_VALUES:
        exposition.declare(name, kind, help_text)
        for peer, info in peers.items():
            exposition.add(name, {"peer": peer}, int(info.get(key, 0)))
    exposition.declare(
        "wangate_peer_messages_failed_total", "counter", "Messages that could not be delivered."
    )
    for peer in peers:
        exposition.add("wangate_peer_messages_failed_total", {"peer": peer}, failed.get(peer, 0))
