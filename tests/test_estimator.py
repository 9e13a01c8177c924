"""PathEstimator against synthetic traces whose answers are known in advance."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.core.estimator import PathEstimator, PathState
from wangate.errors import LocalProtocolError


def _feed_rtts(est: PathEstimator, rtts_s: list[float], start_s: float, step_s: float) -> float:
    now = start_s
    for rtt_s in rtts_s:
        est.on_rtt_sample(rtt_s, now)
        now += step_s
    return now


# ---- RTT -----------------------------------------------------------------------------------


def test_before_any_sample_rtt_is_the_initial_guess() -> None:
    est = PathEstimator(initial_rtt_s=0.25)
    assert est.rtt_samples == 0
    assert (est.srtt_s, est.rttvar_s) == (0.25, 0.125)  # RFC 9002 §6.2.2
    assert (est.min_rtt_s, est.rtt_p99_s, est.latest_rtt_s) == (0.25, 0.25, 0.25)


def test_constant_rtt_gives_exact_srtt_and_decaying_rttvar() -> None:
    est = PathEstimator()
    _feed_rtts(est, [0.040] * 200, start_s=0.0, step_s=0.01)
    assert est.srtt_s == 0.040
    assert est.min_rtt_s == 0.040
    assert est.rtt_p99_s == 0.040
    assert est.latest_rtt_s == 0.040
    # first sample: rttvar = rtt/2; then each identical sample keeps 3/4 of it
    assert est.rttvar_s == pytest.approx(0.020 * 0.75**199, rel=1e-12)


def test_first_samples_follow_rfc9002_by_hand() -> None:
    est = PathEstimator()
    est.on_rtt_sample(0.100, 0.0)
    assert (est.srtt_s, est.rttvar_s) == (0.100, 0.050)
    est.on_rtt_sample(0.060, 0.1)
    # rttvar = 3/4 * 0.050 + 1/4 * |0.100 - 0.060| = 0.0475; srtt = 7/8 * 0.1 + 1/8 * 0.06
    assert est.rttvar_s == pytest.approx(0.0475, rel=1e-12)
    assert est.srtt_s == pytest.approx(0.095, rel=1e-12)
    assert est.min_rtt_s == 0.060
    assert est.latest_rtt_s == 0.060


def test_step_change_converges_geometrically_and_min_follows_after_the_window() -> None:
    est = PathEstimator(window_s=10.0)
    now = _feed_rtts(est, [0.040] * 100, start_s=0.0, step_s=0.01)  # last at t=0.99
    rttvar_before = est.rttvar_s
    est.on_rtt_sample(0.120, now)
    assert est.rttvar_s == pytest.approx(0.75 * rttvar_before + 0.25 * 0.080, rel=1e-12)
    _feed_rtts(est, [0.120] * 19, start_s=now + 0.01, step_s=0.01)
    # srtt after k samples of the new value: 0.120 - 0.080 * (7/8)**k
    assert est.srtt_s == pytest.approx(0.120 - 0.080 * (7 / 8) ** 20, rel=1e-12)
    assert est.min_rtt_s == 0.040  # the old minimum is still inside the 10 s window
    est.on_rtt_sample(0.120, 10.98)
    assert est.min_rtt_s == 0.040  # 0.99 is 9.99 s before 10.98: still in the window
    est.on_rtt_sample(0.120, 11.0)
    assert est.min_rtt_s == 0.120  # 0.99 is now 10.01 s old


def test_ack_delay_is_subtracted_only_when_it_keeps_rtt_above_min() -> None:
    est = PathEstimator()
    est.on_rtt_sample(0.040, 0.0)
    est.on_rtt_sample(0.050, 0.1, ack_delay_s=0.005)  # 0.050 >= 0.040 + 0.005: use 0.045
    assert est.srtt_s == pytest.approx(0.040 + (0.045 - 0.040) / 8, rel=1e-12)
    assert est.latest_rtt_s == 0.050
    srtt_s = est.srtt_s
    est.on_rtt_sample(0.042, 0.2, ack_delay_s=0.005)  # 0.042 < 0.045: not adjusted
    assert est.srtt_s == pytest.approx(srtt_s + (0.042 - srtt_s) / 8, rel=1e-12)


def test_rtt_p99_is_the_nearest_rank_percentile_over_the_window() -> None:
    est = PathEstimator(window_s=10.0)
    order = [(i * 37) % 200 + 1 for i in range(200)]  # 1..200 ms, shuffled
    assert sorted(order) == list(range(1, 201))
    _feed_rtts(est, [ms / 1000 for ms in order], start_s=0.0, step_s=0.001)
    assert est.rtt_p99_s == 0.198  # rank ceil(0.99 * 200) = 198
    # 12 s later, one new sample: everything older than 10 s leaves the window
    est.on_rtt_sample(0.030, 12.0)
    assert est.rtt_p99_s == 0.030
    assert est.min_rtt_s == 0.030


# ---- jitter --------------------------------------------------------------------------------


def test_jitter_of_alternating_transit_follows_rfc3550_by_hand() -> None:
    est = PathEstimator()
    offset_s = 1234.5  # clocks are not synchronised: only differences may matter
    transits = [offset_s + (0.010 if i % 2 == 0 else 0.012) for i in range(400)]
    est.on_transit_sample(transits[0], 0.0)
    assert est.jitter_s == 0.0  # one sample has no difference yet
    est.on_transit_sample(transits[1], 0.01)
    d_s = transits[1] - transits[0]  # 2 ms, as the clock offset cancels
    assert d_s == pytest.approx(0.002, abs=1e-12)
    assert est.jitter_s == pytest.approx(d_s / 16, rel=1e-12)  # 0.125 ms
    est.on_transit_sample(transits[2], 0.02)
    assert est.jitter_s == pytest.approx(d_s / 16 + (d_s - d_s / 16) / 16, rel=1e-9)
    for i, transit_s in enumerate(transits[3:], start=3):
        est.on_transit_sample(transit_s, i * 0.01)
    # J_n = |D| * (1 - (15/16)**n) after n differences; 399 differences: 2 ms to 1e-11
    assert est.jitter_s == pytest.approx(0.002 * (1 - (15 / 16) ** 399), rel=1e-9)
    assert est.jitter_s == pytest.approx(0.002, rel=1e-8)


def test_constant_transit_has_no_jitter_whatever_the_offset() -> None:
    est = PathEstimator()
    for i in range(50):
        est.on_transit_sample(-7.25, i * 0.01)
    assert est.jitter_s == 0.0


# ---- loss ----------------------------------------------------------------------------------


def test_loss_10_of_1000_is_one_percent_and_slides_out() -> None:
    est = PathEstimator(loss_window_packets=1000)
    assert (est.loss_rate, est.loss_samples) == (0.0, 0)
    for i in range(1000):
        est.on_sent(100, i * 0.001)
        if i % 100 == 50:
            est.on_lost(100, i * 0.001)
        else:
            est.on_acked(100, i * 0.001)
    assert est.loss_rate == 0.01
    assert est.loss_samples == 1000
    assert (est.lost_bytes, est.acked_bytes, est.sent_bytes) == (1000, 99_000, 100_000)
    assert est.bytes_in_flight == 0
    for i in range(1000, 1951):  # past the last loss (index 950) in the window
        est.on_acked(0, i * 0.001)
    assert est.loss_rate == 0.0
    assert est.loss_samples == 1000


def test_loss_window_counts_only_its_last_outcomes() -> None:
    est = PathEstimator(loss_window_packets=10)
    for _ in range(10):
        est.on_lost(1, 0.0)
    assert est.loss_rate == 1.0
    for _ in range(7):
        est.on_acked(1, 0.0)
    assert est.loss_rate == pytest.approx(0.3)
    assert est.consecutive_losses == 0


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 40),
    steps=st.lists(st.tuples(st.booleans(), st.integers(1, 90)), max_size=30),
)
def test_an_ack_of_many_datagrams_counts_as_that_many_acks_of_one(
    window: int, steps: list[tuple[bool, int]]
) -> None:
    # random and burst losses, then acks of many datagrams at once against one at a time
    one, many = (PathEstimator(loss_window_packets=window) for _ in range(2))
    for lost, count in steps:
        for est in (one, many):
            if lost:
                for _ in range(count % 9):
                    est.on_lost(1, 0.0)
        if not lost:
            for _ in range(count):
                one.on_acked(1, 0.0)
            many.on_acked(count, 0.0, datagrams=count)
        assert list(many._outcomes) == list(one._outcomes)
        assert (many.loss_rate, many.random_loss_rate, many.loss_samples) == (
            one.loss_rate,
            one.random_loss_rate,
            one.loss_samples,
        )


# ---- delivery rate -------------------------------------------------------------------------


def test_one_megabyte_acked_evenly_over_one_second_is_8_mbps() -> None:
    est = PathEstimator()
    for _ in range(1000):
        est.on_sent(1000, 0.0)
    assert est.bytes_in_flight == 1_000_000
    for i in range(1, 1001):
        est.on_acked(1000, i / 1000)
    assert est.delivery_rate_bps == pytest.approx(8e6, rel=0.01)
    assert est.bytes_in_flight == 0
    assert est.snapshot(1.0)["rate_mbps"] == pytest.approx(8.0, rel=0.01)


def test_delivery_rate_keeps_the_busy_rate_while_idle_then_forgets() -> None:
    est = PathEstimator(rate_window_s=10.0)
    for i in range(1, 1001):
        est.on_acked(1000, i / 1000)
    busy_bps = est.delivery_rate_bps
    est.on_acked(100, 5.0)  # a lone probe ack while idle: a tiny sample
    assert est.delivery_rate_bps == busy_bps
    est.on_acked(100, 11.5)  # every busy sample is now older than 10 s
    # left: the probe samples, 100 B over 4 s (at t=5) and 100 B over 6.5 s (at t=11.5)
    assert est.delivery_rate_bps == pytest.approx(100 * 8 / 4.0, rel=1e-9)
    est.on_acked(100, 15.01)  # the t=5 sample leaves; the new one, 100 B over 3.51 s, tops
    assert est.delivery_rate_bps == pytest.approx(100 * 8 / 3.51, rel=1e-9)


def test_a_clump_of_acks_does_not_fake_a_high_rate() -> None:
    est = PathEstimator(rate_min_interval_s=0.05)
    est.on_rtt_sample(0.040, 0.0)  # srtt 40 ms: the sample interval is max(40, 50) ms
    est.on_acked(1000, 0.0)
    for _ in range(100):
        est.on_acked(1000, 0.01)  # 100 kB within 10 ms: too short to be a sample
    assert est.delivery_rate_bps == 0.0
    est.on_acked(1000, 0.06)
    assert est.delivery_rate_bps == pytest.approx(101_000 * 8 / 0.06, rel=1e-12)


# ---- state ---------------------------------------------------------------------------------


def test_never_heard_is_down() -> None:
    assert PathEstimator().state(0.0) == PathState("down", "never heard from peer")


def test_silence_on_a_short_path_is_down_after_the_half_second_floor() -> None:
    est = PathEstimator()
    _feed_rtts(est, [0.040] * 50, start_s=0.0, step_s=0.01)  # rttvar decays to ~0
    est.on_heard(1.0)
    # max(3 * 40 ms + 4 * rttvar, 0.5 s) = 0.5 s
    assert est.silence_timeout_s() == 0.5
    assert est.state(1.49) == PathState("up", "ok")
    assert est.state(1.5) == PathState("up", "ok")
    assert est.state(1.51) == PathState("down", "silent for 0.51 s")
    est.on_heard(1.6)
    assert est.state(1.6).kind == "up"


def test_silence_on_a_long_path_is_down_after_a_few_rtts() -> None:
    est = PathEstimator()
    _feed_rtts(est, [0.300] * 20, start_s=0.0, step_s=0.1)
    timeout_s = 3 * 0.300 + 4 * est.rttvar_s
    assert est.silence_timeout_s() == pytest.approx(timeout_s, rel=1e-12)
    assert 0.9 < timeout_s < 0.91
    est.on_heard(10.0)
    assert est.state(10.0 + timeout_s - 0.001).kind == "up"
    assert est.state(10.0 + timeout_s + 0.001).kind == "down"


def test_srtt_three_times_min_is_degraded_with_a_readable_reason() -> None:
    est = PathEstimator()
    est.on_heard(0.0)
    _feed_rtts(est, [0.040] * 10, start_s=0.0, step_s=0.01)
    now = _feed_rtts(est, [0.400] * 2, start_s=0.1, step_s=0.01)
    # srtt = 0.4 - 0.36 * (7/8)**2 = 124.375 ms > 120 ms
    assert est.srtt_s == pytest.approx(0.124375, rel=1e-9)
    est.on_heard(now)
    assert est.state(now) == PathState("degraded", "srtt 124 ms > 3x min 40 ms")


def test_a_busy_host_on_a_loopback_path_is_not_degradation() -> None:
    # `wangate demo` on a loaded machine: min 0.6 ms, srtt 9..17 ms (the hosts' scheduling)
    est = PathEstimator()
    est.on_heard(0.0)
    now = _feed_rtts(est, [0.0006] * 5 + [0.017] * 40, start_s=0.0, step_s=0.01)
    assert est.srtt_s == pytest.approx(0.017, rel=0.01) and est.min_rtt_s == 0.0006
    est.on_heard(now)
    assert est.state(now) == PathState("up", "ok")


def test_a_short_path_is_degraded_past_three_times_the_floor() -> None:
    est = PathEstimator()
    est.on_heard(0.0)
    now = _feed_rtts(est, [0.0006] * 5 + [0.0305] * 60, start_s=0.0, step_s=0.01)
    assert 0.030 < est.srtt_s < 0.0305
    est.on_heard(now)
    assert est.state(now) == PathState("degraded", "srtt 30 ms > 3x the 10 ms floor (min 0.6 ms)")
    # a path whose minimum is above the floor is judged by its own minimum
    long_path = PathEstimator(rtt_degraded_floor_s=0.001)
    long_path.on_heard(0.0)
    now = _feed_rtts(long_path, [0.002] * 5 + [0.007] * 60, start_s=0.0, step_s=0.01)
    long_path.on_heard(now)
    assert long_path.state(now) == PathState("degraded", "srtt 7 ms > 3x min 2 ms")


def test_rtt_noise_on_a_very_short_path_is_not_degradation() -> None:
    est = PathEstimator()
    est.on_heard(0.0)
    _feed_rtts(est, [0.0001, 0.002, 0.002, 0.002], start_s=0.0, step_s=0.001)
    assert est.srtt_s > 3 * est.min_rtt_s  # 20x min, but only ~1 ms above it
    assert est.state(0.01) == PathState("up", "ok")


def test_loss_above_five_percent_needs_enough_samples() -> None:
    est = PathEstimator(min_loss_samples=100)
    est.on_heard(0.0)
    for i in range(99):
        if i % 16 == 0:  # 7 losses, never two in a row
            est.on_lost(1, 0.0)
        else:
            est.on_acked(1, 0.0)
    assert est.loss_rate > 0.05
    assert est.state(0.0) == PathState("up", "ok")  # 99 samples: too few to judge
    est.on_acked(1, 0.0)
    assert est.loss_rate == 0.07
    assert est.state(0.0) == PathState("degraded", "loss 7.0% > 5% over 100 datagrams")


def test_a_loss_burst_degrades_at_once_and_an_ack_clears_it() -> None:
    est = PathEstimator(burst_losses=4)
    est.on_heard(0.0)
    for _ in range(3):
        est.on_lost(1, 0.0)
    assert est.state(0.0).kind == "up"
    est.on_lost(1, 0.0)
    assert est.state(0.0) == PathState("degraded", "loss burst: 4 in a row")
    est.on_acked(1, 0.0)
    assert est.state(0.0) == PathState("up", "ok")


# ---- expected delivery and snapshot --------------------------------------------------------


def test_expected_delivery_is_backlog_over_rate_plus_half_srtt() -> None:
    est = PathEstimator()
    _feed_rtts(est, [0.040] * 5, start_s=0.0, step_s=0.01)
    for i in range(1, 1001):
        est.on_acked(1000, i / 1000)
    rate_bps = est.delivery_rate_bps
    est.on_sent(30_000, 1.0)
    expected_s = (20_000 + 30_000 + 1_200) * 8 / rate_bps + 0.040 / 2
    assert est.expected_delivery_s(1_200, 20_000, 1.0) == pytest.approx(expected_s, rel=1e-12)


def test_without_a_rate_sample_planning_uses_the_floor() -> None:
    est = PathEstimator(rate_floor_bps=2e6)
    assert est.delivery_rate_bps == 0.0
    assert est.planning_rate_bps == 2e6
    assert est.expected_delivery_s(1000, 0, 0.0) == pytest.approx(1000 * 8 / 2e6 + 0.05)


def test_snapshot_has_every_key_in_display_units() -> None:
    est = PathEstimator()
    est.on_heard(0.0)
    _feed_rtts(est, [0.040] * 3, start_s=0.0, step_s=0.01)
    est.on_sent(1500, 0.0)
    est.on_lost(500, 0.0)
    snap = est.snapshot(0.05)
    assert snap == {
        "srtt_ms": 40.0,
        "min_rtt_ms": 40.0,
        "rtt_p99_ms": 40.0,
        "jitter_ms": 0.0,
        "loss": 1.0,
        "loss_samples": 1,
        "rate_mbps": 0.0,
        "capacity_mbps": 0.0,
        "inflight_bytes": 1000,
        "sent_bytes": 1500,
        "acked_bytes": 0,
        "lost_bytes": 500,
        "state": "up",
        "state_reason": "ok",
    }


def test_misuse_is_a_local_error() -> None:
    est = PathEstimator()
    with pytest.raises(LocalProtocolError):
        est.on_sent(-1, 0.0)
    with pytest.raises(LocalProtocolError):
        est.on_rtt_sample(-0.001, 0.0)
    with pytest.raises(LocalProtocolError):
        est.on_rtt_sample(math.nan, 0.0)
    with pytest.raises(LocalProtocolError):
        PathEstimator(loss_window_packets=0)


# ---- invariants ----------------------------------------------------------------------------

_events = st.lists(
    st.tuples(
        st.sampled_from(["sent", "acked", "lost", "rtt", "transit", "heard"]),
        st.integers(min_value=0, max_value=10_000),
        st.floats(min_value=0.0, max_value=2.0),
        st.floats(min_value=0.0, max_value=0.5),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(_events)
def test_measurements_stay_within_their_bounds(
    events: list[tuple[str, int, float, float]],
) -> None:
    est = PathEstimator(loss_window_packets=50, window_s=1.0, rate_window_s=1.0)
    now = 0.0
    inflight = 0
    rtts: list[float] = []
    for kind, size, value, step in events:
        now += step
        if kind == "sent":
            est.on_sent(size, now)
            inflight += size
        elif kind == "acked":
            est.on_acked(size, now)
            inflight = max(0, inflight - size)
        elif kind == "lost":
            est.on_lost(size, now)
            inflight = max(0, inflight - size)
        elif kind == "rtt":
            est.on_rtt_sample(value, now)
            rtts.append(value)
        elif kind == "transit":
            est.on_transit_sample(value, now)
        else:
            est.on_heard(now)
        assert est.bytes_in_flight == inflight
        assert 0.0 <= est.loss_rate <= 1.0
        assert est.loss_samples <= 50
        assert est.delivery_rate_bps >= 0.0
        assert 0.0 <= est.jitter_s <= 2.0
        if rtts:
            assert min(rtts) - 1e-12 <= est.srtt_s <= max(rtts) + 1e-12
            assert est.min_rtt_s <= est.rtt_p99_s <= max(rtts)
        assert est.state(now).kind in ("up", "degraded", "down")
        assert math.isfinite(est.expected_delivery_s(1200, 0, now))


def test_random_loss_rate_leaves_out_runs_of_three_or_more() -> None:
    est = PathEstimator()
    outcomes = "a" * 10 + "l" + "a" + "ll" + "a" + "lllll" + "a"  # runs of 1, 2 and 5
    for i, outcome in enumerate(outcomes):
        (est.on_acked if outcome == "a" else est.on_lost)(1000, 1.0 + i * 0.001)
    assert est.loss_samples == 21
    assert est.loss_rate == 8 / 21
    assert est.random_loss_rate == 3 / 21  # the run of 5 is a burst
    est.on_spurious_loss(1000, 2.0)  # the newest loss, one of the burst, was late
    assert (est.loss_rate, est.random_loss_rate) == (7 / 21, 3 / 21)
    est.forget_losses()
    assert (est.loss_rate, est.random_loss_rate) == (0.0, 0.0)


def test_random_loss_rate_forgets_bursts_that_leave_the_window() -> None:
    est = PathEstimator(loss_window_packets=6)
    for i in range(4):
        est.on_lost(1000, 1.0 + i * 0.001)
    est.on_acked(1000, 1.1)
    est.on_lost(1000, 1.2)  # a new run of one: random
    assert (est.loss_rate, est.random_loss_rate) == (5 / 6, 1 / 6)
    for i in range(4):
        est.on_acked(1000, 1.3 + i * 0.001)  # the burst leaves the window
    assert (est.loss_rate, est.random_loss_rate) == (1 / 6, 1 / 6)
