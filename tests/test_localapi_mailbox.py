"""The inbox's matching and budget rules (pure), and its asyncio shell."""

from __future__ import annotations

import asyncio

import pytest

from wangate.delivery.delivered import Delivery
from wangate.delivery.inbox import Inbox
from wangate.delivery.mailbox import HandedToWaiter, Mailbox, Queued, Refused
from wangate.errors import RecvTimeout


def delivery(source: str, tag: str, step: int, size: int = 10, meta: bytes = b"") -> Delivery:
    return Delivery(source, tag, step, False, meta, bytes([step % 256]) * size, 0)


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
    assert box.offer(delivery("bj", "g", 3, size=1)) == Refused("bj", 100, 100)
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
    assert box.offer(delivery("bj", "g", 2, size=1)) == Refused("bj", 50, 10)
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
