"""What a probe measured, and what a planner should make of it. Pure.

* RTT distribution: nearest-rank percentiles of the echo round trips.
* Jitter: RFC 3550 §6.4.1 interarrival jitter of the one-way transit prober ->
  responder (``echo_ns - sent_ns``: the two clocks differ, only differences count), in
  the order the responder received the probes.
* Loss: probes without a reply when the latency phase ends (round trip), and the
  rate phase's one-way random loss over thousands of packets (``rate.py``), each with
  its 95 % Wilson interval.
* Rate: the bottleneck's rate from the dispersion of saturating trains (``rate.py``).
* Verdict: ``critical``, ``bulk`` or ``unusable``, by the thresholds below. Loss is
  judged by its interval: a path is good for critical traffic when the interval's
  upper end is within the threshold, unusable when its lower end is beyond; so one
  packet more or less moves the interval by about 1/n and cannot swing the verdict
  unless the truth sits right at that edge.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from wangate.probe.loss import LossEstimate, round_trip
from wangate.probe.rate import RateSummary

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

    @property
    def loss_estimate(self) -> LossEstimate:
        return LossEstimate(self.sent - self.received, self.sent)


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


# --------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class VerdictThresholds:
    unusable_loss: float = 0.10  # more than this lost one way: unusable
    min_rate_bps: float = 1e6  # achievable below this: unusable
    critical_max_loss: float = 0.01  # critical traffic needs at most this one way...
    critical_tail_floor_s: float = 0.010  # ...p99 - min RTT <= max(floor, fraction * min)
    critical_tail_fraction: float = 0.5
    critical_jitter_floor_s: float = 0.005  # ...jitter <= max(floor, fraction * min RTT)
    critical_jitter_fraction: float = 0.1
    critical_min_samples: int = 20  # ...and enough replies to say so

    def describe(self) -> str:
        return (
            f"critical needs loss <= {self.critical_max_loss:.0%} one way (the 95% "
            f"interval's upper end; echoes: {round_trip(self.critical_max_loss):.2%} "
            f"round trip), "
            f"p99 - min RTT <= max({self.critical_tail_floor_s * 1e3:g} ms, "
            f"{self.critical_tail_fraction:.0%} of min RTT), "
            f"jitter <= max({self.critical_jitter_floor_s * 1e3:g} ms, "
            f"{self.critical_jitter_fraction:.0%} of min RTT), "
            f">= {self.critical_min_samples} replies; "
            f"unusable when loss is above {self.unusable_loss:.0%} (the interval's lower "
            f"end) or the rate below {self.min_rate_bps / 1e6:g} Mbit/s"
        )


DEFAULT_THRESHOLDS = VerdictThresholds()


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    text: str  # one line for a person or a planner: "bulk only: 3.2% loss"
    reasons: tuple[str, ...]


def _loss_reasons(
    latency: LatencySummary, rate: RateSummary | None, t: VerdictThresholds
) -> tuple[list[str], list[str]]:
    """(unusable, bulk) reasons from loss. The rate phase's one-way loss (thousands of
    packets) decides; the echoes (a few hundred, both ways) decide only when there is
    no rate phase, and otherwise only veto a return path that is clearly worse."""
    unusable: list[str] = []
    bulk: list[str] = []
    one_way = rate.loss if rate is not None else None
    echoes = latency.loss_estimate
    echo_low, echo_high = echoes.interval
    if one_way is not None:
        low, high = one_way.interval
        if low > t.unusable_loss:
            unusable.append(f"{one_way.describe()} loss")
        elif high > t.critical_max_loss:
            bulk.append(f"{one_way.describe()} loss{_not_clearly(low, t.critical_max_loss)}")
    if echo_low > round_trip(t.unusable_loss):
        unusable.append(f"{echoes.describe()} round-trip loss")
    elif one_way is None and echo_high > round_trip(t.critical_max_loss):
        limit = round_trip(t.critical_max_loss)
        bulk.append(f"{echoes.describe()} round-trip loss{_not_clearly(echo_low, limit)}")
    elif one_way is not None and echo_low > round_trip(t.critical_max_loss):
        bulk.append(f"{echoes.describe()} round-trip loss")
    return unusable, bulk


def _not_clearly(low: float, limit: float) -> str:
    return f", not clearly below {limit:.2%}" if low <= limit else ""


def judge(
    latency: LatencySummary,
    rate: RateSummary | None,
    thresholds: VerdictThresholds = DEFAULT_THRESHOLDS,
) -> Verdict:
    t = thresholds
    if latency.received == 0:
        return Verdict("unusable", "unusable: no reply from the responder", ("no reply",))
    unusable, bulk = _loss_reasons(latency, rate, t)
    if rate is not None and rate.achievable_bps < t.min_rate_bps:
        unusable.append(f"{rate.achievable_bps / 1e6:.2f} Mbit/s achievable")
    if unusable:
        return Verdict("unusable", "unusable: " + ", ".join(unusable), tuple(unusable))
    assert latency.rtt_min_s is not None and latency.rtt_p99_s is not None
    assert latency.jitter_s is not None
    min_rtt = latency.rtt_min_s
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


# ---------------------------------------------------------------------- report


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None else round(value_s * 1e3, 3)


def _mbps(value_bps: float) -> float:
    return round(value_bps / 1e6, 3)


def _loss_doc(estimate: LossEstimate) -> dict[str, Any]:
    low, high = estimate.interval
    return {
        "sent": estimate.sent,
        "lost": estimate.lost,
        "fraction": round(estimate.fraction, 6),
        "ci95": [round(low, 6), round(high, 6)],
    }


def _rate_doc(rate: RateSummary) -> dict[str, Any]:
    return {
        "achievable_mbps": _mbps(rate.achievable_bps),
        "capped": rate.capped,
        "limit": rate.limit,
        "confirmed": rate.confirmed,
        "goodput_mbps": _mbps(rate.goodput_bps),
        "loss": None if rate.loss is None else _loss_doc(rate.loss),
        "loss_episodes": {"lost": rate.episodes.lost, "sent": rate.episodes.sent},
        "steps": [
            {
                "target_mbps": _mbps(s.target_bps),
                "sent_mbps": _mbps(s.sent_bps),
                "received_mbps": _mbps(s.received_bps),
                "loss": round(s.loss, 6),
                "packets_sent": s.packets_sent,
                "packets_received": s.packets_received,
                "reported": s.reported,
                "kind": kind,
                "purpose": purpose,
            }
            for s, kind, purpose in zip(rate.steps, rate.kinds, rate.purposes, strict=True)
        ],
    }


def report_dict(
    target: str,
    local: str,
    latency: LatencySummary,
    rate: RateSummary | None,
    verdict: Verdict,
    thresholds: VerdictThresholds,
) -> dict[str, Any]:
    """The ``--json`` document."""
    low, high = latency.loss_estimate.interval
    return {
        "target": target,
        "local": local,
        "latency": {
            "sent": latency.sent,
            "received": latency.received,
            "loss": latency.loss,
            "loss_ci95": [round(low, 6), round(high, 6)],
            "rtt_ms": {
                "min": _ms(latency.rtt_min_s),
                "p50": _ms(latency.rtt_p50_s),
                "p90": _ms(latency.rtt_p90_s),
                "p99": _ms(latency.rtt_p99_s),
                "max": _ms(latency.rtt_max_s),
            },
            "jitter_ms": _ms(latency.jitter_s),
        },
        "rate": None if rate is None else _rate_doc(rate),
        "verdict": {"kind": verdict.kind, "text": verdict.text, "reasons": list(verdict.reasons)},
        "thresholds": thresholds.describe(),
    }


_LIMIT_NOTES = {
    "path": "",
    "cap": " (carried all it was sent, up to --rate-mbps: it may carry more)",
    "sender": " (carried all this host could send: it may carry more)",
    "time": " (carried all it was sent before the time ran out: it may carry more)",
    "none": " (nothing was delivered)",
}


def _pct_range(pair: list[float]) -> str:
    return f"{pair[0] * 100:.2f}-{pair[1] * 100:.2f}%"


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
        f"echo loss   {lat['loss'] * 100:.2f}% round trip, 95% CI "
        f"{_pct_range(lat['loss_ci95'])} ({lat['sent'] - lat['received']} of "
        f"{lat['sent']} probes unanswered)"
    )
    rate = doc["rate"]
    if rate is not None:
        lines.append("rate trains target    sent      received  loss     kind")
        for s in rate["steps"]:
            received = f"{s['received_mbps']:<9.2f}" if s["reported"] else "no report"
            lines.append(
                f"            {s['target_mbps']:<9.2f} {s['sent_mbps']:<9.2f} {received} "
                f"{s['loss'] * 100:<7.2f}% {s['kind']} ({s['purpose']})"
            )
        loss = rate["loss"]
        if loss is not None:
            lines.append(
                f"path loss   {loss['fraction'] * 100:.2f}% one way, 95% CI "
                f"{_pct_range(loss['ci95'])} ({loss['lost']} of {loss['sent']} packets of "
                "the trains below the bottleneck rate)"
            )
        episodes = rate["loss_episodes"]
        if episodes["sent"]:
            lines.append(
                f"            left out: {episodes['lost']} of {episodes['sent']} packets lost "
                "in bursts (a queue overflowing for a moment), not random loss"
            )
        note = _LIMIT_NOTES[rate["limit"]]
        if rate["limit"] == "path" and not rate["confirmed"]:
            note = " (one reading: no second saturated train agreed within 10%)"
        lines.append(
            f"achievable  {rate['achievable_mbps']:.2f} Mbit/s at the bottleneck (IP bytes), "
            f"{rate['goodput_mbps']:.2f} Mbit/s of UDP payload{note}"
        )
    lines.append(f"verdict     {doc['verdict']['text']}")
    lines.append(f"thresholds  {doc['thresholds']}")
    return "\n".join(lines)
