"""PathScheduler: where critical and bulk pieces go, given what the estimators measured."""

from __future__ import annotations

from wangate.core.estimator import PathEstimator
from wangate.core.scheduler import PathScheduler


def estimator(
    rtt_s: float, rate_bps: float, now: float = 10.0, *, queue_s: float = 0.0
) -> PathEstimator:
    est = PathEstimator()
    est.on_heard(now - 1.0)
    for i in range(20):  # a steady path: min RTT and srtt at rtt_s
        est.on_rtt_sample(rtt_s, now - 1.0 + i * 0.01)
    t = now - 0.5
    for _ in range(50):  # delivery-rate samples at rate_bps
        t += 0.01
        est.on_sent(int(rate_bps / 8 * 0.01), t)
        est.on_acked(int(rate_bps / 8 * 0.01), t)
    for i in range(40):  # then a standing queue of queue_s
        est.on_rtt_sample(rtt_s + queue_s, now - 0.3 + i * 0.005)
    est.on_heard(now)
    return est


def scheduler_on(paths: dict[str, PathEstimator], now: float = 10.0) -> PathScheduler:
    scheduler = PathScheduler()
    for name in paths:
        for _ in range(3):
            scheduler.selector.record_probe_ok(name, now)
    scheduler.update(now, paths, set(paths))
    return scheduler


def test_bulk_stays_off_a_queued_critical_route_while_critical_traffic_flows() -> None:
    paths = {"a": estimator(0.020, 50e6, queue_s=0.010), "b": estimator(0.080, 50e6)}
    scheduler = scheduler_on(paths)
    assert scheduler.selector.current == "a"
    usable = {"a": True, "b": True}
    args = (paths, usable, 10_000_000, 1400, 10.0)
    assert scheduler.bulk_helps("a", *args, critical_active=True) is False
    assert scheduler.bulk_helps("a", *args, critical_active=False) is True
    assert scheduler.bulk_helps("b", *args, critical_active=True) is True
    # with no other path, the critical route carries bulk all the same
    assert scheduler.bulk_helps("a", paths, {"a": True, "b": False}, 10_000_000, 1400, 10.0,
                                critical_active=True) is True  # fmt: skip


def test_bulk_uses_a_critical_route_without_a_queue() -> None:
    paths = {"a": estimator(0.020, 50e6), "b": estimator(0.080, 50e6)}
    scheduler = scheduler_on(paths)
    assert scheduler.selector.current == "a"
    args = (paths, {"a": True, "b": True}, 10_000_000, 1400, 10.0)
    assert scheduler.bulk_helps("a", *args, critical_active=True) is True


def test_a_slow_path_steps_aside_at_the_end_of_a_message() -> None:
    paths = {"fast": estimator(0.020, 100e6), "slow": estimator(0.200, 5e6)}
    scheduler = scheduler_on(paths)
    usable = {"fast": True, "slow": True}
    # plenty left: the slow path helps; one piece left: the fast path finishes it first
    assert scheduler.bulk_helps("slow", paths, usable, 50_000_000, 1400, 10.0) is True
    assert scheduler.bulk_helps("slow", paths, usable, 1400, 1400, 10.0) is False
    assert scheduler.bulk_helps("fast", paths, usable, 1400, 1400, 10.0) is True


def test_a_slow_path_does_not_step_aside_for_a_critical_route_that_keeps_bulk_off() -> None:
    paths = {"fast": estimator(0.010, 50e6, queue_s=0.010), "slow": estimator(0.060, 50e6)}
    scheduler = scheduler_on(paths)
    assert scheduler.selector.current == "fast"
    usable = {"fast": True, "slow": True}
    # the end of a message: fast would finish it first, but takes no bulk while critical
    # traffic flows, so slow carries it rather than leaving it waiting
    assert (
        scheduler.bulk_helps("fast", paths, usable, 1400, 1400, 10.0, critical_active=True) is False
    )
    assert (
        scheduler.bulk_helps("slow", paths, usable, 1400, 1400, 10.0, critical_active=True) is True
    )
    # with no critical traffic, slow steps aside as usual
    assert scheduler.bulk_helps("slow", paths, usable, 1400, 1400, 10.0) is False
