"""What the engine's channel has received (wg_received.c): the replay window, the ACK
ranges it sends (at most 32, the lowest dropped), when an ACK is due, and the encoded
ack delay (RFC 9000 §13.2, §18.2's ack_delay_exponent)."""

from __future__ import annotations

import pytest
from aioquic.quic.rangeset import RangeSet
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.engine import _engine
from wangate.errors import LocalProtocolError

WINDOW = _engine.WG_REPLAY_WINDOW
MAX_RANGES = _engine.WG_MAX_ACK_RANGES
MAD = 0.025  # max_ack_delay


def ranges_of(r: _engine.Received, now: float = 0.0) -> list[tuple[int, int]]:
    got = r.ack(now)
    assert got is not None
    return got[0]


def test_nothing_received() -> None:
    r = _engine.Received()
    assert r.ack(1.0) is None
    assert r.largest == -1
    assert r.is_new(0) and r.is_new(2**62 - 1)
    assert not r.ack_due(100.0)


def test_ranges_after_arrival_orders() -> None:
    r = _engine.Received()
    for pn in (0, 1, 2, 5, 4, 9, 7):
        assert r.add(pn, True, 0.0, MAD)
    assert ranges_of(r) == [(9, 9), (7, 7), (4, 5), (0, 2)]
    assert r.add(8, True, 0.0, MAD)  # joins 7 and 9
    assert r.add(3, True, 0.0, MAD)  # joins 0..2 and 4..5
    assert ranges_of(r) == [(7, 9), (0, 5)]
    assert r.add(6, False, 0.0, MAD)
    assert ranges_of(r) == [(0, 9)]
    r = _engine.Received()
    for pn in (10, 3, 11, 2, 0):
        r.add(pn, True, 0.0, MAD)
    assert ranges_of(r) == [(10, 11), (2, 3), (0, 0)]


def test_duplicates_and_too_old_are_refused() -> None:
    r = _engine.Received()
    assert r.add(5, True, 0.0, MAD)
    assert not r.is_new(5)
    assert not r.add(5, True, 0.0, MAD)
    assert r.duplicates == 1
    assert r.is_new(4)  # below the largest, within the window, not seen
    big = WINDOW + 100
    assert r.add(big, True, 0.0, MAD)
    assert not r.is_new(100)  # exactly WINDOW below: outside
    assert r.is_new(101)  # the oldest the window holds
    assert not r.is_new(4)
    assert not r.add(4, True, 0.0, MAD)
    assert r.too_old == 1
    assert r.add(101, True, 0.0, MAD)
    assert not r.is_new(101)


def test_window_slides_and_forgets_old_bits() -> None:
    r = _engine.Received()
    r.add(0, True, 0.0, MAD)
    r.add(1, True, 0.0, MAD)
    # pn WINDOW reuses 0's slot, pn WINDOW + 1 reuses 1's: neither is a duplicate
    assert r.is_new(WINDOW) and r.is_new(WINDOW + 1)
    assert r.add(WINDOW, True, 0.0, MAD)
    assert r.is_new(WINDOW + 1)
    assert r.add(WINDOW + 1, True, 0.0, MAD)
    assert not r.is_new(WINDOW + 1)
    # a jump of more than the window clears it all
    far = 10 * WINDOW
    assert r.add(far, True, 0.0, MAD)
    assert r.is_new(far - 1) and r.is_new(far - WINDOW + 1)
    assert not r.is_new(far - WINDOW)


def test_ranges_beyond_32_drop_the_lowest() -> None:
    r = _engine.Received()
    for i in range(MAX_RANGES + 5):
        r.add(2 * i, True, 0.0, MAD)
    got = ranges_of(r)
    assert len(got) == MAX_RANGES
    assert got[0] == (2 * (MAX_RANGES + 4),) * 2
    assert got[-1] == (10, 10)  # 0, 2, 4, 6, 8 dropped
    # a packet below every range kept (new to the window) is dropped from the ranges
    assert r.add(1, True, 0.0, MAD)
    assert ranges_of(r) == got
    # one joining two ranges frees a slot
    assert r.add(2 * (MAX_RANGES + 4) - 1, True, 0.0, MAD)
    assert len(ranges_of(r)) == MAX_RANGES - 1


def test_ack_due_every_second_or_after_max_ack_delay() -> None:
    r = _engine.Received()
    r.add(0, False, 0.0, MAD)  # not ack-eliciting: no ACK owed
    assert not r.ack_due(10.0) and r.ack_at is None
    r.add(1, True, 1.0, MAD)
    assert r.ack_at == 1.0 + MAD
    assert not r.ack_due(1.0 + MAD / 2)
    assert r.ack_due(1.0 + MAD)
    r.add(2, True, 1.01, MAD)  # the second: at once
    assert r.ack_due(1.01)
    r.ack_sent()
    assert not r.ack_due(5.0) and r.ack_at is None
    r.add(3, True, 2.0, MAD)
    r.add(4, False, 2.001, MAD)
    assert not r.ack_due(2.0 + MAD / 2)
    assert r.ack_at == 2.0 + MAD  # the first's deadline holds
    assert r.ack_due(2.0 + MAD)


def test_encoded_ack_delay() -> None:
    r = _engine.Received()
    r.add(7, True, 1.0, MAD)
    r.add(3, True, 1.5, MAD)  # not the largest: the delay still runs from 7's arrival
    ranges, delay = r.ack(1.0123)
    assert ranges == [(7, 7), (3, 3)]
    us = int((1.0123 - 1.0) * 1000000)  # as aioquic's _write_ack_frame truncates
    assert us == 12299
    assert delay == us >> 3
    assert r.ack(1.0123, ack_delay_exponent=0)[1] == us
    assert r.ack(1.0123, ack_delay_exponent=20)[1] == 0
    assert r.ack(3.0, ack_delay_exponent=20)[1] == 2000000 >> 20
    assert r.ack(0.5)[1] == 0  # a clock before the arrival: no delay
    with pytest.raises(LocalProtocolError):
        r.ack(1.0, ack_delay_exponent=21)


def test_forget_what_the_peer_has_seen_acked() -> None:
    r = _engine.Received()
    for pn in (0, 1, 2, 5, 6, 9):
        r.add(pn, True, 0.0, MAD)
    r.forget(5)
    assert ranges_of(r) == [(9, 9), (6, 6)]
    assert not r.is_new(1)  # the replay window is unchanged
    r.forget(9)
    assert r.ack(0.0) is None


def test_misuse() -> None:
    r = _engine.Received()
    for bad in (-1, 2**62, "1", 1.0):
        with pytest.raises(LocalProtocolError):
            r.is_new(bad)
        with pytest.raises(LocalProtocolError):
            r.add(bad, True, 0.0, MAD)
    with pytest.raises(LocalProtocolError):
        r.add(1, True, float("inf"), MAD)
    with pytest.raises(LocalProtocolError):
        r.add(1, True, 0.0, -1.0)
    assert r.largest == -1


class Model:
    """What wg_received should do, the simple way: a set of accepted packet numbers,
    aioquic's RangeSet with its lowest range shifted off past 32."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.largest = -1
        self.ranges = RangeSet()

    def is_new(self, pn: int) -> bool:
        if pn > self.largest:
            return True
        return self.largest - pn < WINDOW and pn not in self.seen

    def add(self, pn: int) -> bool:
        if not self.is_new(pn):
            return False
        self.seen.add(pn)
        self.largest = max(self.largest, pn)
        self.ranges.add(pn)
        if len(self.ranges) > MAX_RANGES:
            self.ranges.shift()
        return True

    def forget(self, pn: int) -> None:
        self.ranges.subtract(0, pn + 1)

    def ack(self) -> list[tuple[int, int]] | None:
        if len(self.ranges) == 0:
            return None
        return [(r.start, r.stop - 1) for r in reversed(list(self.ranges))]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 3 * WINDOW), st.booleans()),
            st.tuples(st.just("near"), st.integers(-80, 8), st.booleans()),
            st.tuples(st.just("forget"), st.integers(-40, 0), st.just(False)),
        ),
        max_size=300,
    )
)
def test_random_arrivals_match_the_model(ops: list[tuple[str, int, bool]]) -> None:
    r, m = _engine.Received(), Model()
    now = 0.0
    for kind, value, eliciting in ops:
        now += 0.001
        if kind == "forget":
            if m.largest >= 0 and m.largest + value >= 0:
                r.forget(m.largest + value)
                m.forget(m.largest + value)
        else:
            pn = value if kind == "add" else max(0, m.largest + value)
            assert r.is_new(pn) == m.is_new(pn)
            assert r.add(pn, eliciting, now, MAD) == m.add(pn)
        assert r.largest == m.largest
        got = r.ack(now)
        assert (None if got is None else got[0]) == m.ack()
