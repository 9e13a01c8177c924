"""A path's capacity estimate under a fake clock: kept across idle time, replaced after
10 s of load at a new rate, app-limited samples counted only when they prove more."""

from __future__ import annotations

import pytest

from tests.fakelink import LinkProfile, SimulatedPair, make_header
from wangate.core.capacity import CapacityFilter
from wangate.core.estimator import PathEstimator
from wangate.errors import LocalProtocolError

STEP_S = 0.05  # one sample per 50 ms, the estimator's shortest interval


def feed(f: CapacityFilter, rate_bps: float, start: float, seconds: float, *, busy: bool) -> float:
    """Samples of ``rate_bps`` every STEP_S from ``start`` for ``seconds``; the end time."""
    n = round(seconds / STEP_S)
    for i in range(n):
        f.on_sample(rate_bps, start + i * STEP_S, app_limited=not busy)
    return start + n * STEP_S


# ---- the filter ------------------------------------------------------------------------


def test_an_idle_minute_keeps_the_estimate() -> None:
    f = CapacityFilter()
    end = feed(f, 40e6, 0.0, 5.0, busy=True)
    assert f.capacity_bps == 40e6
    # 60 s with nothing, then a minute of keep-alive traffic far below the path's rate
    end = feed(f, 0.1e6, end + 60.0, 60.0, busy=False)
    assert f.capacity_bps == 40e6


def test_a_slower_path_is_seen_within_ten_seconds_of_load() -> None:
    f = CapacityFilter(window_busy_s=10.0)
    end = feed(f, 40e6, 0.0, 20.0, busy=True)
    end = feed(f, 10e6, end, 9.9, busy=True)  # 9.9 s of load at the new rate: not yet
    assert f.capacity_bps == 40e6
    feed(f, 10e6, end, 0.2, busy=True)
    assert f.capacity_bps == 10e6


def test_idle_time_between_calls_does_not_age_the_estimate() -> None:
    # one 2 s call a minute: the 40 Mbit/s of the first call holds for 10 s of load
    f = CapacityFilter(window_busy_s=10.0, max_gap_s=0.5)
    end = feed(f, 40e6, 0.0, 2.0, busy=True)
    seen = []
    for _ in range(6):
        end = feed(f, 10e6, end + 58.0, 2.0, busy=True)
        seen.append(f.capacity_bps)
    # per call: 39 gaps of 50 ms, and the minute before it counts as max_gap_s (0.5 s),
    # so the first call's last sample (at 1.95 s of busy time) leaves the window in the
    # fifth call after it
    assert seen == [40e6] * 4 + [10e6] * 2
    assert f.busy_s == pytest.approx(1.95 + 6 * 2.45, abs=1e-9)


def test_app_limited_samples_raise_but_never_lower_it() -> None:
    f = CapacityFilter()
    f.on_sample(5e6, 0.0, app_limited=True)  # proves at least 5 Mbit/s
    assert f.capacity_bps == 5e6
    f.on_sample(2e6, 0.1, app_limited=True)
    assert f.capacity_bps == 5e6
    f.on_sample(30e6, 0.2, app_limited=False)
    f.on_sample(8e6, 0.3, app_limited=True)
    assert f.capacity_bps == 30e6
    # app-limited samples never advance busy time: only busy ones age the estimate
    feed(f, 1e6, 1.0, 100.0, busy=False)
    assert (f.capacity_bps, f.busy_s) == (30e6, 0.0)


def test_a_long_gap_between_busy_samples_counts_as_at_most_max_gap() -> None:
    f = CapacityFilter(window_busy_s=1.0, max_gap_s=0.5)
    f.on_sample(9e6, 0.0, app_limited=False)
    f.on_sample(3e6, 100.0, app_limited=False)  # a long pause, then busy again
    assert (f.busy_s, f.capacity_bps) == (0.5, 9e6)
    f.on_sample(3e6, 100.5, app_limited=False)
    f.on_sample(3e6, 100.6, app_limited=False)
    assert f.busy_s == pytest.approx(1.1)
    assert f.capacity_bps == 3e6


def test_bad_arguments_are_local_errors() -> None:
    with pytest.raises(LocalProtocolError, match="window_busy_s"):
        CapacityFilter(window_busy_s=0.0)
    with pytest.raises(LocalProtocolError, match="max_gap_s"):
        CapacityFilter(max_gap_s=-1.0)
    with pytest.raises(LocalProtocolError, match="rate sample"):
        CapacityFilter().on_sample(float("nan"), 0.0, app_limited=False)


# ---- the estimator's app-limited rule ----------------------------------------------------


def run_dry_then_trickle(*, dry_each_time: bool) -> PathEstimator:
    """8 Mbit/s busy for 2 s; the sender runs dry with 10 kB in flight; then 1 Mbit/s for
    15 s, the sender saying it had nothing more at every send or never again."""
    est = PathEstimator()
    est.on_rtt_sample(0.02, 0.0)
    now = 0.0
    for i in range(1, 2001):  # 1000 B sent and acked every ms
        now = i / 1000
        est.on_sent(1000, now)
        est.on_acked(1000, now)
    assert est.capacity_bps == pytest.approx(8e6, rel=0.01)
    est.on_sent(10_000, now)
    est.on_app_limited(now)
    for i in range(1, 15_001):  # 125 B every ms
        at = now + i / 1000
        if dry_each_time:
            est.on_app_limited(at)
        est.on_sent(125, at)
        est.on_acked(125, at)
    return est


def test_estimator_capacity_ignores_samples_while_the_sender_has_nothing_to_send() -> None:
    est = run_dry_then_trickle(dry_each_time=True)
    assert est.delivery_rate_bps == pytest.approx(1e6, rel=0.01)  # its 10 s window
    assert est.capacity_bps == pytest.approx(8e6, rel=0.01)


def test_estimator_capacity_follows_a_busy_slower_rate_after_ten_seconds() -> None:
    # the same acks, but the sender kept the path busy once the 10 kB were acknowledged
    est = run_dry_then_trickle(dry_each_time=False)
    assert est.capacity_bps == pytest.approx(1e6, rel=0.01)


def stalled_ack_processing(*, with_send_times: bool) -> PathEstimator:
    """1000 B sent every ms (8 Mbit/s), acked 20 ms later; the sender's process is
    starved from 1.2 to 1.5 s and then handles the acks that waited, one per us."""
    est = PathEstimator()
    est.on_rtt_sample(0.02, 0.0)
    est.on_app_limited(0.0)
    est.on_sent(1, 0.0)
    est.on_acked(1, 0.0)  # busy from here on (+ one srtt)
    for i in range(1, 3001):
        sent_at = i / 1000
        acked_at = sent_at + 0.02
        if 1.2 <= acked_at < 1.5:
            acked_at = 1.5 + (acked_at - 1.2) / 1000
        est.on_sent(1000, sent_at)
        est.on_acked(1000, acked_at, sent_at=sent_at if with_send_times else None)
    return est


def test_a_batch_of_late_acks_does_not_read_above_the_send_rate() -> None:
    # ack intervals alone: the sample that starts at the batch's first ack counts the
    # batch's 300 ms of bytes within its 0.5 s (the lab read 5.5-7.1 on 5 Mbit/s links)
    assert stalled_ack_processing(with_send_times=False).capacity_bps == pytest.approx(12.8e6)
    # the send interval bounds it: what was sent over 0.8 s is not delivered in 0.5 s
    assert stalled_ack_processing(with_send_times=True).capacity_bps == pytest.approx(8e6, rel=0.01)


# ---- a session over a fake link ----------------------------------------------------------


def capacity_mbps(pair: SimulatedPair) -> float:
    value = pair.sessions["bj"].path_snapshot("a", pair.now)["capacity_mbps"]
    assert isinstance(value, float)
    return value


def test_session_capacity_survives_idle_and_follows_a_slower_link() -> None:
    profile = LinkProfile(delay_s=0.02, rate_bps=20e6)
    pair = SimulatedPair({"a": profile}, seed=4)
    body = bytes(2 << 20)
    sent = pair.submit("bj", make_header("g", body), body)
    assert pair.run_until(lambda: sent in pair.received["sh"], max_time_s=5)
    busy = capacity_mbps(pair)
    # the payload share of 1200-byte datagrams at 20 Mbit/s on the wire
    assert 17.0 < busy < 20.0
    pair.run_for(60.0)  # a minute idle: keep-alive probes only
    snap = pair.sessions["bj"].path_snapshot("a", pair.now)
    assert snap["capacity_mbps"] == busy
    assert snap["rate_mbps"] == 0.0  # what the 10 s delivery-rate window shows now
    # the link drops to 5 Mbit/s (both directions): 4 s of load is not enough to forget
    slow = LinkProfile(delay_s=0.02, rate_bps=5e6)
    for link in pair.paths["a"].links.values():
        link.profile = slow
    sent = pair.submit("bj", make_header("g", body, step=1), body)
    assert pair.run_until(lambda: sent in pair.received["sh"], max_time_s=5)
    assert capacity_mbps(pair) == busy
    # ... 10 s of it is: three more such messages, back to back
    ids = [pair.submit("bj", make_header("g", body, step=s), body) for s in (2, 3, 4)]
    assert pair.run_until(lambda: all(i in pair.received["sh"] for i in ids), max_time_s=15)
    assert 4.0 < capacity_mbps(pair) < 5.0
