"""Outbox admission between jobs: fair by weight, critical first, each job within its
cap of bytes held at the peer, a job at its cap never in the others' way."""

from __future__ import annotations

from wangate.core.jobs import JobPolicy
from wangate.core.outbound_message import OutboundMessage
from wangate.core.outbox import Outbox


class Box:
    def __init__(self, policies: dict[str, JobPolicy], granted_bytes: int = 1 << 30) -> None:
        self.outbox = Outbox("sh", policies)
        self.outbox.grant(granted_bytes)
        self.next_id = 1

    def add(self, job: str, size: int = 100, *, critical: bool = False, count: int = 1) -> None:
        for _ in range(count):
            self.outbox.add(OutboundMessage(self.next_id, b"", bytes(size), critical, job), None)
            self.next_id += 1

    def admit(self) -> list[tuple[str, int]]:
        started, failed = self.outbox.admit()
        assert failed == []
        return [(m.job, m.msg_id) for m in started]


def test_a_job_at_its_cap_waits_without_holding_up_the_others() -> None:
    box = Box({"a": JobPolicy(max_inflight_bytes=250), "b": JobPolicy()})
    box.add("a", count=3)  # 1, 2, 3
    box.add("b", count=2)  # 4, 5
    assert box.admit() == [("a", 1), ("b", 4), ("a", 2), ("b", 5)]
    outbox = box.outbox
    assert outbox.held_bytes == {"a": 200, "b": 200}
    assert [m.msg_id for m in outbox.waiting] == [3] and len(outbox.waiting) == 1
    assert box.admit() == []  # 200 + 100 > 250
    assert not outbox.release(99) and outbox.release(4)  # b's take frees none of a's cap
    assert box.admit() == []
    assert outbox.release(1) and box.admit() == [("a", 3)]
    assert outbox.held_bytes == {"a": 200, "b": 100} and outbox.held_messages == 3
    assert outbox.started_messages == {"a": 3, "b": 2}


def test_a_message_over_its_jobs_cap_starts_when_the_job_holds_nothing() -> None:
    box = Box({"a": JobPolicy(max_inflight_bytes=50)})
    box.add("a", 100, count=2)
    assert box.admit() == [("a", 1)]
    assert box.admit() == []
    box.outbox.release(1)
    assert box.admit() == [("a", 2)]


def test_credit_is_shared_by_weight() -> None:
    box = Box({"a": JobPolicy(weight=3.0), "b": JobPolicy()}, granted_bytes=800)
    box.add("b", count=20)
    box.add("a", count=20)
    started = box.admit()
    assert [job for job, _ in started] == ["b", "a", "a", "a", "b", "a", "a", "a"]
    box.outbox.grant(1600)
    assert [job for job, _ in box.admit()].count("a") == 6


def test_critical_goes_first_across_jobs_and_within_its_job() -> None:
    box = Box({}, granted_bytes=250)  # no policies: JobPolicy() for every job
    box.add("a", count=3)  # 1, 2, 3
    box.add("b", critical=True)  # 4
    box.add("a", critical=True)  # 5: in front of its job's bulk
    assert box.admit() == [("a", 5), ("b", 4)]  # the tie goes to the job seen first
    box.outbox.grant(450)
    assert box.admit() == [("a", 1), ("a", 2)]


def test_a_job_that_comes_back_from_idle_starts_level_with_the_others() -> None:
    box = Box({}, granted_bytes=1000)
    box.add("a", count=20)
    assert len(box.admit()) == 10  # a alone: all the credit
    box.add("b", count=10)
    box.outbox.grant(1600)
    # b starts level with a (no catching up for the time it was away): in turn
    assert [job for job, _ in box.admit()] == ["b", "a"] * 3


def test_a_restart_releases_every_job_and_a_deadline_removes_a_capped_message() -> None:
    box = Box({"a": JobPolicy(max_inflight_bytes=100)})
    box.add("a", count=2)
    assert box.admit() == [("a", 1)]
    (waiting,) = box.outbox.waiting
    assert waiting in box.outbox.waiting
    box.outbox.waiting.remove(waiting)
    assert waiting not in box.outbox.waiting and not box.outbox.waiting
    box.outbox.reset()
    assert box.outbox.held_bytes == {} and box.outbox.held_messages == 0
