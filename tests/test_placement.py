"""Bulk placement: per-path finish times and the water-filling earliest finish time T."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.core.estimator import PathEstimator
from wangate.core.placement import BulkPathView, bulk_view, earliest_finish_s
from wangate.core.states import PathStateKind
from wangate.errors import LocalProtocolError


def path(
    name: str,
    rate_mbps: float,
    delay_ms: float,
    backlog_bytes: int = 0,
    state: PathStateKind = "up",
) -> BulkPathView:
    return BulkPathView(name, state, rate_mbps * 1e6, delay_ms / 1000, queued_bytes=backlog_bytes)


def test_finish_time_is_backlog_and_size_over_rate_plus_delay() -> None:
    p = BulkPathView("p", "up", 8e6, 0.03, queued_bytes=600_000, inflight_bytes=400_000)
    assert p.backlog_bytes == 1_000_000
    assert p.start_s == pytest.approx(1.0 + 0.03)
    assert p.finish_s(1_000_000) == pytest.approx(2.0 + 0.03)


def test_both_paths_finish_together_at_the_earliest_time() -> None:
    a = path("a", 100, 10)
    b = path("b", 50, 10)
    # T = (15 MB * 8 + 0.01 * 100e6 + 0.01 * 50e6) / 150e6 = 121.5e6 / 150e6 = 0.81 s
    finish_s = earliest_finish_s([a, b], 15_000_000)
    assert finish_s == pytest.approx(0.81, rel=1e-12)
    # by T, a delivers (0.81 - 0.01) * 100e6 / 8 = 10 MB and b 5 MB: 15 MB, both done at T
    assert a.finish_s(10_000_000) == pytest.approx(finish_s, rel=1e-12)
    assert b.finish_s(5_000_000) == pytest.approx(finish_s, rel=1e-12)
    # the order the paths are listed in does not matter
    assert earliest_finish_s([b, a], 15_000_000) == finish_s


def test_backlog_delays_a_path_start() -> None:
    a = path("a", 100, 10, backlog_bytes=5_000_000)  # starts at 5 MB * 8 / 100e6 + 0.01 = 0.41 s
    b = path("b", 100, 10)  # starts at 0.01 s
    # T = (10 MB * 8 + 0.41 * 100e6 + 0.01 * 100e6) / 200e6 = 122e6 / 200e6 = 0.61 s
    finish_s = earliest_finish_s([a, b], 10_000_000)
    assert finish_s == pytest.approx(0.61, rel=1e-12)
    # a delivers (0.61 - 0.41) * 100e6 / 8 = 2.5 MB, b (0.61 - 0.01) * 100e6 / 8 = 7.5 MB
    assert a.finish_s(2_500_000) == pytest.approx(finish_s, rel=1e-12)
    assert b.finish_s(7_500_000) == pytest.approx(finish_s, rel=1e-12)
    # with 20 MB queued a starts at 1.61 s, after b alone is done: 10 MB * 8 / 100e6 + 0.01
    buried = path("a", 100, 10, backlog_bytes=20_000_000)
    assert earliest_finish_s([buried, b], 10_000_000) == pytest.approx(0.81, rel=1e-12)


def test_a_path_that_cannot_start_before_t_takes_nothing() -> None:
    fast = path("fast", 100, 10)
    slow = path("slow", 10, 50)  # starts delivering at 0.05 s
    # fast alone: 100 kB * 8 / 100e6 + 0.01 = 0.018 s, before slow even starts
    assert earliest_finish_s([slow, fast], 100_000) == pytest.approx(0.018, rel=1e-12)
    # 500 kB: fast alone ends exactly when slow would start (0.04 + 0.01 = 0.05 s)
    assert earliest_finish_s([slow, fast], 500_000) == pytest.approx(0.05, rel=1e-12)
    # 1 MB: fast alone would end at 0.09 s, after 0.05 s, so slow joins:
    # T = (8e6 + 0.01 * 100e6 + 0.05 * 10e6) / 110e6 = 9.5e6 / 110e6
    assert earliest_finish_s([slow, fast], 1_000_000) == pytest.approx(9.5 / 110, rel=1e-12)


def test_down_paths_are_ignored() -> None:
    a = path("a", 100, 10)
    down = path("down", 1000, 1, state="down")
    # a alone: 10 kB * 8 / 100e6 + 0.01 = 0.0108 s (with the down path it would be sooner)
    assert earliest_finish_s([a, down], 10_000) == pytest.approx(0.0108, rel=1e-12)
    assert earliest_finish_s([down], 10_000) == math.inf
    assert earliest_finish_s([], 10_000) == math.inf
    # a degraded path still carries bulk: T = (80e3 + 0.01 * 200e6) / 200e6 = 0.0104 s
    degraded = path("deg", 100, 10, state="degraded")
    assert earliest_finish_s([a, degraded], 10_000) == pytest.approx(0.0104, rel=1e-12)


def test_nothing_to_send_finishes_when_the_first_path_starts() -> None:
    assert earliest_finish_s([path("a", 100, 20), path("b", 10, 10)], 0) == 0.010


def test_bulk_view_reads_the_estimator() -> None:
    est = PathEstimator(rate_floor_bps=1e6)
    est.on_heard(0.0)
    est.on_rtt_sample(0.040, 0.0)
    est.on_sent(3000, 0.0)
    bv = bulk_view("p", est, 0.0, queued_bytes=2000)
    assert bv == BulkPathView("p", "up", 1e6, 0.020, queued_bytes=2000, inflight_bytes=3000)
    # the same model as the estimator's own prediction
    assert bv.finish_s(1200) == pytest.approx(est.expected_delivery_s(1200, 2000, 0.0))


def test_misuse_is_a_local_error() -> None:
    fast = path("fast", 100, 20)
    with pytest.raises(LocalProtocolError, match="path names are not unique"):
        earliest_finish_s([fast, fast], 1000)
    with pytest.raises(LocalProtocolError, match="total_bytes -1 < 0"):
        earliest_finish_s([fast], -1)


# ---- invariants ----------------------------------------------------------------------------

_STATES: list[PathStateKind] = ["up", "up", "degraded", "down"]
_paths = st.lists(
    st.tuples(
        st.floats(min_value=0.1, max_value=10_000),  # Mbit/s
        st.floats(min_value=0.0, max_value=300),  # one-way delay, ms
        st.integers(min_value=0, max_value=50_000_000),  # backlog bytes
        st.sampled_from(_STATES),
    ),
    min_size=1,
    max_size=5,
).map(lambda rows: [path(f"p{i}", *row) for i, row in enumerate(rows)])


def _delivered_bytes(paths: list[BulkPathView], by_s: float) -> float:
    """What the usable paths deliver by ``by_s``, each at its rate from its start."""
    return sum(max(0.0, (by_s - p.start_s) * p.rate_bps / 8) for p in paths)


@settings(max_examples=300, deadline=None)
@given(_paths, st.integers(min_value=0, max_value=200_000_000))
def test_t_is_the_earliest_time_the_usable_paths_deliver_the_total(
    paths: list[BulkPathView], total_bytes: int
) -> None:
    finish_s = earliest_finish_s(paths, total_bytes)
    usable = [p for p in paths if p.state != "down"]
    if not usable:
        assert finish_s == math.inf
        return
    assert math.isfinite(finish_s)
    # Enough by T: float error grows with T * rate, so the tolerance is relative to it.
    rate_sum_bps = sum(p.rate_bps for p in usable)
    tolerance_bytes = 1e-9 * finish_s * rate_sum_bps / 8
    assert _delivered_bytes(usable, finish_s) == pytest.approx(total_bytes, abs=tolerance_bytes)
    if total_bytes == 0:
        assert finish_s == pytest.approx(min(p.start_s for p in usable), rel=1e-12)
    else:
        # ... and not enough a little before T: T is the smallest such time.
        assert _delivered_bytes(usable, finish_s * (1 - 1e-6)) < total_bytes
    # a split never finishes later than the best single path
    assert finish_s <= min(p.finish_s(total_bytes) for p in usable) * (1 + 1e-9)
