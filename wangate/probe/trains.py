"""One train of the rate phase, without I/O: what was sent, what the responder saw,
and what that shows (``wangate/probe/rate.py`` plans the trains).

A train is sent as tests of its own ``test_id``: the *head* (its first quarter),
then the *body*, whole or in segments. Below the bottleneck's rate a train arrives
spread over the span it was sent in and thinned only by random loss (*clean*); above
it, stretched (a queue grew) or thinned further (the queue overflowed: *saturated*).
A piece that lost far more than the binomial allows is a loss episode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from wangate.probe.packets import NO_COUNTS, RateCounts

HEAD_FRACTION = 0.25  # of a train: fills the bottleneck's queue when above its rate
SATURATED_BELOW = 0.9  # delivery ratio (received / sent rate, over 1 - loss) below this
CLEAN_ABOVE = 0.95  # ...at or above this, and not stretched: the train's losses count
CLEAN_MAX_STRETCH = 1.1  # arrival span / send span of a clean train (host stalls stretch)
SENDER_SHORTFALL = 0.9  # sent below 90 % of the target: this host is the limit
EPISODE_SIGMAS = 5.0  # a piece losing this far above the binomial is a loss episode
EPISODE_SLACK = 5  # ...and by at least this many packets more

StepKind = Literal["clean", "saturated", "mixed", "silent"]


@dataclass(frozen=True)
class TrainPart:
    """One test id's worth of a train: what was sent, and the responder's counts."""

    packets_sent: int
    bytes_sent: int  # UDP payload
    first_send_ns: int  # prober clock
    last_send_ns: int
    counts: RateCounts
    reported: bool = True

    @property
    def received(self) -> int:
        return min(self.counts.packets, self.packets_sent)  # duplicates do not count


def join(parts: Sequence[TrainPart]) -> TrainPart:
    """Consecutive parts of a train as one (the body's segments as the body)."""
    arrived = [p.counts for p in parts if p.counts.packets]
    counts = (
        RateCounts(
            sum(c.packets for c in arrived),
            sum(c.received_bytes for c in arrived),
            arrived[0].first_ns,
            arrived[-1].last_ns,
            max(c.max_seq for c in arrived),
        )
        if arrived
        else NO_COUNTS
    )
    return TrainPart(
        sum(p.packets_sent for p in parts),
        sum(p.bytes_sent for p in parts),
        parts[0].first_send_ns,
        parts[-1].last_send_ns,
        counts,
        reported=all(p.reported for p in parts),
    )


@dataclass(frozen=True)
class RateStep:
    target_bps: float
    head: TrainPart
    body: TrainPart  # join(segments) when the body was sent in segments
    segments: tuple[TrainPart, ...] = ()

    @property
    def parts(self) -> tuple[TrainPart, ...]:
        """The pieces loss is counted in: the head and the body's segments."""
        return (self.head, *(self.segments or (self.body,)))

    @property
    def reported(self) -> bool:
        return self.head.reported and self.body.reported

    @property
    def packets_sent(self) -> int:
        return self.head.packets_sent + self.body.packets_sent

    @property
    def packets_received(self) -> int:
        return self.head.received + self.body.received

    @property
    def send_span_s(self) -> float:
        return (self.body.last_send_ns - self.head.first_send_ns) / 1e9

    @property
    def receive_span_s(self) -> float:
        first = self.head.counts if self.head.counts.packets else self.body.counts
        last = self.body.counts if self.body.counts.packets else self.head.counts
        return (last.last_ns - first.first_ns) / 1e9

    @property
    def sent_bps(self) -> float:
        """Payload bits after the first packet over the span they were sent in."""
        span_s = self.send_span_s
        if self.packets_sent < 2 or span_s <= 0:
            return 0.0
        size = (self.head.bytes_sent + self.body.bytes_sent) / self.packets_sent
        return (self.packets_sent - 1) * size * 8 / span_s

    @property
    def received_bps(self) -> float:
        """Payload bits after the first arrival over the span they arrived in."""
        span_s = self.receive_span_s
        received = self.packets_received
        if received < 2 or span_s <= 0:
            return 0.0
        size = (self.head.counts.received_bytes + self.body.counts.received_bytes) / (
            self.head.counts.packets + self.body.counts.packets
        )
        return (received - 1) * size * 8 / span_s

    @property
    def loss(self) -> float:
        if self.packets_sent == 0:
            return 0.0
        return 1 - self.packets_received / self.packets_sent

    @property
    def stretch(self) -> float:
        send_span_s = self.send_span_s
        return self.receive_span_s / send_span_s if send_span_s > 0 else 1.0


def classify(step: RateStep, prior_loss: float | None) -> StepKind:
    """``prior_loss``: the random loss pooled from the clean trains before this one."""
    if not step.reported or step.packets_received < 2 or step.sent_bps <= 0:
        return "silent"
    delivery = step.received_bps / step.sent_bps / (1 - (prior_loss or 0.0))
    stretched = step.stretch > CLEAN_MAX_STRETCH
    # A train this host could not send at its rate (it stalled) proves no bottleneck.
    # Before any clean train, thinning alone is random loss as much as a full queue:
    # only a stretch (a queue grew) says saturated, so the first train, at 1/16 of the
    # cap, counts as clean unless it arrives stretched.
    if (
        delivery < SATURATED_BELOW
        and step.sent_bps >= SENDER_SHORTFALL * step.target_bps
        and (prior_loss is not None or stretched)
    ):
        return "saturated"
    if not stretched and (prior_loss is None or delivery >= CLEAN_ABOVE):
        return "clean"
    return "mixed"


def separate_episodes(
    pieces: Sequence[tuple[int, int]],
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Split (lost, sent) pieces of clean trains into random loss and loss episodes.

    Random loss spreads over the pieces as the binomial says; a burst (a queue that
    overflowed for a moment: cross traffic, a stalled host) lands in one. A piece that
    lost more than ``EPISODE_SIGMAS`` standard deviations (plus a few packets, so that
    small counts never qualify) above what the other pieces' rate predicts is an
    episode; the worst goes first, then the rest are tested again. Returns the
    ((lost, sent) kept, (lost, sent) left out).
    """
    kept = list(pieces)
    out_lost = out_sent = 0
    while len(kept) > 2:
        worst = max(range(len(kept)), key=lambda i: kept[i][0] / max(1, kept[i][1]))
        lost, sent = kept[worst]
        others_lost = sum(p[0] for p in kept) - lost
        others_sent = sum(p[1] for p in kept) - sent
        rate = others_lost / others_sent if others_sent else 0.0
        expected = sent * rate
        limit = expected + EPISODE_SIGMAS * math.sqrt(expected * (1 - rate)) + EPISODE_SLACK
        if lost <= limit:
            break
        del kept[worst]
        out_lost, out_sent = out_lost + lost, out_sent + sent
    return (sum(p[0] for p in kept), sum(p[1] for p in kept)), (out_lost, out_sent)


def pooled_loss(pieces: Sequence[tuple[int, int]]) -> float | None:
    sent = sum(p[1] for p in pieces)
    return sum(p[0] for p in pieces) / sent if sent else None


def piece_is_clean(part: TrainPart, prior_loss: float) -> bool:
    """One segment judged like a whole train: not stretched, delivered as random loss
    allows (``classify``'s clean)."""
    send_span_s = (part.last_send_ns - part.first_send_ns) / 1e9
    receive_span_s = (part.counts.last_ns - part.counts.first_ns) / 1e9
    if part.packets_sent < 2 or part.received < 2 or send_span_s <= 0 or receive_span_s <= 0:
        return False
    stretch = receive_span_s / send_span_s
    delivered = part.received / part.packets_sent / stretch
    return stretch <= CLEAN_MAX_STRETCH and delivered >= CLEAN_ABOVE * (1 - prior_loss)
