"""What a probe measured, and what a planner should make of it. Pure.

* RTT distribution: nearest-rank percentiles of the echo round trips.
* Jitter: RFC 3550 §6.4.1 interarrival jitter of the one-way transit prober ->
  responder (``echo_ns - sent_ns``: the two clocks differ, only differences count), in
  the order the responder received the probes.
* Loss: probes without a reply when the latency phase ends, with the sample count.
* Rate: paced steps at rising rates; the achievable rate is the highest rate the
  responder received in a step that lost at most ``max_step_loss``.
* Verdict: ``critical``, ``bulk`` or ``unusable``, by the thresholds below.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from wangate.probe.packets import RateCounts

MAX_STEP_LOSS = 0.02  # a rate step losing more than this ends the rate phase
MIN_STEP_DELIVERY = 0.8  # ...as does one whose received rate falls below 80% of the target
MAX_RATE_STEPS = 7

VerdictKind = Literal["critical", "bulk", "unusable"]


@dataclass(frozen=True)
class EchoSample:
    seq: int
    sent_ns: int  # prober clock
    reply_ns: int | None  # prober clock when the reply came; None: lost
    echo_ns: int = 0  # responder clock when the request arrived


@dataclass(frozen=True)
class LatencySummary:
    sent: int
    received: int
    loss: float
    rtt_min_s: float | None
    rtt_p50_s: float | None
    rtt_p90_s: float | None
    rtt_p99_s: float | None
    rtt_max_s: float | None
    jitter_s: float | None


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (the smallest value with at least ``fraction`` at or below)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def rfc3550_jitter(transits_s: Sequence[float]) -> float:
    """J += (|D(i-1,i)| - J) / 16 over transit times in arrival order (RFC 3550 §6.4.1)."""
    jitter = 0.0
    for previous, current in itertools.pairwise(transits_s):
        jitter += (abs(current - previous) - jitter) / 16
    return jitter


def summarize_latency(samples: Sequence[EchoSample]) -> LatencySummary:
    replied = [s for s in samples if s.reply_ns is not None]
    sent, received = len(samples), len(replied)
    loss = (sent - received) / sent if sent else 1.0
    if not replied:
        return LatencySummary(sent, 0, loss, None, None, None, None, None, None)
    rtts = sorted((s.reply_ns - s.sent_ns) / 1e9 for s in replied if s.reply_ns is not None)
    by_arrival = sorted(replied, key=lambda s: (s.echo_ns, s.seq))
    jitter = rfc3550_jitter([(s.echo_ns - s.sent_ns) / 1e9 for s in by_arrival])
    return LatencySummary(
        sent,
        received,
        loss,
        rtts[0],
        percentile(rtts, 0.50),
        percentile(rtts, 0.90),
        percentile(rtts, 0.99),
        rtts[-1],
        jitter,
    )


# ------------------------------------------------------------------------ rate


def rate_plan(
    cap_bps: float, *, floor_bps: float = 1e6, steps: int = MAX_RATE_STEPS
) -> list[float]:
    """Doubling rates ending exactly at the cap, at most ``steps`` of them, none below
    ``floor_bps`` unless the cap itself is lower."""
    if cap_bps <= 0:
        raise ValueError("rate cap must be > 0")
    rates = [cap_bps]
    while len(rates) < steps and rates[-1] / 2 >= floor_bps:
        rates.append(rates[-1] / 2)
    return rates[::-1]


@dataclass(frozen=True)
class RateStep:
    target_bps: float
    packets_sent: int
    bytes_sent: int
    send_duration_s: float
    counts: RateCounts  # what the responder reported (NO_COUNTS if it never answered)
    reported: bool = True

    @property
    def sent_bps(self) -> float:
        return self.bytes_sent * 8 / self.send_duration_s if self.send_duration_s > 0 else 0.0

    @property
    def loss(self) -> float:
        if self.packets_sent == 0:
            return 0.0
        return max(0.0, 1 - self.counts.packets / self.packets_sent)

    @property
    def received_bps(self) -> float:
        """Bytes after the first packet over the span between first and last arrival."""
        c = self.counts
        span_s = (c.last_ns - c.first_ns) / 1e9
        if c.packets < 2 or span_s <= 0:
            return 0.0
        return c.received_bytes * (c.packets - 1) / c.packets * 8 / span_s

    def ends_phase(self) -> bool:
        return (
            not self.reported
            or self.loss > MAX_STEP_LOSS
            or self.received_bps < MIN_STEP_DELIVERY * self.target_bps
        )


@dataclass(frozen=True)
class RateSummary:
    achievable_bps: float  # 0.0 when no step passed
    capped: bool  # the last planned step passed: the path may carry more than the cap
    steps: tuple[RateStep, ...]


def summarize_rate(steps: Sequence[RateStep], planned_steps: int) -> RateSummary:
    good = [s for s in steps if s.reported and s.loss <= MAX_STEP_LOSS]
    achievable = max((s.received_bps for s in good), default=0.0)
    capped = len(steps) == planned_steps and bool(steps) and not steps[-1].ends_phase()
    return RateSummary(achievable, capped, tuple(steps))


# --------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class VerdictThresholds:
    unusable_loss: float = 0.10  # more than this lost: unusable
    min_rate_bps: float = 1e6  # achievable below this: unusable
    critical_max_loss: float = 0.01  # critical traffic needs at most this loss...
    critical_tail_floor_s: float = 0.010  # ...p99 - min RTT <= max(floor, fraction * min)
    critical_tail_fraction: float = 0.5
    critical_jitter_floor_s: float = 0.005  # ...jitter <= max(floor, fraction * min RTT)
    critical_jitter_fraction: float = 0.1
    critical_min_samples: int = 20  # ...and enough replies to say so

    def describe(self) -> str:
        return (
            f"critical needs loss <= {self.critical_max_loss:.0%}, "
            f"p99 - min RTT <= max({self.critical_tail_floor_s * 1e3:g} ms, "
            f"{self.critical_tail_fraction:.0%} of min RTT), "
            f"jitter <= max({self.critical_jitter_floor_s * 1e3:g} ms, "
            f"{self.critical_jitter_fraction:.0%} of min RTT), "
            f">= {self.critical_min_samples} replies; "
            f"unusable above {self.unusable_loss:.0%} loss or below "
            f"{self.min_rate_bps / 1e6:g} Mbit/s"
        )


DEFAULT_THRESHOLDS = VerdictThresholds()


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    text: str  # one line for a person or a planner: "bulk only: 3.2% loss"
    reasons: tuple[str, ...]


def judge(
    latency: LatencySummary,
    rate: RateSummary | None,
    thresholds: VerdictThresholds = DEFAULT_THRESHOLDS,
) -> Verdict:
    t = thresholds
    if latency.received == 0:
        return Verdict("unusable", "unusable: no reply from the responder", ("no reply",))
    unusable: list[str] = []
    if latency.loss > t.unusable_loss:
        unusable.append(f"{_pct(latency.loss)} loss")
    if rate is not None and rate.achievable_bps < t.min_rate_bps:
        unusable.append(f"{rate.achievable_bps / 1e6:.2f} Mbit/s achievable")
    if unusable:
        return Verdict("unusable", "unusable: " + ", ".join(unusable), tuple(unusable))
    assert latency.rtt_min_s is not None and latency.rtt_p99_s is not None
    assert latency.jitter_s is not None
    min_rtt = latency.rtt_min_s
    bulk: list[str] = []
    if latency.loss > t.critical_max_loss:
        bulk.append(f"{_pct(latency.loss)} loss")
    tail_s = latency.rtt_p99_s - min_rtt
    if tail_s > max(t.critical_tail_floor_s, t.critical_tail_fraction * min_rtt):
        bulk.append(f"p99 RTT {tail_s * 1e3:.1f} ms above min")
    if latency.jitter_s > max(t.critical_jitter_floor_s, t.critical_jitter_fraction * min_rtt):
        bulk.append(f"jitter {latency.jitter_s * 1e3:.1f} ms")
    if latency.received < t.critical_min_samples:
        bulk.append(f"only {latency.received} replies")
    if bulk:
        return Verdict("bulk", "bulk only: " + ", ".join(bulk), tuple(bulk))
    return Verdict("critical", "good for critical traffic", ())


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.3g}%"


# ---------------------------------------------------------------------- report


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None else round(value_s * 1e3, 3)


def report_dict(
    target: str,
    local: str,
    latency: LatencySummary,
    rate: RateSummary | None,
    verdict: Verdict,
    thresholds: VerdictThresholds,
) -> dict[str, Any]:
    """The ``--json`` document."""
    return {
        "target": target,
        "local": local,
        "latency": {
            "sent": latency.sent,
            "received": latency.received,
            "loss": latency.loss,
            "rtt_ms": {
                "min": _ms(latency.rtt_min_s),
                "p50": _ms(latency.rtt_p50_s),
                "p90": _ms(latency.rtt_p90_s),
                "p99": _ms(latency.rtt_p99_s),
                "max": _ms(latency.rtt_max_s),
            },
            "jitter_ms": _ms(latency.jitter_s),
        },
        "rate": None
        if rate is None
        else {
            "achievable_mbps": round(rate.achievable_bps / 1e6, 3),
            "capped": rate.capped,
            "steps": [
                {
                    "target_mbps": round(s.target_bps / 1e6, 3),
                    "sent_mbps": round(s.sent_bps / 1e6, 3),
                    "received_mbps": round(s.received_bps / 1e6, 3),
                    "loss": round(s.loss, 6),
                    "packets_sent": s.packets_sent,
                    "packets_received": s.counts.packets,
                    "reported": s.reported,
                }
                for s in rate.steps
            ],
        },
        "verdict": {"kind": verdict.kind, "text": verdict.text, "reasons": list(verdict.reasons)},
        "thresholds": thresholds.describe(),
    }


def format_report(doc: dict[str, Any]) -> str:
    """The human-readable report, from ``report_dict``'s document."""
    lat = doc["latency"]
    rtt = lat["rtt_ms"]
    lines = [f"probe {doc['target']} from {doc['local']}"]
    if lat["received"]:
        lines.append(
            f"rtt         min {rtt['min']:.3f}  p50 {rtt['p50']:.3f}  p90 {rtt['p90']:.3f}  "
            f"p99 {rtt['p99']:.3f}  max {rtt['max']:.3f} ms"
        )
        lines.append(f"jitter      {lat['jitter_ms']:.3f} ms (RFC 3550, prober -> responder)")
    lines.append(
        f"loss        {lat['loss'] * 100:.2f}% ({lat['sent'] - lat['received']} of "
        f"{lat['sent']} probes unanswered)"
    )
    rate = doc["rate"]
    if rate is not None:
        lines.append("rate steps  target    sent      received  loss")
        for s in rate["steps"]:
            received = f"{s['received_mbps']:<9.2f}" if s["reported"] else "no report"
            lines.append(
                f"            {s['target_mbps']:<9.2f} {s['sent_mbps']:<9.2f} {received} "
                f"{s['loss'] * 100:.2f}%  Mbit/s"
            )
        note = " (reached --rate-mbps; the path may carry more)" if rate["capped"] else ""
        lines.append(f"achievable  {rate['achievable_mbps']:.2f} Mbit/s{note}")
    lines.append(f"verdict     {doc['verdict']['text']}")
    lines.append(f"thresholds  {doc['thresholds']}")
    return "\n".join(lines)
