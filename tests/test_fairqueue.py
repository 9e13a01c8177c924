"""JobFairQueue through OutboundQueue.take: weighted stripes between jobs, no credit for
idle jobs, the bound on one job's critical traffic, and path restrictions."""

from __future__ import annotations

from collections.abc import Mapping

from wangate.core.fairqueue import CRITICAL_BURST_BYTES, CRITICAL_PAYBACK, STRIPE_BYTES
from wangate.core.jobs import JobPolicy
from wangate.core.outbound import CodingPolicy, OutboundQueue
from wangate.core.outbound_message import OutboundMessage

PIECE_BYTES = 1000  # every take asks for this much: pieces of 1000 bytes (no headers)
# a stripe ends with the piece that reaches STRIPE_BYTES: 263 pieces
STRIPE_PIECES = -(-STRIPE_BYTES // PIECE_BYTES)
STRIPE_SERVED = STRIPE_PIECES * PIECE_BYTES
ZEROS = memoryview(bytes(16 << 20))


class Jobs:
    """An OutboundQueue and the messages added to it, by id."""

    def __init__(self, policies: Mapping[str, JobPolicy]) -> None:
        self.queue = OutboundQueue(CodingPolicy(k=0))
        self.queue.set_policies(policies)
        self.next_id = 1

    def add(self, job: str, size: int, *, critical: bool = False, count: int = 1) -> None:
        for _ in range(count):
            self.queue.add(OutboundMessage(self.next_id, b"", ZEROS[:size], critical, job))
            self.next_id += 1

    def serve(self, path: str | None = None, route: str | None = None) -> tuple[str, bool] | None:
        """One datagram's worth, as the sender takes it: critical first. (job, critical)."""
        queue = self.queue
        piece = None
        if path is None or queue.work.critical_for(path, route):
            piece = queue.take(PIECE_BYTES, critical=True, path=path, route=route)
        if piece is None:
            piece = queue.take(PIECE_BYTES, critical=False, path=path, route=route)
        if piece is None:
            return None
        assert piece.end - piece.start == PIECE_BYTES or not piece.message.has_work
        return piece.message.job, piece.message.critical

    def served(self, n: int, path: str | None = None) -> list[str]:
        jobs = []
        for _ in range(n):
            served = self.serve(path)
            assert served is not None
            jobs.append(served[0])
        return jobs


def test_weights_three_to_one_share_bytes_three_to_one_stripe_by_stripe() -> None:
    jobs = Jobs({"a": JobPolicy(weight=3.0), "b": JobPolicy(weight=1.0)})
    jobs.add("a", 16 << 20)
    jobs.add("b", 16 << 20)
    served = {"a": 0, "b": 0}
    for job in jobs.served(40 * STRIPE_PIECES):
        served[job] += PIECE_BYTES
        # SFQ: the tags a/3 and b/1 never differ by more than one stripe's charge
        assert abs(served["a"] / 3 - served["b"]) <= STRIPE_SERVED
    # cycles of four stripes, a b a a: exactly 3:1 after 40 stripes
    assert served == {"a": 30 * STRIPE_SERVED, "b": 10 * STRIPE_SERVED}


def test_turns_are_whole_stripes_not_datagrams() -> None:
    jobs = Jobs({"a": JobPolicy(), "b": JobPolicy()})
    jobs.add("a", 4 << 20)
    jobs.add("b", 4 << 20)
    order = jobs.served(4 * STRIPE_PIECES)
    assert order == (["a"] * STRIPE_PIECES + ["b"] * STRIPE_PIECES) * 2


def test_three_jobs_one_two_three() -> None:
    weights = {"a": 1.0, "b": 2.0, "c": 3.0}
    jobs = Jobs({name: JobPolicy(weight=w) for name, w in weights.items()})
    for name in weights:
        jobs.add(name, 16 << 20)
    served = dict.fromkeys(weights, 0)
    for job in jobs.served(60 * STRIPE_PIECES):
        served[job] += PIECE_BYTES
        for x in weights:
            for y in weights:  # SFQ's bound: a stripe's charge to each of the two jobs
                bound = STRIPE_SERVED / weights[x] + STRIPE_SERVED / weights[y]
                assert served[x] / weights[x] - served[y] / weights[y] <= bound
    assert served == {"a": 10 * STRIPE_SERVED, "b": 20 * STRIPE_SERVED, "c": 30 * STRIPE_SERVED}


def test_a_job_back_from_idle_gets_one_stripe_not_the_time_it_was_away() -> None:
    jobs = Jobs({"a": JobPolicy(), "b": JobPolicy()})
    jobs.add("a", 16 << 20)
    assert set(jobs.served(8 * STRIPE_PIECES)) == {"a"}  # b idle: a gets everything
    jobs.add("b", 16 << 20)
    order = jobs.served(8 * STRIPE_PIECES)
    # a's turn ends, then b has one stripe, and they alternate: no burst for b
    runs: list[tuple[str, int]] = []
    for job in order:
        if runs and runs[-1][0] == job:
            runs[-1] = (job, runs[-1][1] + 1)
        else:
            runs.append((job, 1))
    assert max(n for job, n in runs if job == "b") == STRIPE_PIECES
    assert order.count("b") == 4 * STRIPE_PIECES


def test_idle_capacity_goes_to_the_job_with_work() -> None:
    jobs = Jobs({"a": JobPolicy(weight=1.0), "b": JobPolicy(weight=100.0)})
    jobs.add("b", 100_000)
    jobs.add("a", 2 << 20)
    order = [jobs.serve() for _ in range(100 + 2098 + 1)]  # 2 MiB: 2098 pieces
    assert order[-1] is None and None not in order[:-1]  # no gap until all is sent
    assert order[:100] == [("b", False)] * 100  # the heavy job first, then a alone


def test_one_jobs_critical_may_not_starve_anothers_bulk_after_a_burst() -> None:
    jobs = Jobs({"a": JobPolicy(), "b": JobPolicy()})
    jobs.add("a", 100_000, critical=True, count=80)  # 8 MB of critical traffic
    jobs.add("b", 16 << 20)
    first = [jobs.serve() for _ in range(CRITICAL_BURST_BYTES // PIECE_BYTES + 1)]
    assert first == [("a", True)] * len(first)  # strict priority for the burst
    assert jobs.queue.work.debt_bytes("a") == len(first) * PIECE_BYTES
    a = b = 0
    while jobs.queue.work.has_critical_work or a + b < 6_000_000:
        served = jobs.serve()
        assert served is not None
        if served[0] == "a":
            a += PIECE_BYTES
        else:
            b += PIECE_BYTES
        # after the burst, a's critical bytes less 4 x b's bulk stay within two stripes:
        # a's turn in the bulk class, after up to one stripe b was ahead of it there
        assert a - CRITICAL_PAYBACK * b <= 2 * STRIPE_SERVED + 2 * PIECE_BYTES
    assert b >= 0.2 * (a + b) - 2 * STRIPE_SERVED
    assert 0.19 < b / (a + b) < 0.21  # the 80 % share, measured over 6 MB


def test_critical_with_no_other_bulk_waiting_is_unbounded() -> None:
    jobs = Jobs({"a": JobPolicy()})
    jobs.add("a", 100_000, critical=True, count=50)
    jobs.add("a", 1_000_000)  # its own bulk waits behind it
    assert [jobs.serve() for _ in range(5000)] == [("a", True)] * 5000
    assert jobs.queue.work.debt_bytes("a") == 0
    jobs = Jobs({"a": JobPolicy(), "b": JobPolicy()})
    jobs.add("a", 100_000, critical=True, count=50)
    jobs.add("b", 100_000, critical=True, count=50)  # another job's critical is no bulk
    order = [jobs.serve() for _ in range(10_000)]
    assert set(order) == {("a", True), ("b", True)}
    # in turn, a message each (a turn ends with its message)
    assert order[:400] == ([("a", True)] * 100 + [("b", True)] * 100) * 2
    assert jobs.queue.work.debt_bytes("a") == jobs.queue.work.debt_bytes("b") == 0


def test_critical_of_one_job_goes_before_bulk_of_all_jobs() -> None:
    jobs = Jobs({"a": JobPolicy(), "b": JobPolicy(weight=10.0)})
    jobs.add("a", 1_000_000)
    jobs.add("b", 1_000_000)
    jobs.add("a", 50_000, critical=True)
    assert [jobs.serve() for _ in range(50)] == [("a", True)] * 50
    assert {jobs.serve() for _ in range(2000)} == {("a", False), ("b", False)}


def test_a_job_past_its_burst_waits_for_others_bulk_to_pay_its_debt_down() -> None:
    jobs = Jobs({"a": JobPolicy(), "b": JobPolicy()})
    jobs.add("b", 16 << 20)
    jobs.add("a", 100_000, critical=True, count=20)
    work = jobs.queue.work
    for _ in range(CRITICAL_BURST_BYTES // PIECE_BYTES + 1):
        jobs.serve()
    assert not work.has_critical_work and work.has_bulk_work  # demoted
    # b's stripe, which pays a's debt down 4 bytes per byte, until a is back on top
    paid = -(-(work.debt_bytes("a") - CRITICAL_BURST_BYTES) // int(CRITICAL_PAYBACK))
    order = [jobs.serve() for _ in range(-(-paid // PIECE_BYTES) + 1)]
    assert order[:-1] == [("b", False)] * (len(order) - 1) and order[-1] == ("a", True)


def test_a_job_limited_to_some_paths_is_served_only_there() -> None:
    jobs = Jobs({"x": JobPolicy(paths=frozenset({"b"})), "y": JobPolicy()})
    jobs.add("x", 1 << 20)
    jobs.add("y", 1 << 20)
    assert set(jobs.served(2 * STRIPE_PIECES, path="a")) == {"y"}
    assert jobs.served(STRIPE_PIECES, path="b") == ["x"] * STRIPE_PIECES
    # critical: the route "a" may not carry x's, so "b" takes it; "a" takes y's
    jobs.add("x", 10_000, critical=True)
    jobs.add("y", 10_000, critical=True)
    work = jobs.queue.work
    assert work.critical_for("b", "a") and work.critical_for("a", "a")
    assert {jobs.serve("b", route="a") for _ in range(10)} == {("x", True)}
    assert not work.critical_for("b", "a")  # y's critical goes on the route
    assert {jobs.serve("a", route="a") for _ in range(10)} == {("y", True)}
    assert not work.critical_for("a", "a") and not work.critical_for("b", "a")


def test_a_job_with_none_of_its_paths_up_waits_and_a_reload_frees_it() -> None:
    jobs = Jobs({"x": JobPolicy(paths=frozenset({"c"}))})
    jobs.add("x", 10_000, critical=True)
    jobs.add("x", 10_000)
    assert jobs.serve("a", route="a") is None and jobs.serve("b", route="a") is None
    assert jobs.queue.has_critical_work and jobs.queue.has_bulk_work  # it waits
    jobs.queue.set_policies({"x": JobPolicy(paths=frozenset({"a", "c"}))})
    assert jobs.serve("b", route="a") is None
    assert [jobs.serve("a", route="a") for _ in range(20)] == [("x", True)] * 10 + [
        ("x", False)
    ] * 10
    assert jobs.serve("a", route="a") is None and not jobs.queue.has_work()


def test_a_weight_changed_by_a_reload_applies_to_queued_messages() -> None:
    jobs = Jobs({"a": JobPolicy(), "b": JobPolicy()})
    jobs.add("a", 16 << 20)
    jobs.add("b", 16 << 20)
    jobs.served(2 * STRIPE_PIECES)
    jobs.queue.set_policies({"a": JobPolicy(weight=3.0), "b": JobPolicy()})
    order = jobs.served(8 * STRIPE_PIECES)
    assert order.count("a") == 6 * STRIPE_PIECES


def test_one_job_keeps_the_order_of_one_fifo_with_repairs_in_front() -> None:
    jobs = Jobs({})  # no policy: JobPolicy() for the default job
    queue = jobs.queue
    jobs.add("default", 3000)
    jobs.add("default", 3000)
    first = queue.take(PIECE_BYTES, critical=False)
    assert first is not None and first.message.msg_id == 1
    for _ in range(3):
        queue.take(PIECE_BYTES, critical=False)
    queue.mark_lost(1, 0, 1000, -1, -1)  # message 1 was all sent: back in front
    repair = queue.take(PIECE_BYTES, critical=False)
    assert repair is not None and (repair.message.msg_id, repair.repair) == (1, True)
