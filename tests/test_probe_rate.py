"""The probe's rate phase and loss verdict, pure: a deterministic fake bottleneck.

``FakePath`` is the lab emulator's model reduced to arithmetic: a FIFO bottleneck of
``rate_bps`` IP bits with a tail-drop queue, then every ``loss_every``-th packet lost
after it (random loss spends its share of the rate, as on a real lossy link), then a
fixed delay. No randomness, so every count below is exact.
"""

from __future__ import annotations

import math

import pytest

from wangate.probe.analysis import LatencySummary, judge
from wangate.probe.loss import LossEstimate, round_trip, wilson_interval
from wangate.probe.packets import NO_COUNTS, RateCounts
from wangate.probe.rate import PlannedStep, RateSearch, RateSummary, rate_plan
from wangate.probe.trains import (
    HEAD_FRACTION,
    RateStep,
    TrainPart,
    classify,
    join,
    piece_is_clean,
    separate_episodes,
)

PAYLOAD = 1200
HEADER = 28
IP_BYTES = PAYLOAD + HEADER


class FakePath:
    def __init__(
        self,
        rate_bps: float,
        *,
        loss_every: int = 0,
        queue_s: float = 0.05,
        delay_s: float = 0.012,
        send_cap_bps: float = math.inf,
        stall: dict[int, float] | None = None,
        burst: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        self.rate_bps = rate_bps
        self.loss_every = loss_every
        self.queue_bytes = max(3000.0, queue_s * rate_bps / 8)
        self.delay_s = delay_s
        self.send_cap_bps = send_cap_bps  # this host cannot send faster
        self.now_s = 100.0
        self.pushed = 0  # packets through the bottleneck, for the loss pattern
        self.stall = stall or {}  # train number (from 1): its last arrival comes late by
        self.burst = burst or {}  # train number: (first packet, count) lost in a run
        self.trains = 0

    def train(self, plan: PlannedStep) -> RateStep:
        self.trains += 1
        send_bps = min(plan.target_bps, self.send_cap_bps)
        gap_s = PAYLOAD * 8 / send_bps
        count = math.floor(plan.duration_s / gap_s)
        head_count = math.ceil(count * HEAD_FRACTION)
        burst_first, burst_count = self.burst.get(self.trains, (-1, 0))
        busy_until = -math.inf
        parts: list[list[tuple[float, float]]] = [[], []]  # (send, arrival or nan)
        for i in range(count):
            sent_s = self.now_s + i * gap_s
            backlog_bytes = max(0.0, busy_until - sent_s) * self.rate_bps / 8
            arrival = math.nan
            if backlog_bytes + IP_BYTES <= self.queue_bytes:
                busy_until = max(busy_until, sent_s) + IP_BYTES * 8 / self.rate_bps
                self.pushed += 1
                random_loss = self.loss_every and self.pushed % self.loss_every == 0
                if not random_loss and not 0 <= i - burst_first < burst_count:
                    arrival = busy_until + self.delay_s
            parts[0 if i < head_count else 1].append((sent_s, arrival))
        if self.trains in self.stall:  # a host on the way stalled
            sent_s, arrival = parts[1][-1]
            parts[1][-1] = (sent_s, arrival + self.stall[self.trains])
        self.now_s += plan.duration_s + 1.0
        head = self._part(parts[0])
        if plan.segments == 1:
            return RateStep(plan.target_bps, head, self._part(parts[1]))
        size = math.ceil(len(parts[1]) / plan.segments)
        segments = [self._part(parts[1][i : i + size]) for i in range(0, len(parts[1]), size)]
        return RateStep(plan.target_bps, head, join(segments), tuple(segments))

    @staticmethod
    def _part(packets: list[tuple[float, float]]) -> TrainPart:
        arrivals = [a for _, a in packets if not math.isnan(a)]
        counts = (
            RateCounts(
                len(arrivals),
                len(arrivals) * PAYLOAD,
                round(min(arrivals) * 1e9),
                round(max(arrivals) * 1e9),
                len(packets),
            )
            if arrivals
            else NO_COUNTS
        )
        return TrainPart(
            len(packets),
            len(packets) * PAYLOAD,
            round(packets[0][0] * 1e9),
            round(packets[-1][0] * 1e9),
            counts,
        )


def run_search(
    path: FakePath, cap_bps: float = 100e6, budget_s: float = 5.0, rtt_s: float = 0.024
) -> tuple[RateSummary, list[PlannedStep]]:
    search = RateSearch(cap_bps, budget_s, rtt_s, payload_bytes=PAYLOAD, header_bytes=HEADER)
    plans = []
    while (plan := search.next_step()) is not None:
        plans.append(plan)
        search.record(path.train(plan))
    return search.summary(), plans


# ---------------------------------------------------------------- intervals


def test_wilson_interval_matches_the_published_values() -> None:
    # Newcombe (1998), table I: 0/10 -> 0-0.2775, 1/10 -> 0.0179-0.4042
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    low, high = wilson_interval(1, 10)
    assert (round(low, 4), round(high, 4)) == (0.0179, 0.4042)
    assert wilson_interval(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="lost 3 of 2"):
        wilson_interval(3, 2)


def test_loss_estimate_says_what_it_is() -> None:
    estimate = LossEstimate(26, 5000)
    assert estimate.fraction == 0.0052
    assert estimate.describe() == "0.52% (95% CI 0.36-0.76%, 5000 packets)"
    assert round_trip(0.01) == pytest.approx(0.0199)


# ----------------------------------------------------------- classification


def part(sent: int, received: int, send_s: tuple[float, float], recv_s: tuple[float, float]
         ) -> TrainPart:  # fmt: skip
    counts = RateCounts(received, received * PAYLOAD, round(recv_s[0] * 1e9),
                        round(recv_s[1] * 1e9), sent)  # fmt: skip
    return TrainPart(sent, sent * PAYLOAD, round(send_s[0] * 1e9), round(send_s[1] * 1e9), counts)


def step(target_mbps: float, sent: int, received: int, recv_span_s: float) -> RateStep:
    """A train of ``sent`` packets over 1 s; arrivals spread over ``recv_span_s``."""
    head_sent, head_received = sent // 4, received // 4
    head = part(head_sent, head_received, (0.0, 0.25), (0.01, 0.01 + recv_span_s / 4))
    body = part(sent - head_sent, received - head_received, (0.25, 1.0),
                (0.01 + recv_span_s / 4, 0.01 + recv_span_s))  # fmt: skip
    return RateStep(target_mbps * 1e6, head, body)


def test_trains_are_clean_saturated_or_mixed() -> None:
    # 1001 packets of 1200 bytes over 1 s: 9.6 Mbit/s sent (bits after the first packet)
    clean = step(9.6, 1001, 996, 1.0)
    assert clean.sent_bps == pytest.approx(9.6e6)
    assert clean.received_bps == pytest.approx(995 * PAYLOAD * 8)
    assert clean.loss == pytest.approx(5 / 1001)
    assert classify(clean, None) == "clean"
    assert classify(clean, 0.005) == "clean"
    # a queue grew: arrivals stretched over 1.25 s
    queued = step(9.6, 1001, 1001, 1.25)
    assert queued.stretch == pytest.approx(1.25)
    assert classify(queued, None) == "saturated"
    assert classify(queued, 0.0) == "saturated"
    # a shallow queue overflowed: thinned to 70 %, not stretched. Before any clean
    # train that is indistinguishable from 30 % random loss; after one it is not.
    thinned = step(9.6, 1001, 701, 1.0)
    assert classify(thinned, None) == "clean"
    assert classify(thinned, 0.005) == "saturated"
    # thinned like its random loss says: clean
    assert classify(thinned, 0.3) == "clean"
    # between the two thresholds: neither a bottleneck reading nor a loss sample
    assert classify(step(9.6, 1001, 931, 1.0), 0.0) == "mixed"
    # this host sent at half the target (it stalled): no bottleneck proven
    assert classify(step(19.2, 1001, 1001, 1.25), 0.0) == "mixed"
    silent = RateStep(10e6, TrainPart(10, 12000, 0, 1, NO_COUNTS, reported=False),
                      TrainPart(10, 12000, 2, 3, NO_COUNTS, reported=False))  # fmt: skip
    assert classify(silent, None) == "silent"


def test_rate_plan_doubles_up_to_the_cap() -> None:
    assert rate_plan(20e6) == [1.25e6, 2.5e6, 5e6, 10e6, 20e6]
    assert rate_plan(100e6) == [6.25e6, 12.5e6, 25e6, 50e6, 100e6]
    assert rate_plan(0.5e6) == [0.5e6]


# ------------------------------------------------------------------ search


def test_the_search_finds_the_bottleneck_and_the_random_loss() -> None:
    # 20 Mbit/s, 0.5 % random loss, 50 ms queue (the lab path, one way)
    summary, plans = run_search(FakePath(20e6, loss_every=200))
    assert [(p.purpose, round(p.target_bps / 1e6, 3)) for p in plans[:3]] == [
        ("ramp", 6.25), ("ramp", 12.5), ("ramp", 25.0),
    ]  # fmt: skip
    assert summary.kinds == ("clean", "clean", "saturated", "saturated", "clean")
    assert [p.purpose for p in plans[3:]] == ["confirm", "clean"]
    # confirm at 1.2 x and the long clean train at 0.85 x the payload capacity
    payload_capacity = 20e6 * PAYLOAD / IP_BYTES
    assert plans[3].target_bps == pytest.approx(1.2 * payload_capacity, rel=0.005)
    assert plans[4].target_bps == pytest.approx(0.85 * payload_capacity, rel=0.005)
    # the plan spends the budget: 3 ramp trains of 0.3 s, confirm 0.5 s, each with
    # settle (rtt + 50 ms) and a query round trip; the clean train gets the rest
    overhead = 0.024 + 0.05 + 0.024
    assert plans[4].duration_s == pytest.approx(5.0 - 3 * (0.3 + overhead) - (0.5 + overhead)
                                                - overhead)  # fmt: skip
    assert summary.limit == "path" and not summary.capped and summary.confirmed
    assert summary.achievable_bps == pytest.approx(20e6, rel=0.005)
    assert summary.goodput_bps == pytest.approx(payload_capacity * 0.995, rel=0.005)
    assert summary.loss is not None
    assert summary.loss.sent > 5000
    assert summary.loss.fraction == pytest.approx(0.005, abs=0.0003)
    low, high = summary.loss.interval
    assert low < 0.005 < high < 0.01


def test_queue_overflow_is_not_path_loss() -> None:
    # no random loss at all: the saturating trains drop hundreds at the queue
    summary, _ = run_search(FakePath(20e6, queue_s=0.01))
    saturated = [s for s, k in zip(summary.steps, summary.kinds, strict=True)
                 if k == "saturated"]  # fmt: skip
    assert saturated and all(s.loss > 0.1 for s in saturated)
    assert summary.loss is not None and summary.loss.lost == 0
    assert summary.achievable_bps == pytest.approx(20e6, rel=0.005)


def test_a_shallow_queue_is_read_by_thinning() -> None:
    # a 3000-byte queue: trains above the rate are not stretched, only thinned
    summary, _ = run_search(FakePath(40e6, loss_every=100, queue_s=0.0))
    assert "saturated" in summary.kinds
    assert summary.achievable_bps == pytest.approx(40e6, rel=0.01)
    assert summary.loss is not None
    assert summary.loss.fraction == pytest.approx(0.01, abs=0.0005)


def test_a_path_faster_than_the_cap_is_reported_as_a_lower_bound() -> None:
    summary, plans = run_search(FakePath(1e9), cap_bps=100e6)
    assert [p.purpose for p in plans] == ["ramp"] * 5 + ["clean"]
    assert summary.limit == "cap" and summary.capped
    assert summary.achievable_bps == pytest.approx(100e6 * IP_BYTES / PAYLOAD, rel=0.001)
    assert plans[-1].target_bps == pytest.approx(0.85 * 100e6, rel=0.001)


def test_a_path_faster_than_this_host_says_so() -> None:
    summary, _ = run_search(FakePath(1e9, send_cap_bps=30e6), cap_bps=100e6)
    assert summary.limit == "sender" and summary.capped
    assert summary.achievable_bps == pytest.approx(30e6 * IP_BYTES / PAYLOAD, rel=0.001)


def test_a_stalled_reading_is_not_trusted() -> None:
    # The 12.5 Mbit/s train of a 20 Mbit/s path arrives 60 ms late at its end (a host
    # stalled): it reads as saturated at about 10 Mbit/s. The confirming train at
    # 1.2 x that is clean and delivers more, so the reading is dropped and the
    # doubling goes on.
    summary, plans = run_search(FakePath(20e6, loss_every=200, stall={2: 0.06}))
    assert summary.kinds[:3] == ("clean", "saturated", "clean")
    assert [p.purpose for p in plans[:3]] == ["ramp", "ramp", "confirm"]
    assert summary.limit == "path"
    assert summary.achievable_bps == pytest.approx(20e6, rel=0.005)


def test_a_low_reading_is_tried_again_and_one_stalled_segment_does_not_count() -> None:
    # The saturating ramp train (25 Mbit/s) arrives 100 ms late at its end: its body
    # reads 14 Mbit/s instead of 19.5 (payload). The confirming
    # train at 1.2 x that comes out clean (below the bottleneck's 19.5) and so drops
    # the low reading; the doubling goes on from there, reads 19.5, and its confirming
    # train agrees although its own last segment stalled too (its reading is the
    # median of its segments).
    summary, plans = run_search(FakePath(20e6, loss_every=200, stall={3: 0.1, 6: 0.1}))
    assert [p.purpose for p in plans] == [
        "ramp", "ramp", "ramp", "confirm", "ramp", "confirm", "clean",
    ]  # fmt: skip
    assert plans[3].target_bps == pytest.approx(1.2 * 13.97e6, rel=0.001)
    assert plans[4].target_bps == pytest.approx(2 * plans[3].target_bps)
    assert summary.kinds == (
        "clean", "clean", "saturated", "clean", "saturated", "saturated", "clean",
    )  # fmt: skip
    assert summary.confirmed
    assert summary.achievable_bps == pytest.approx(20e6, rel=0.005)


def test_heavy_random_loss_is_loss_not_a_slow_path() -> None:
    summary, _ = run_search(FakePath(1e9, loss_every=5), cap_bps=20e6, budget_s=3.0)
    assert "saturated" not in summary.kinds
    assert summary.loss is not None and summary.loss.fraction == pytest.approx(0.2, abs=0.001)
    assert summary.limit == "cap"
    verdict = judge(latency(), summary)
    assert verdict.kind == "unusable"
    assert verdict.text == "unusable: 19.99% (95% CI 18.68-21.37%, 3401 packets) loss"


def test_loss_episodes_are_told_apart_from_random_loss() -> None:
    even = [(5, 1000)] * 9
    assert separate_episodes([*even, (5, 1000)]) == ((50, 10000), (0, 0))
    # 150 in one piece: the others' 0.5 % predicts 5, the limit is
    # 5 + 5 * sqrt(5 * 0.995) + 5 = 21.15
    assert separate_episodes([*even, (150, 1000)]) == ((45, 9000), (150, 1000))
    assert separate_episodes([*even, (21, 1000)]) == ((66, 10000), (0, 0))
    assert separate_episodes([*even, (22, 1000)]) == ((45, 9000), (22, 1000))
    # two episodes, worst first; heavy loss spread evenly is not one; two pieces
    # cannot outvote each other
    assert separate_episodes([*even, (90, 1000), (300, 1000)]) == ((45, 9000), (390, 2000))
    assert separate_episodes([(200, 1000)] * 10) == ((2000, 10000), (0, 0))
    assert separate_episodes([(0, 1000), (500, 1000)]) == ((500, 2000), (0, 0))


@pytest.mark.parametrize("burst", [150, 350])
def test_a_loss_burst_in_the_clean_train_is_not_random_loss(burst: int) -> None:
    # ``burst`` packets in a row lost in the long clean train (train 5): a queue
    # overflowed for a moment. The random 0.5 % stays what it is; the burst is reported
    # apart. 350 of its 5400 thin the train below 95 % delivery (it would be "mixed"),
    # but only in one segment: it still counts as clean.
    summary, plans = run_search(FakePath(20e6, loss_every=200, burst={5: (2000, burst)}))
    assert plans[-1].purpose == "clean" and plans[-1].segments == 12
    assert classify(summary.steps[-1], 0.005) == ("clean" if burst == 150 else "mixed")
    assert summary.kinds[-1] == "clean"
    assert summary.loss is not None
    assert summary.loss.fraction == pytest.approx(0.005, abs=0.0003)
    assert summary.episodes.lost >= burst
    assert summary.episodes.sent < summary.loss.sent / 5


def test_a_reading_above_the_trains_own_rate_is_not_trusted() -> None:
    # After a clean train, a train sent at 9.6 Mbit/s is thinned to 60 % (saturated),
    # but its body arrives in 0.2 s, as if 24 Mbit/s had passed: a burst after a
    # stall. No bottleneck passes more than it is sent, so no confirm follows.
    search = RateSearch(100e6, 5.0, 0.024, payload_bytes=PAYLOAD, header_bytes=HEADER)
    assert search.next_step() is not None
    assert search.record(step(6.25, 651, 651, 1.0)) == "clean"
    assert search.next_step() is not None
    head = part(250, 100, (0.0, 0.25), (0.01, 0.5))
    body = part(751, 500, (0.25, 1.0), (0.6, 0.8))
    burst = RateStep(9.6e6, head, body)
    assert search.record(burst) == "saturated"
    planned = search.next_step()
    assert planned is not None and planned.purpose == "ramp"


def test_clean_segments_of_a_train_that_was_not_clean_still_count() -> None:
    search = RateSearch(100e6, 5.0, 0.024, payload_bytes=PAYLOAD, header_bytes=HEADER)
    assert search.next_step() is not None
    assert search.record(step(6.25, 1001, 996, 1.0)) == "clean"  # 5 of 1001 lost
    assert search.next_step() is not None
    # the path slowed down halfway: three segments arrive as sent, two stretched to
    # 1.5 x and thinned (a queue overflowed); the train as a whole is saturated
    head = part(250, 250, (0.0, 0.25), (0.01, 0.26))
    clean = [part(200, 199, (0.25 + 0.2 * i, 0.4 + 0.2 * i), (0.26 + 0.2 * i, 0.41 + 0.2 * i))
             for i in range(3)]  # fmt: skip
    slow = [part(200, 120, (0.85 + 0.2 * i, 1.0 + 0.2 * i), (1.0 + 0.3 * i, 1.225 + 0.3 * i))
            for i in range(2)]  # fmt: skip
    assert [piece_is_clean(p, 0.005) for p in (*clean, *slow)] == [True] * 3 + [False] * 2
    segments = (*clean, *slow)
    assert search.record(RateStep(9.6e6, head, join(segments), segments)) == "saturated"
    loss = search.summary().loss
    assert loss is not None
    assert (loss.lost, loss.sent) == (5 + 3, 1001 + 600)


def test_the_search_refuses_misuse() -> None:
    search = RateSearch(10e6, 2.0, 0.01, payload_bytes=PAYLOAD, header_bytes=HEADER)
    with pytest.raises(RuntimeError, match="no step was planned"):
        search.record(step(1, 10, 10, 1.0))
    assert search.next_step() is not None
    with pytest.raises(RuntimeError, match="record the last step"):
        search.next_step()


# ----------------------------------------------------------------- verdict


def latency(lost: int = 0, sent: int = 100, min_ms: float = 24.0) -> LatencySummary:
    received = sent - lost
    return LatencySummary(sent, received, lost / sent, min_ms / 1e3, (min_ms + 1) / 1e3,
                          (min_ms + 2) / 1e3, (min_ms + 3) / 1e3, (min_ms + 4) / 1e3,
                          0.001)  # fmt: skip


def rate_with_loss(lost: int, sent: int = 5000) -> RateSummary:
    return RateSummary(20e6, 19.4e6, "path", LossEstimate(lost, sent), (), ())


def test_loss_is_judged_by_its_interval() -> None:
    # 0.52 % of 5000 one way, one of 100 echoes lost: good for critical traffic
    assert judge(latency(lost=1), rate_with_loss(26)).text == "good for critical traffic"
    # 1.2 %: above the threshold but not clearly
    verdict = judge(latency(), rate_with_loss(60))
    assert verdict.text == (
        "bulk only: 1.20% (95% CI 0.93-1.54%, 5000 packets) loss, not clearly below 1.00%"
    )
    # 3.2 %: clearly above
    assert judge(latency(), rate_with_loss(160)).text == (
        "bulk only: 3.20% (95% CI 2.75-3.72%, 5000 packets) loss"
    )
    # 15 %: clearly above 10 %
    assert judge(latency(), rate_with_loss(750)).text == (
        "unusable: 15.00% (95% CI 14.04-16.02%, 5000 packets) loss"
    )


def test_one_packet_does_not_flip_the_verdict_near_half_a_percent() -> None:
    kinds = [judge(latency(), rate_with_loss(lost)).kind for lost in range(0, 101)]
    flips = [lost for lost in range(1, 101) if kinds[lost] != kinds[lost - 1]]
    # one boundary, where the interval's upper end passes 1 % (36 lost: 0.995 %,
    # 37 lost: 1.018 %): at 0.74 % measured, far from the 0.5 % the lab path loses
    assert flips == [37]
    assert kinds[25] == kinds[26] == kinds[24] == "critical"


def test_echoes_decide_only_without_a_rate_phase_and_veto_a_bad_return_path() -> None:
    # no rate phase: 0 of 200 echoes lost vouches for <= 1.99 % round trip; 0 of 100 not
    assert judge(latency(sent=200), None).kind == "critical"
    assert judge(latency(sent=100), None).text == (
        "bulk only: 0.00% (95% CI 0.00-3.70%, 100 packets) round-trip loss, not clearly below 1.99%"
    )
    # with a rate phase, few echoes lost do not count...
    assert judge(latency(lost=3), rate_with_loss(26)).kind == "critical"
    # ...but clearly more than 1.99 % round trip does (the return path)
    assert judge(latency(lost=10), rate_with_loss(26)).text == (
        "bulk only: 10.00% (95% CI 5.52-17.44%, 100 packets) round-trip loss"
    )
    assert judge(latency(lost=40), rate_with_loss(26)).kind == "unusable"
