"""The rate phase of a probe, without I/O: which trains to send, and the capacity and
random loss they show (one train's measures: ``trains.py``).

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

import statistics
from dataclasses import dataclass
from typing import Literal

from wangate.probe.loss import NO_LOSS, LossEstimate
from wangate.probe.trains import (
    CLEAN_ABOVE,
    CLEAN_MAX_STRETCH,
    SENDER_SHORTFALL,
    RateStep,
    StepKind,
    classify,
    piece_is_clean,
    pooled_loss,
    separate_episodes,
)

MAX_RAMP_STEPS = 5  # doubling: the first train runs at 1/16 of the cap
RAMP_STEP_S = 0.3  # at most; 6 % of the phase, at least MIN_RAMP_STEP_S
MIN_RAMP_STEP_S = 0.15
CONFIRM_STEP_S = 0.5
CONFIRM_SEGMENTS = 4  # its reading: the median of its body's segments
MIN_CLEAN_STEP_S = 0.5
CONFIRM_OVERDRIVE = 1.2
CLEAN_FRACTION = 0.85  # of the capacity: the long train that measures loss
AGREEMENT = 0.1  # two readings within 10 % of each other confirm the capacity
SEGMENT_S = 0.25  # the long clean train is counted in pieces this long...
MAX_SEGMENTS = 40  # ...at most this many (tests the responder keeps: 256)
TRUST_MARGIN = 0.97  # a saturated reading below 97 % of a clean train's delivery is wrong

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
        prior = pooled_loss([(p.packets_sent - p.received, p.packets_sent) for p in parts])
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
