"""The inbox's matching and budget rules (pure), and its asyncio shell."""

from __future__ import annotations

import asyncio

import pytest

from wangate.delivery.delivered import Delivery
from wangate.delivery.inbox import Inbox
from wangate.delivery.mailbox import HandedToWaiter, Mailbox, Queued, Refused
from wangate.errors import PeerUnreachable, RecvTimeout, WangateError


def delivery(
    source: str, tag: str, step: int, size: int = 10, meta: bytes = b"", job: str = "default"
) -> Delivery:
    return Delivery(source, tag, step, False, meta, bytes([step % 256]) * size, 0, job=job)


def test_take_matches_tag_source_step_oldest_first() -> None:
    box = Mailbox(1000)
    a = delivery("bj", "g", 1)
    b = delivery("sh", "g", 1)
    c = delivery("bj", "g", 2)
    d = delivery("bj", "h", 1)
    for item in (a, b, c, d):
        assert box.offer(item) == Queued()
    assert box.take("x") is None
    assert box.take("g", source="gz") is None
    assert box.take("g", step=3) is None
    assert box.take("g", step=2) is c
    assert box.take("g", source="sh") is b
    assert box.take("g") is a
    assert box.take("g") is None
    assert box.take("h", source="bj", step=1) is d
    assert box.queued_count() == 0


def test_budget_counts_payload_and_meta_per_source() -> None:
    box = Mailbox(100)
    assert box.offer(delivery("bj", "g", 1, size=60, meta=b"m" * 4)) == Queued()
    assert box.queued_bytes("bj") == 64
    assert box.offer(delivery("bj", "g", 2, size=36)) == Queued()  # exactly 100
    assert box.offer(delivery("bj", "g", 3, size=1)) == Refused(("bj", "default"), 100, 100)
    assert box.offer(delivery("sh", "g", 1, size=100)) == Queued()  # other source unaffected
    assert box.queued_bytes("sh") == 100
    taken = box.take("g", source="bj")
    assert taken is not None and taken.step == 1
    assert box.queued_bytes("bj") == 36
    assert box.offer(delivery("bj", "g", 3, size=64)) == Queued()
    assert box.queued_bytes("bj") == 100


def test_empty_inbox_admits_one_message_over_budget() -> None:
    box = Mailbox(10)
    assert box.offer(delivery("bj", "g", 1, size=50)) == Queued()
    assert box.offer(delivery("bj", "g", 2, size=1)) == Refused(("bj", "default"), 50, 10)
    assert box.take("g") is not None
    assert box.queued_bytes("bj") == 0


def test_waiters_are_served_in_registration_order_by_pattern() -> None:
    box = Mailbox(100)
    w_any = box.register("g")
    w_sh = box.register("g", source="sh")
    w_step = box.register("g", step=5)
    first = delivery("sh", "g", 5)
    assert box.offer(first) == HandedToWaiter(w_any, first)
    second = delivery("sh", "g", 5)
    assert box.offer(second) == HandedToWaiter(w_sh, second)
    other_step = delivery("bj", "g", 4)
    assert box.offer(other_step) == Queued()
    third = delivery("bj", "g", 5)
    assert box.offer(third) == HandedToWaiter(w_step, third)
    assert box.waiter_count() == 0
    assert box.queued_bytes("sh") == 0  # handed over, never counted


def test_full_inbox_still_hands_to_a_waiter() -> None:
    box = Mailbox(10)
    assert box.offer(delivery("bj", "g", 1, size=10)) == Queued()
    waiter = box.register("h")
    item = delivery("bj", "h", 2, size=10)
    assert box.offer(item) == HandedToWaiter(waiter, item)


def test_cancelled_waiter_gets_nothing() -> None:
    box = Mailbox(100)
    waiter = box.register("g")
    assert box.cancel(waiter) is True
    assert box.cancel(waiter) is False
    assert box.offer(delivery("bj", "g", 1)) == Queued()


def test_put_back_goes_to_next_waiter_or_becomes_oldest() -> None:
    box = Mailbox(10)
    older = delivery("bj", "g", 1, size=10)
    assert box.offer(older) == Queued()
    returned = delivery("bj", "g", 0, size=10)
    assert box.put_back(returned) == Queued()  # admitted before: budget not checked
    assert box.queued_bytes("bj") == 20
    assert box.take("g") is returned
    assert box.take("g") is older
    waiter = box.register("g")
    assert box.put_back(returned) == HandedToWaiter(waiter, returned)


# ------------------------------------------------------------------ jobs


def test_a_job_sees_only_its_own_messages() -> None:
    box = Mailbox(1000)
    plain = delivery("bj", "g", 1)
    run3 = delivery("bj", "g", 1, job="llama-run3")
    other = delivery("sh", "g", 2, job="eval")
    for item in (plain, run3, other):
        assert box.offer(item) == Queued()
    assert box.take("g", step=2) is None  # eval's, not default's
    assert box.take("g", "sh", 2, "llama-run3") is None
    assert box.take("g", "bj", 1, "llama-run3") is run3
    assert box.take("g", None, None, "llama-run3") is None
    assert box.take("g", job="eval") is other
    assert box.take("g") is plain  # the default job when none is named
    assert box.take("g") is None and box.queued_count() == 0


def test_waiters_match_their_job_only() -> None:
    box = Mailbox(1000)
    w_run3 = box.register("g", None, None, "llama-run3")
    w_plain = box.register("g")
    assert box.waiters() == [
        (w_run3, "g", None, None, "llama-run3"),
        (w_plain, "g", None, None, "default"),
    ]
    plain = delivery("bj", "g", 1)
    assert box.offer(plain) == HandedToWaiter(w_plain, plain)  # older waiter, other job
    evaluation = delivery("bj", "g", 1, job="eval")
    assert box.offer(evaluation) == Queued()  # nobody of eval waits
    run3 = delivery("bj", "g", 1, job="llama-run3")
    assert box.offer(run3) == HandedToWaiter(w_run3, run3)
    # put back: to the next waiter of the same job, else first of its job in line
    w_eval = box.register("g", job="eval")
    assert box.put_back(run3) == Queued()  # eval's waiter does not take run3's
    assert box.take("g", job="llama-run3") is run3
    assert box.waiters() == [(w_eval, "g", None, None, "eval")]
    assert box.put_back(evaluation) == HandedToWaiter(w_eval, evaluation)


def test_sources_of_a_tag_are_per_job() -> None:
    box = Mailbox(1000)
    box.offer(delivery("bj", "g", 1, job="llama-run3"))
    box.offer(delivery("sh", "g", 1))
    assert box.sources_of("g", "llama-run3") == frozenset({"bj"})
    assert box.sources_of("g") == frozenset({"sh"})
    assert box.sources_of("g", "eval") == frozenset()


def test_a_jobs_full_budget_refuses_only_that_job() -> None:
    box = Mailbox(100)
    assert box.offer(delivery("bj", "g", 1, size=100, job="llama-run3")) == Queued()
    refused = box.offer(delivery("bj", "g", 2, size=1, job="llama-run3"))
    assert refused == Refused(("bj", "llama-run3"), 100, 100)
    # the same source's messages of another job have a budget of their own
    assert box.offer(delivery("bj", "g", 2, size=100)) == Queued()
    assert box.offer(delivery("bj", "g", 3, size=60, job="eval")) == Queued()
    assert box.offer(delivery("bj", "g", 4, size=40, job="eval")) == Queued()  # exactly 100
    refused = box.offer(delivery("bj", "g", 5, size=1, job="eval"))
    assert refused == Refused(("bj", "eval"), 100, 100)
    assert box.queued_bytes("bj", "llama-run3") == 100
    assert box.queued_bytes("bj") == 100
    assert box.queued_bytes("bj", "eval") == 100
    assert box.queued_bytes("sh", "eval") == 0
    assert box.job_counts() == {"llama-run3": (1, 100), "default": (1, 100), "eval": (2, 100)}
    # a take frees space in its own box only
    taken = box.take("g", job="llama-run3")
    assert taken is not None and taken.step == 1
    assert box.queued_bytes("bj", "llama-run3") == 0
    assert box.offer(delivery("bj", "g", 6, size=1)) == Refused(("bj", "default"), 100, 100)
    assert box.offer(delivery("bj", "g", 6, size=100, job="llama-run3")) == Queued()


def test_an_empty_box_admits_one_message_over_budget_whatever_the_others_hold() -> None:
    box = Mailbox(10)
    assert box.offer(delivery("bj", "g", 1, size=50)) == Queued()
    assert box.offer(delivery("bj", "g", 2, size=50, job="eval")) == Queued()
    assert box.offer(delivery("bj", "g", 3, size=1, job="eval")) == Refused(("bj", "eval"), 50, 10)


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Mailbox(0)


# ------------------------------------------------------------------ asyncio shell


def test_inbox_receive_waits_and_times_out() -> None:
    async def scenario() -> None:
        inbox = Inbox(100)
        waiting = asyncio.create_task(inbox.receive("g", "bj", None, 5.0))
        await asyncio.sleep(0)
        item = delivery("bj", "g", 3)
        assert inbox.try_deliver(item) is True
        assert await waiting is item
        with pytest.raises(RecvTimeout) as info:
            await inbox.receive("g", None, 4, 0.01)
        assert info.value.code == "timeout"
        assert inbox.mailbox.waiter_count() == 0

    asyncio.run(scenario())


def test_inbox_deliver_waits_for_space_until_a_take() -> None:
    async def scenario() -> None:
        inbox = Inbox(10)
        await inbox.deliver(delivery("bj", "g", 1, size=10))
        second = asyncio.create_task(inbox.deliver(delivery("bj", "g", 2, size=10)))
        for _ in range(5):  # turns of the loop: nothing but a take can make room
            await asyncio.sleep(0)
        assert not second.done()
        assert inbox.try_deliver(delivery("bj", "g", 3, size=10)) is False
        first = await inbox.receive("g", None, None, 0)
        assert first.step == 1
        await asyncio.wait_for(second, 1.0)
        assert (await inbox.receive("g", None, None, 0)).step == 2

    asyncio.run(scenario())


def test_inbox_backpressure_holds_back_only_the_full_job() -> None:
    async def scenario() -> None:
        inbox = Inbox(10)
        await inbox.deliver(delivery("bj", "g", 1, size=10, job="llama-run3"))
        held = asyncio.create_task(inbox.deliver(delivery("bj", "g", 2, size=10, job="llama-run3")))
        await asyncio.sleep(0)
        assert not held.done()
        # the default job's message from the same source goes in meanwhile
        await asyncio.wait_for(inbox.deliver(delivery("bj", "g", 3, size=10)), 1.0)
        assert (await inbox.receive("g", "bj", None, 0)).step == 3
        for _ in range(5):  # a take of another job makes no room for this one
            await asyncio.sleep(0)
        assert not held.done()
        with pytest.raises(RecvTimeout):
            await inbox.receive("g", "bj", 1, 0)  # default's recv does not see run3's
        first = await inbox.receive("g", "bj", None, 0, job="llama-run3")
        assert (first.step, first.job) == (1, "llama-run3")
        await asyncio.wait_for(held, 1.0)
        assert inbox.take("g", "bj", 2, "llama-run3") is not None

    asyncio.run(scenario())


def test_inbox_space_is_awaited_per_source_and_job() -> None:
    async def scenario() -> None:
        inbox = Inbox(10)
        assert inbox.try_deliver(delivery("bj", "g", 1, size=10, job="eval"))
        assert inbox.try_deliver(delivery("bj", "g", 2, size=10))
        assert not inbox.try_deliver(delivery("bj", "g", 3, size=1, job="eval"))
        eval_space = asyncio.create_task(inbox.wait_for_space(("bj", "eval")))
        default_space = asyncio.create_task(inbox.wait_for_space(("bj", "default")))
        await asyncio.sleep(0)
        assert inbox.take("g", "bj", None, "eval") is not None
        await asyncio.wait_for(eval_space, 1.0)
        await asyncio.sleep(0)
        assert not default_space.done()
        assert inbox.take("g", "bj", None) is not None
        await asyncio.wait_for(default_space, 1.0)

    asyncio.run(scenario())


def test_a_hopeless_recv_is_asked_about_its_job() -> None:
    asked: list[tuple[str, str | None, str]] = []

    def hopeless(tag: str, source: str | None, job: str) -> WangateError | None:
        asked.append((tag, source, job))
        return PeerUnreachable(f"peer {source} is unreachable") if job == "eval" else None

    async def scenario() -> None:
        inbox = Inbox(100)
        with pytest.raises(PeerUnreachable):
            await inbox.receive("g", "sh", None, 1.0, hopeless, job="eval")
        waiting = asyncio.create_task(inbox.receive("g", "sh", None, 5.0, hopeless, "llama-run3"))
        plain = asyncio.create_task(inbox.receive("g", "sh", None, 5.0, hopeless))
        await asyncio.sleep(0)

        # the peer is gone for run3's recvs only: the default job's recv waits on
        def gone(tag: str, source: str | None, job: str) -> WangateError | None:
            return PeerUnreachable(f"peer {source} is unreachable") if job == "llama-run3" else None

        assert inbox.fail_waiters(gone) == 1
        with pytest.raises(PeerUnreachable):
            await waiting
        item = delivery("sh", "g", 1)
        assert inbox.try_deliver(item)
        assert await plain is item

    asyncio.run(scenario())
    assert asked == [("g", "sh", "eval"), ("g", "sh", "llama-run3"), ("g", "sh", "default")]


def test_inbox_delivery_to_a_cancelled_receiver_is_not_lost() -> None:
    async def scenario() -> None:
        inbox = Inbox(100)
        # Cancelled before the delivery arrives: the delivery is queued instead.
        gone = asyncio.create_task(inbox.receive("g", None, None, None))
        await asyncio.sleep(0)
        gone.cancel()
        item = delivery("bj", "g", 1)
        assert inbox.try_deliver(item) is True
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert await inbox.receive("g", None, None, 0) is item
        # Handed over, then cancelled before the receiver ran: the delivery is put back.
        late = asyncio.create_task(inbox.receive("g", None, None, None))
        await asyncio.sleep(0)
        item2 = delivery("bj", "g", 2)
        assert inbox.try_deliver(item2) is True
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert await inbox.receive("g", None, None, 0) is item2

    asyncio.run(scenario())
