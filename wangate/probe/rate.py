"""The rate phase of a probe, without I/O: what to send, and what the responder saw.

Capacity from dispersion. A train sent faster than the bottleneck leaves it back to
back, one packet every ``size / rate``, whatever the overdrive; so the responder's
arrival span over the packets that passed the bottleneck gives its rate directly
(packet-pair/train dispersion: Jacobson 1988, Keshav 1991, Dovrolis et al. 2004),
without a search. Each train is sent as two tests: the *head* (its first quarter)
builds a queue at the bottleneck, the *body* is measured while that queue keeps the
bottleneck busy, so a pause of the sender early in the train does not read as a slow
path. Random loss after the bottleneck thins the arrivals but not their spacing, so
the packets that passed are ``received / (1 - random loss)``. A confirming train's
body is sent in segments and read as their median, robust to one stalled segment.

Random loss apart from congestion loss. A train below the bottleneck rate arrives
spread over the span it was sent in (no queue grew) and delivers ``1 - p`` of what was
sent at every rate: its losses are the path's. A train above it is stretched (a queue
grew) or thinned beyond ``1 - p`` (the queue overflowed): its losses are the probe's
own and are not counted. The path's loss is pooled over the clean trains (thousands
of packets: the last one runs at 85 % of the capacity for the rest of the phase). A
clean train is counted in pieces (head, and the long train's body in 0.25 s
segments): a piece that lost far more than the binomial allows is a loss episode (a
queue overflowing for a moment under cross traffic or a host's stall), reported
apart from the random loss (``separate_episodes``).

Plan: rates doubling up to the cap (short trains) until one saturates; a longer train
at 1.2 x the capacity it showed, to confirm it (``RateSearch`` says when a reading is
not trusted); the rest of the time a clean train at 85 % of the capacity. Rates
here are UDP payload bits; capacity is reported in IP bits
(payload + IP/UDP headers), the unit link rates are quoted in.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from wangate.probe.loss import NO_LOSS, LossEstimate
from wangate.probe.packets import NO_COUNTS, RateCounts

MAX_RAMP_STEPS = 5  # doubling: the first train runs at 1/16 of the cap
RAMP_STEP_S = 0.3  # at most; 6 % of the phase, at least MIN_RAMP_STEP_S
MIN_RAMP_STEP_S = 0.15
CONFIRM_STEP_S = 0.5
CONFIRM_SEGMENTS = 4  # its reading: the median of its body's segments
MIN_CLEAN_STEP_S = 0.5
HEAD_FRACTION = 0.25  # of a train: fills the bottleneck's queue when above its rate
CONFIRM_OVERDRIVE = 1.2
CLEAN_FRACTION = 0.85  # of the capacity: the long train that measures loss
SATURATED_BELOW = 0.9  # delivery ratio (received / sent rate, over 1 - loss) below this
CLEAN_ABOVE = 0.95  # ...at or above this, and not stretched: the train's losses count
CLEAN_MAX_STRETCH = 1.1  # arrival span / send span of a clean train (host stalls stretch)
SENDER_SHORTFALL = 0.9  # sent below 90 % of the target: this host is the limit
AGREEMENT = 0.1  # two readings within 10 % of each other confirm the capacity
SEGMENT_S = 0.25  # the long clean train is counted in pieces this long...
MAX_SEGMENTS = 40  # ...at most this many (tests the responder keeps: 256)
EPISODE_SIGMAS = 5.0  # a piece losing this far above the binomial is a loss episode
EPISODE_SLACK = 5  # ...and by at least this many packets more
TRUST_MARGIN = 0.97  # a saturated reading below 97 % of a clean train's delivery is wrong

StepKind = Literal["clean", "saturated", "mixed", "silent"]
Limit = Literal["path", "cap", "sender", "time", "none"]


def rate_plan(
    cap_bps: float, *, floor_bps: float = 1e6, steps: int = MAX_RAMP_STEPS
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


def _pooled(pieces: Sequence[tuple[int, int]]) -> float | None:
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


@dataclass(frozen=True)
class PlannedStep:
    target_bps: float
    duration_s: float
    purpose: Literal["ramp", "confirm", "clean"]
    segments: int = 1  # the body sent as this many tests, one after the other


@dataclass(frozen=True)
class RateSummary:
    achievable_bps: float  # bottleneck rate in IP bits (0 when nothing was delivered)
    goodput_bps: float  # UDP payload it delivers at that rate, random loss taken off
    limit: Limit  # "path": trains saturated it; otherwise it carried all that was sent,
    # up to the cap, to what this host could send, or to where the time ran out
    loss: LossEstimate | None  # random loss over the clean trains (None: there were none)
    steps: tuple[RateStep, ...]
    kinds: tuple[StepKind, ...]
    purposes: tuple[str, ...] = ()
    confirmed: bool = False  # two saturated trains agreed on the capacity
    episodes: LossEstimate = NO_LOSS  # loss bursts left out of ``loss`` (lost, sent)

    @property
    def capped(self) -> bool:
        """The path carried everything sent: it may carry more than was measured."""
        return self.limit in ("cap", "sender", "time")


class RateSearch:
    """Pull the next train with ``next_step()``; hand back what it showed with ``record``.

    A saturated train is trusted only when its capacity is at least what some clean
    train delivered (a stall of a host on the way stretches a train like a queue does,
    and a train barely above the bottleneck lets it idle: both read low). A reading is
    confirmed by a train at 1.2 x it that reads within 10 % of it; until then (time
    allowing) the latest reading is tried again the same way. A clean train at or
    above a reading discards it and the doubling goes on from there.
    """

    def __init__(
        self,
        cap_bps: float,
        budget_s: float,
        rtt_s: float,
        *,
        payload_bytes: int,
        header_bytes: int,
        floor_bps: float = 1e6,
    ) -> None:
        self.cap_bps = cap_bps
        self.ip_per_payload = (payload_bytes + header_bytes) / payload_bytes
        self.settle_s = min(0.5, rtt_s + 0.05)  # the last packets arrive, a queue drains
        self.overhead_s = self.settle_s + rtt_s  # ...and the query's round trip
        self.budget_s = budget_s
        self.spent_s = 0.0
        self.first_bps = rate_plan(cap_bps, floor_bps=floor_bps)[0]
        self.ramp_s = min(RAMP_STEP_S, max(MIN_RAMP_STEP_S, 0.06 * budget_s))
        self.steps: list[RateStep] = []
        self.kinds: list[StepKind] = []
        self.purposes: list[str] = []
        self._pending: PlannedStep | None = None
        self._done = False

    def next_step(self) -> PlannedStep | None:
        if self._pending is not None:
            raise RuntimeError("record the last step before asking for the next")
        plan = None if self._done else self._plan()
        if plan is None or plan.purpose == "clean":
            self._done = True
        if plan is not None:
            self.spent_s += plan.duration_s + self.overhead_s
        self._pending = plan
        return plan

    def _affordable(self, duration_s: float) -> bool:
        """Time for this train and still for the clean one after it."""
        after_s = self.budget_s - self.spent_s - duration_s - 2 * self.overhead_s
        return after_s >= MIN_CLEAN_STEP_S

    def _plan(self) -> PlannedStep | None:
        if self.kinds and self.kinds[-1] == "silent":
            return self._clean()
        trusted = self._trusted()
        if trusted:
            if self._agreeing() is None and self._affordable(CONFIRM_STEP_S):
                latest_bps = self._capacity_payload_bps(trusted[-1:], self._pooled_loss())
                target = min(self.cap_bps, CONFIRM_OVERDRIVE * latest_bps)
                return PlannedStep(target, CONFIRM_STEP_S, "confirm", CONFIRM_SEGMENTS)
            return self._clean()
        carried = [s.target_bps for s, k in self._history() if k in ("clean", "mixed")]
        if not self.steps:
            target = self.first_bps
        elif not carried or max(carried) >= self.cap_bps:
            return self._clean()
        else:
            target = min(self.cap_bps, 2 * max(carried))
        if self.steps and not self._affordable(self.ramp_s):
            return self._clean()
        return PlannedStep(target, self.ramp_s, "ramp")

    def _clean(self) -> PlannedStep | None:
        capacity_bps = self._capacity()
        if capacity_bps <= 0:
            return None
        duration_s = max(MIN_CLEAN_STEP_S, self.budget_s - self.spent_s - self.overhead_s)
        segments = max(1, min(MAX_SEGMENTS, round(duration_s / SEGMENT_S)))
        return PlannedStep(CLEAN_FRACTION * capacity_bps, duration_s, "clean", segments)

    def record(self, step: RateStep) -> StepKind:
        planned = self._pending
        if planned is None:
            raise RuntimeError("no step was planned")
        self._pending = None
        prior = self._pooled_loss()
        kind = classify(step, prior)
        if kind == "mixed" and step.segments and step.stretch <= CLEAN_MAX_STRETCH:
            # thinned only by loss episodes (a burst in one segment): clean otherwise
            (lost, sent), _ = separate_episodes(
                [(p.packets_sent - p.received, p.packets_sent) for p in step.parts]
            )
            if sent and 1 - lost / sent >= CLEAN_ABOVE * (1 - (prior or 0.0)):
                kind = "clean"
        self.steps.append(step)
        self.kinds.append(kind)
        self.purposes.append(planned.purpose)
        return kind

    def _history(self) -> list[tuple[RateStep, StepKind]]:
        return list(zip(self.steps, self.kinds, strict=True))

    def _pooled_loss(self) -> float | None:
        estimate = self._loss_estimate()
        return None if estimate is None else estimate.fraction

    def _loss_estimate(self) -> LossEstimate | None:
        return self._loss_and_episodes()[0]

    def _loss_and_episodes(self) -> tuple[LossEstimate | None, LossEstimate]:
        parts = [p for s, k in self._history() if k == "clean" for p in s.parts]
        # The segments of a train that was not clean as a whole (the lab, or the path,
        # slowed down during it) still count where they are clean on their own.
        prior = _pooled([(p.packets_sent - p.received, p.packets_sent) for p in parts])
        parts += [
            p
            for s, k in self._history()
            if k != "clean" and len(s.segments) >= 3
            for p in s.segments
            if prior is not None and piece_is_clean(p, prior)
        ]
        kept, dropped = separate_episodes([(p.packets_sent - p.received, p.packets_sent)
                                           for p in parts])  # fmt: skip
        estimate = LossEstimate(*kept) if kept[1] else None
        return estimate, LossEstimate(*dropped)

    def _delivered_bps(self) -> float:
        """The most payload a train below saturation delivered, random loss added back:
        no more than it was sent at (a burst after a stall arrives faster than sent)."""
        keep = 1 - (self._pooled_loss() or 0.0)
        return max(
            (
                min(s.sent_bps, s.received_bps / keep)
                for s, k in self._history()
                if k in ("clean", "mixed")
            ),
            default=0.0,
        )

    def _trusted(self) -> list[RateStep]:
        floor_bps = TRUST_MARGIN * self._delivered_bps()
        random_loss = self._pooled_loss()
        return [
            s
            for s, k in self._history()
            if k == "saturated"
            # a bottleneck cannot pass more than it was sent: a reading above the
            # train's rate is a burst after a stall, not the bottleneck
            and max(floor_bps, 1.0) <= self._capacity_payload_bps([s], random_loss) <= s.sent_bps
        ]

    def _agreeing(self) -> list[RateStep] | None:
        """The last two trusted readings when they agree (a confirmed capacity)."""
        trusted = self._trusted()
        if len(trusted) < 2:
            return None
        random_loss = self._pooled_loss()
        a, b = (self._capacity_payload_bps([s], random_loss) for s in trusted[-2:])
        return trusted[-2:] if abs(a - b) <= AGREEMENT * max(a, b) else None

    def _limit(self) -> Limit:
        if self._trusted():
            return "path"
        carried = [s for s, k in self._history() if k in ("clean", "mixed")]
        if not carried:
            return "none"
        top = max(carried, key=lambda s: s.target_bps)
        if top.sent_bps < SENDER_SHORTFALL * top.target_bps:
            return "sender"
        return "cap" if top.target_bps >= self.cap_bps else "time"

    def _capacity(self) -> float:
        """Payload bits per second: the trusted saturated trains', else what was carried."""
        trusted = self._trusted()
        if trusted:
            readings = self._agreeing() or trusted[-1:]
            return self._capacity_payload_bps(readings, self._pooled_loss())
        return self._delivered_bps()  # what the path demonstrably carried

    @staticmethod
    def _capacity_payload_bps(saturated: list[RateStep], random_loss: float | None) -> float:
        """Payload bits per second through the bottleneck (see the module's note): the
        median over the body's segments of these trains, so that a stall or a burst in
        one segment does not move it; the whole body where it was not segmented."""
        readings = []
        for step in saturated:
            pieces = step.segments if len(step.segments) >= 3 else (step.body,)
            for piece in pieces:
                span_s = (piece.counts.last_ns - piece.counts.first_ns) / 1e9
                if piece.received < 2 or span_s <= 0:
                    continue
                size = piece.counts.received_bytes / piece.counts.packets
                passed = (piece.received - 1) / (1 - (random_loss or 0.0))
                readings.append(passed * size * 8 / span_s)
        return statistics.median(readings) if readings else 0.0

    def summary(self) -> RateSummary:
        estimate, episodes = self._loss_and_episodes()
        random_loss = None if estimate is None else estimate.fraction
        capacity_bps = self._capacity()
        return RateSummary(
            achievable_bps=capacity_bps * self.ip_per_payload,
            goodput_bps=capacity_bps * (1 - (random_loss or 0.0)),
            limit=self._limit(),
            loss=estimate,
            confirmed=self._agreeing() is not None,
            episodes=episodes,
            steps=tuple(self.steps),
            kinds=tuple(self.kinds),
            purposes=tuple(self.purposes),
        )
