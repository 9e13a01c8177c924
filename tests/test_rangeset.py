"""RangeSet: exact ranges after each operation, and agreement with a Python set model."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.core.rangeset import RangeSet


def make(*ranges: tuple[int, int]) -> RangeSet:
    rs = RangeSet()
    for start, end in ranges:
        rs.add(start, end)
    return rs


def test_empty() -> None:
    rs = RangeSet()
    assert list(rs.ranges()) == []
    assert (len(rs), rs.total()) == (0, 0)
    assert 0 not in rs
    assert rs.covers(5, 5)
    assert not rs.covers(0, 1)
    assert rs.first_gap(0, 10) == (0, 10)
    assert rs.first_gap(3, 3) is None


def test_add_returns_only_the_new_count() -> None:
    rs = RangeSet()
    assert rs.add(10, 20) == 10
    assert rs.add(10, 20) == 0
    assert rs.add(15, 25) == 5
    assert rs.add(0, 5) == 5
    assert rs.add(0, 30) == 10  # fills [5, 10) and [25, 30)
    assert list(rs.ranges()) == [(0, 30)]
    assert rs.add(7, 7) == 0
    assert rs.add(9, 3) == 0
    assert list(rs.ranges()) == [(0, 30)]


def test_appending_at_the_end_merges_adjacent_and_keeps_gaps() -> None:
    rs = make((0, 10), (10, 20), (25, 30))
    assert list(rs.ranges()) == [(0, 20), (25, 30)]
    assert (len(rs), rs.total()) == (2, 25)


def test_insert_between_and_merge_across_several() -> None:
    rs = make((0, 2), (10, 12), (20, 22), (30, 32))
    rs.add(5, 6)
    assert list(rs.ranges()) == [(0, 2), (5, 6), (10, 12), (20, 22), (30, 32)]
    assert rs.add(11, 21) == 8  # [12, 20)
    assert list(rs.ranges()) == [(0, 2), (5, 6), (10, 22), (30, 32)]
    assert rs.add(2, 5) == 3  # touching on both sides joins two ranges
    assert list(rs.ranges()) == [(0, 6), (10, 22), (30, 32)]
    assert rs.add(-5, 100) == 105 - 20
    assert list(rs.ranges()) == [(-5, 100)]


def test_membership_and_cover_at_the_edges() -> None:
    rs = make((10, 20), (30, 40))
    assert [v in rs for v in (9, 10, 19, 20, 29, 30, 39, 40)] == [
        False,
        True,
        True,
        False,
        False,
        True,
        True,
        False,
    ]
    assert rs.covers(10, 20)
    assert rs.covers(12, 13)
    assert not rs.covers(10, 21)
    assert not rs.covers(15, 35)
    assert not rs.covers(5, 12)


def test_first_gap() -> None:
    rs = make((10, 20), (30, 40))
    assert rs.first_gap(0, 50) == (0, 10)
    assert rs.first_gap(10, 50) == (20, 30)
    assert rs.first_gap(15, 25) == (20, 25)
    assert rs.first_gap(12, 18) is None
    assert rs.first_gap(30, 40) is None
    assert rs.first_gap(35, 60) == (40, 60)
    assert rs.first_gap(20, 21) == (20, 21)


def test_covered_bytes() -> None:
    rs = make((10, 20), (30, 40), (50, 55))
    assert rs.covered_bytes(0, 100) == 25
    assert rs.covered_bytes(0, 10) == 0
    assert rs.covered_bytes(20, 30) == 0
    assert rs.covered_bytes(10, 20) == 10
    assert rs.covered_bytes(15, 35) == 10  # [15, 20) and [30, 35)
    assert rs.covered_bytes(19, 31) == 2
    assert rs.covered_bytes(12, 13) == 1
    assert rs.covered_bytes(39, 51) == 2
    assert rs.covered_bytes(54, 1000) == 1
    assert rs.covered_bytes(55, 1000) == 0
    assert rs.covered_bytes(30, 30) == 0
    assert rs.covered_bytes(40, 30) == 0
    assert RangeSet().covered_bytes(0, 10) == 0


def test_trim_below() -> None:
    rs = make((0, 10), (20, 30), (40, 50))
    rs.trim_below(25)
    assert list(rs.ranges()) == [(25, 30), (40, 50)]
    rs.trim_below(30)
    assert list(rs.ranges()) == [(40, 50)]
    rs.trim_below(10)
    assert list(rs.ranges()) == [(40, 50)]
    rs.trim_below(100)
    assert list(rs.ranges()) == []


def test_clear_and_repr() -> None:
    rs = make((1, 3), (5, 6))
    assert repr(rs) == "RangeSet([(1, 3), (5, 6)])"
    rs.clear()
    assert repr(rs) == "RangeSet([])"


# ---------------------------------------------------------------------- model

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 80), st.integers(0, 80)),
        st.tuples(st.just("trim"), st.integers(0, 80), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(ops, st.integers(0, 80), st.integers(0, 80))
def test_agrees_with_a_set_of_integers(
    operations: list[tuple[str, int, int]], lo: int, hi: int
) -> None:
    rs = RangeSet()
    model: set[int] = set()
    for op, a, b in operations:
        if op == "add":
            new = set(range(a, b)) - model
            assert rs.add(a, b) == len(new)
            model |= new
        else:
            rs.trim_below(a)
            model = {v for v in model if v >= a}
    ranges = list(rs.ranges())
    # canonical: sorted, non-empty, disjoint and not touching
    for (s1, e1), (s2, e2) in pairwise(ranges):
        assert s1 < e1 < s2 < e2
    assert {v for s, e in ranges for v in range(s, e)} == model
    assert rs.total() == len(model)
    assert all((v in rs) == (v in model) for v in range(-1, 82))
    assert rs.covers(lo, hi) == (set(range(lo, hi)) <= model)
    assert rs.covered_bytes(lo, hi) == len(set(range(lo, hi)) & model)
    missing = sorted(set(range(lo, hi)) - model)
    gap = rs.first_gap(lo, hi)
    if not missing:
        assert gap is None
    else:
        assert gap is not None
        start, end = gap
        assert start == missing[0]
        assert set(range(start, end)) <= set(missing)
        assert end == hi or end in model
