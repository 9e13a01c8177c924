"""The allreduce bounds of bench.collectives (pure arithmetic, exact values)."""

from __future__ import annotations

import pytest

from bench.collectives import bound
from bench.collectives.run import bounds, links_bps
from bench.collectives.worker import share_slices
from wangate.lab.scenario import load_scenario

MBIT = 1_000_000.0
LINKS = {
    ("bj", "sh"): 50 * MBIT,
    ("sh", "bj"): 50 * MBIT,
    ("bj", "gz"): 30 * MBIT,
    ("gz", "bj"): 30 * MBIT,
    ("sh", "gz"): 20 * MBIT,
    ("gz", "sh"): 20 * MBIT,
}


def test_site_capacity_is_the_least_of_out_and_in() -> None:
    assert bound.site_capacities_bps(LINKS) == {"bj": 80 * MBIT, "sh": 70 * MBIT, "gz": 50 * MBIT}
    asymmetric = {("a", "b"): 10.0, ("b", "a"): 4.0, ("a", "c"): 6.0, ("c", "a"): 6.0}
    assert bound.site_capacities_bps(asymmetric) == {"a": 10.0, "b": 4.0, "c": 6.0}


def test_capacity_and_equal_shares() -> None:
    capacities = bound.site_capacities_bps(LINKS)
    assert bound.capacity_shares(capacities) == {"bj": 0.4, "sh": 0.35, "gz": 0.25}
    assert bound.equal_shares(["a", "b", "c", "d"]) == {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}


def test_site_bytes_reduce_scatter_plus_all_gather() -> None:
    # S (1 + (N - 2) s_i): 3 sites
    assert bound.site_bytes(1000, {"a": 0.5, "b": 0.25, "c": 0.25}) == {
        "a": 1500.0,
        "b": 1250.0,
        "c": 1250.0,
    }
    # 2 sites: every site moves exactly S whatever the shares
    assert bound.site_bytes(1000, {"a": 0.75, "b": 0.25}) == {"a": 1000.0, "b": 1000.0}
    # 4 equal sites: S (1 + 2/4) = 1.5 S
    assert bound.site_bytes(1000, bound.equal_shares(["a", "b", "c", "d"])) == {
        s: 1500.0 for s in "abcd"
    }


def test_site_bound_is_the_slowest_site() -> None:
    capacities = {"bj": 80 * MBIT, "sh": 70 * MBIT, "gz": 50 * MBIT}
    shares = bound.capacity_shares(capacities)
    # gz: 8 * 1e6 * 1.25 / 50e6 = 0.2 s; bj 0.14 s; sh 0.1543 s
    assert bound.site_bound_s(1_000_000, capacities, shares) == pytest.approx(0.2, rel=1e-12)
    equal = bound.equal_shares(list(capacities))
    # gz: 8e6 * (4/3) / 50e6 = 0.21333 s
    assert bound.site_bound_s(1_000_000, capacities, equal) == pytest.approx(
        8e6 * 4 / 3 / 50e6, rel=1e-12
    )


def test_link_bound_direct_exchanges() -> None:
    shares = {"bj": 0.4, "sh": 0.35, "gz": 0.25}
    # sh-gz carries (0.35 + 0.25) S at 20 Mbit/s: 8e6 * 0.6 / 20e6 = 0.24 s
    assert bound.link_bound_s(1_000_000, LINKS, shares) == pytest.approx(0.24, rel=1e-12)


def test_best_shares_water_filling() -> None:
    # T C_i / 8S = 1 + s_i with sum s_i = 1: T/8S = 4 / 200e6; s = 0.6, 0.4, 0.0
    capacities = {"bj": 80 * MBIT, "sh": 70 * MBIT, "gz": 50 * MBIT}
    best = bound.best_site_shares(capacities)
    assert best["bj"] == pytest.approx(0.6, abs=1e-12)
    assert best["sh"] == pytest.approx(0.4, abs=1e-12)
    assert best["gz"] == pytest.approx(0.0, abs=1e-12)
    assert bound.site_bound_s(1_000_000, capacities, best) == pytest.approx(0.16, rel=1e-12)
    # A site too slow for even its own S gets nothing; the rest split by water-filling.
    slow = {"a": 100.0, "b": 60.0, "c": 40.0}
    shares = bound.best_site_shares(slow)
    assert shares["c"] == 0.0
    assert shares["a"] == pytest.approx(0.875, abs=1e-12)
    assert shares["b"] == pytest.approx(0.125, abs=1e-12)
    assert bound.best_site_shares({"a": 1.0, "b": 3.0}) == {"a": 0.5, "b": 0.5}


def test_ring_bound() -> None:
    # 3 sites: 2 * 2/3 * S over the slowest ring link: 8e6 * 4/3 / 20e6
    assert bound.ring_bound_s(1_000_000, [50 * MBIT, 20 * MBIT, 30 * MBIT]) == pytest.approx(
        8e6 * 4 / 3 / 20e6, rel=1e-12
    )


def test_scenario_bounds_coll_3() -> None:
    scenario = load_scenario("coll_3")
    assert links_bps(scenario) == LINKS
    size = 4 * 8 * 1024 * 1024
    b = bounds(scenario, size)
    assert b["capacity_shares"] == {"bj": 0.4, "sh": 0.35, "gz": 0.25}
    assert b["site_bound_s"] == pytest.approx(8 * size * 1.25 / 50e6, rel=1e-12)
    assert b["link_bound_s"] == pytest.approx(8 * size * 0.6 / 20e6, rel=1e-12)
    # ring bj -> sh -> gz -> bj: slowest is sh -> gz at 20 Mbit/s
    assert b["gloo_ring_bound_s"] == pytest.approx(8 * size * 4 / 3 / 20e6, rel=1e-12)


def test_share_slices_are_contiguous_and_cover_everything() -> None:
    pieces = share_slices(100, ["a", "b", "c"], {"a": 0.5, "b": 0.3, "c": 0.2}, 2)
    assert pieces == {
        "a": [slice(0, 25), slice(25, 50)],
        "b": [slice(50, 65), slice(65, 80)],
        "c": [slice(80, 90), slice(90, 100)],
    }
    # uneven cuts: 10 elements in 3 chunks; the last site ends at the last element
    pieces = share_slices(10, ["a", "b"], {"a": 0.33, "b": 0.67}, 3)
    assert pieces == {
        "a": [slice(0, 1), slice(1, 2), slice(2, 3)],
        "b": [slice(3, 5), slice(5, 7), slice(7, 10)],
    }
