"""Bulk placement: earliest finish per shard, and capacity-weighted splits of a message."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.core.estimator import PathEstimator, PathStateKind
from wangate.core.placement import (
    BulkPathView,
    bulk_view,
    choose_bulk_path,
    earliest_finish_s,
    plan_shares,
)
from wangate.errors import LocalProtocolError


def path(
    name: str,
    rate_mbps: float,
    delay_ms: float,
    backlog_bytes: int = 0,
    state: PathStateKind = "up",
) -> BulkPathView:
    return BulkPathView(name, state, rate_mbps * 1e6, delay_ms / 1000, queued_bytes=backlog_bytes)


FAST = path("fast", 100, 20)
SLOW = path("slow", 10, 20)


def test_finish_time_is_backlog_and_size_over_rate_plus_delay() -> None:
    p = BulkPathView("p", "up", 8e6, 0.03, queued_bytes=600_000, inflight_bytes=400_000)
    assert p.start_s == pytest.approx(1.0 + 0.03)
    assert p.finish_s(1_000_000) == pytest.approx(2.0 + 0.03)


def test_an_idle_fast_path_takes_the_shard() -> None:
    # fast: 1 MB in 0.08 s + 0.02; slow: 0.8 s + 0.02
    assert choose_bulk_path([SLOW, FAST], 1_000_000) == "fast"


def test_the_slow_path_is_used_only_when_it_finishes_first() -> None:
    # fast with 10 MB queued: (10 + 1) MB * 8 / 100 Mbit/s + 0.02 = 0.90 s; slow: 0.82 s
    busy_fast = path("fast", 100, 20, backlog_bytes=10_000_000)
    assert choose_bulk_path([busy_fast, SLOW], 1_000_000) == "slow"
    # with 9 MB queued the fast path finishes at 0.82 s too: a tie keeps the first listed
    tied = path("fast", 100, 20, backlog_bytes=9_000_000)
    assert tied.finish_s(1_000_000) == pytest.approx(SLOW.finish_s(1_000_000))
    assert (
        choose_bulk_path([path("fast", 100, 20, backlog_bytes=8_000_000), SLOW], 1_000_000)
        == "fast"
    )


def test_a_down_path_is_never_chosen() -> None:
    down = path("down", 10_000, 1, state="down")
    assert choose_bulk_path([down, SLOW], 1000) == "slow"
    assert choose_bulk_path([down], 1000) is None
    assert choose_bulk_path([], 1000) is None
    degraded = path("deg", 100, 20, state="degraded")
    assert choose_bulk_path([degraded, SLOW], 1000) == "deg"  # degraded still carries bulk


def test_shares_split_so_that_both_paths_finish_together() -> None:
    a = path("a", 100, 10)
    b = path("b", 50, 10)
    # T = (15 MB * 8 + 0.01 * 100e6 + 0.01 * 50e6) / 150e6 = 0.81 s
    assert earliest_finish_s([a, b], 15_000_000) == pytest.approx(0.81)
    # a: (0.81 - 0.01) * 100e6 / 8 = 10 MB; b: 5 MB
    assert plan_shares([a, b], 15_000_000) == {"a": 10_000_000, "b": 5_000_000}


def test_shares_account_for_backlog() -> None:
    a = path("a", 100, 10, backlog_bytes=5_000_000)  # starts at 0.41 s
    b = path("b", 100, 10)  # starts at 0.01 s
    # T = (10 MB * 8 + 0.41 * 100e6 + 0.01 * 100e6) / 200e6 = 0.61 s: a 2.5 MB, b 7.5 MB
    assert earliest_finish_s([a, b], 10_000_000) == pytest.approx(0.61)
    assert plan_shares([a, b], 10_000_000) == {"a": 2_500_000, "b": 7_500_000}


def test_a_message_never_waits_on_a_slow_path() -> None:
    fast = path("fast", 100, 10)
    slow = path("slow", 10, 50)
    # fast alone: 100 kB * 8 / 100 Mbit/s + 0.01 = 0.018 s, before slow even starts (0.05)
    assert plan_shares([slow, fast], 100_000) == {"fast": 100_000}
    assert earliest_finish_s([slow, fast], 100_000) == pytest.approx(0.018)


def test_down_paths_get_no_share() -> None:
    shares = plan_shares([path("a", 100, 10), path("b", 1000, 1, state="down")], 10_000)
    assert shares == {"a": 10_000}
    assert plan_shares([path("b", 1000, 1, state="down")], 10_000) == {}
    assert plan_shares([path("a", 100, 10)], 0) == {}


def test_shares_in_whole_shards_with_the_short_last_shard_on_the_largest() -> None:
    a = path("a", 100, 10)
    b = path("b", 40, 10)
    total = 1200 * 100 + 500  # 101 shards, the last one 500 bytes
    shares = plan_shares([a, b], total, unit_bytes=1200)
    assert sum(shares.values()) == total
    # T = (120500 * 8 + 0.01 * 140e6) / 140e6 = 16.886 ms: ideal 71.7 and 28.7 shards,
    # floors 71 + 28. Each of the 2 spare shards goes where it finishes first:
    # a 72 -> 16.912 ms vs b 29 -> 16.960 ms: a; then a 73 -> 17.008 ms vs b 29: b.
    assert shares == {"a": 72 * 1200 - 700, "b": 29 * 1200}


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
    with pytest.raises(LocalProtocolError):
        plan_shares([FAST, FAST], 1000)
    with pytest.raises(LocalProtocolError):
        plan_shares([FAST], 1000, unit_bytes=0)
    with pytest.raises(LocalProtocolError):
        choose_bulk_path([FAST], -1)


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


@settings(max_examples=300, deadline=None)
@given(_paths, st.integers(min_value=0, max_value=200_000_000), st.sampled_from([1, 1200, 8952]))
def test_shares_sum_to_the_total_and_no_share_finishes_late(
    paths: list[BulkPathView], total_bytes: int, unit_bytes: int
) -> None:
    shares = plan_shares(paths, total_bytes, unit_bytes=unit_bytes)
    by_name = {p.name: p for p in paths}
    usable = [p for p in paths if p.state != "down"]
    if not usable or total_bytes == 0:
        assert shares == {}
        return
    assert sum(shares.values()) == total_bytes
    assert all(size > 0 and by_name[n].state != "down" for n, size in shares.items())
    finish_s = earliest_finish_s(paths, total_bytes)
    # whole shards cost at most one shard on the slowest path past the common finish time:
    # each spare shard went where it finished first, and some path had room for it by then
    slack_s = max(unit_bytes * 8 / p.rate_bps for p in usable)
    for name, size in shares.items():
        assert by_name[name].finish_s(size) <= (finish_s + slack_s) * (1 + 1e-9)
    # and a single path is never better than the split
    assert finish_s <= min(p.finish_s(total_bytes) for p in usable) * (1 + 1e-9)


@settings(max_examples=300, deadline=None)
@given(_paths, st.integers(min_value=0, max_value=10_000_000))
def test_the_chosen_path_finishes_first_and_is_never_down(
    paths: list[BulkPathView], size_bytes: int
) -> None:
    chosen = choose_bulk_path(paths, size_bytes)
    usable = [p for p in paths if p.state != "down"]
    if not usable:
        assert chosen is None
        return
    best_s = min(p.finish_s(size_bytes) for p in usable)
    (choice,) = [p for p in paths if p.name == chosen]
    assert choice.state != "down"
    assert choice.finish_s(size_bytes) == best_s
    assert math.isfinite(best_s)
