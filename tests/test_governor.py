"""BulkGovernor: bulk yields the gateways' CPU while critical traffic flows (pure, fake clock)."""

from __future__ import annotations

import math
import random

import pytest

from tests.fakelink import LinkProfile, SimulatedPair, make_header
from wangate.core.estimator import PathEstimator
from wangate.core.events import MessageDelivered
from wangate.core.governor import BulkGovernor, common_delay_s


def governor() -> BulkGovernor:
    return BulkGovernor(
        target_delay_s=0.008,
        interval_s=0.05,
        decrease=0.5,
        increase_fraction=0.25,
        min_rate_bps=1e6,
        burst_s=0.01,
    )


def test_no_limit_until_the_hosts_delay_critical_traffic() -> None:
    g = governor()
    g.update(10.0, 0.002, critical_active=True)  # below the target
    assert g.rate_bps is None and g.allows(10.0) and g.next_allowed_at() is None
    g.on_bulk_sent(100_000)
    g.update(10.05, 0.050, critical_active=False)  # busy, but no critical traffic
    assert g.rate_bps is None and g.cuts == 0


def test_limit_starts_from_what_bulk_got_then_aimd() -> None:
    g = governor()
    g.update(10.0, 0.002, critical_active=True)
    g.on_bulk_sent(100_000)  # 100 kB in 50 ms: 16 Mbit/s
    g.update(10.03, 0.020, critical_active=True)  # not yet: one update per interval
    assert g.rate_bps is None
    g.update(10.05, 0.020, critical_active=True)
    assert g.rate_bps == pytest.approx(8e6, rel=1e-9)  # 16 Mbit/s, cut by half
    assert g.cuts == 1
    g.update(10.11, 0.004, critical_active=True)  # below the target again: grow
    assert g.rate_bps == pytest.approx(10e6, rel=1e-9)
    for i in range(20):  # always busy: never below the floor
        g.update(10.2 + i * 0.06, 0.030, critical_active=True)
    assert g.rate_bps == 1e6 and g.cuts == 21
    g.update(12.0, 0.030, critical_active=False)  # critical traffic stopped
    assert g.rate_bps is None and g.allows(12.0)


def test_token_bucket_paces_bulk_at_the_rate() -> None:
    g = governor()
    g.update(10.0, 0.002, critical_active=True)
    g.on_bulk_sent(100_000)
    g.update(10.05, 0.020, critical_active=True)  # 8 Mbit/s = 1 MB/s, bucket 10 kB
    assert not g.allows(10.05)  # the bucket starts empty
    assert g.next_allowed_at() == pytest.approx(10.0501, abs=1e-9)
    assert g.allows(10.051)  # 1 ms: 1000 bytes of tokens
    g.on_bulk_sent(1500)  # one piece may overdraw by what it lacks
    assert not g.allows(10.051)
    assert g.next_allowed_at() == pytest.approx(10.051 + 500 / 1e6 + 1e-4, abs=1e-9)
    assert g.allows(11.0)
    g.on_bulk_sent(10_000)  # the bucket held at most burst_s of tokens: 10 kB
    assert not g.allows(11.0)


def test_common_delay_is_the_least_queued_path() -> None:
    fast, slow = PathEstimator(), PathEstimator()
    fast.on_rtt_sample(0.020, 1.0, ack_delay_s=0.0)
    fast.on_rtt_sample(0.060, 1.1, ack_delay_s=0.0)  # srtt 25 ms, min 20 ms
    slow.on_rtt_sample(0.080, 1.0, ack_delay_s=0.0)
    slow.on_rtt_sample(0.160, 1.1, ack_delay_s=0.0)  # srtt 90 ms, min 80 ms
    assert fast.srtt_s == pytest.approx(0.025) and slow.srtt_s == pytest.approx(0.090)
    assert common_delay_s([fast, slow]) == pytest.approx(0.005)
    assert common_delay_s([slow]) == pytest.approx(0.010)
    assert common_delay_s([]) is None


def _bulk_sent(target_delay_s: float) -> tuple[list[int], SimulatedPair]:
    """Bulk bytes bj sent by 0.3 s and by 0.8 s after a critical and a bulk message."""

    def busy_hosts() -> BulkGovernor:
        return BulkGovernor(target_delay_s=target_delay_s, decrease=0.5, min_rate_bps=4e6)

    pair = SimulatedPair(
        {"a": LinkProfile(delay_s=0.010, rate_bps=40e6)}, seed=3, governor=busy_hosts
    )
    rng = random.Random(5)
    small, bulk = rng.randbytes(10_000), rng.randbytes(2_000_000)
    pair.submit("bj", make_header("layer0", small, critical=True), small)
    bulk_id = pair.submit("bj", make_header("bulk", bulk), bulk)
    sent = []
    for window_s in (0.3, 0.5):
        pair.run_for(window_s)
        sent.append(pair.wire["bj"].payload_sent[bulk_id])
    delivered = lambda: bulk_id in {e.msg_id for e in pair.events_of("bj", MessageDelivered)}  # noqa: E731
    assert pair.run_until(delivered, 30.0)
    assert pair.received["sh"][bulk_id][1] == bulk
    return sent, pair


def test_session_limits_bulk_while_critical_flows_and_the_hosts_are_busy() -> None:
    # target -1 s: the hosts always look busy, so bulk is halved every 50 ms from what it
    # got (40 Mbit/s) down to the 4 Mbit/s floor, which it has reached by 0.3 s
    (early, late), pair = _bulk_sent(-1.0)
    allowed = 0.5 * 4e6 / 8 + 4e6 / 8 * 0.005 + 1200  # rate x time + bucket + one piece
    assert 0 < late - early <= allowed
    status = pair.sessions["bj"].status()
    assert status["bulk_limit_cuts"] >= 4
    assert status["bulk_limit_bps"] == 0  # critical traffic stopped: no limit any more
    (free, _), _ = _bulk_sent(math.inf)
    assert free >= 1_200_000  # 40 Mbit/s for most of 0.3 s
