"""The receiving coordinator's stripes (wangate.workers.receiving): workers place
stripes straight into the message's segment; one worker at a time per stripe, none
after the message is whole. Real segments and descriptors; the workers are stand-ins
that record the control packets they are sent and write what they are told to."""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np

from wangate.delivery.trainers import TrainerDelivery
from wangate.workers.receiving import StripeReceiver
from wangate.workers.stripes import STRIPE_BYTES, StripeDescriptor

MiB = 1 << 20
META = b"tensor"


class Worker:
    """What the receiver sends a worker, and the writes a worker makes."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.generation = 1
        self.sent: list[tuple[str, dict[str, Any], list[int]]] = []

    def send(self, kind: str, fields: dict[str, Any], fds: list[int] | None = None) -> None:
        self.sent.append((kind, fields, fds or []))

    def place(self, data: bytes) -> int:
        """Do the one ``place`` it was sent: write ``data`` there; its seq."""
        places = [p for p in self.sent if p[0] == "place"]
        assert len(places) == 1, self.sent
        self.sent.remove(places[0])
        _, fields, (fd,) = places[0]
        assert os.pwrite(fd, data, fields["offset"]) == len(data)
        os.close(fd)
        return int(fields["seq"])

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.sent]


def stripe_fields(
    payload: bytes, offset: int, length: int, msg_id: int, seq: int, job: str = "default"
) -> dict[str, Any]:
    descriptor = StripeDescriptor(77, 5, offset, len(payload), zlib.crc32(META + payload))
    meta = descriptor.encode(META)
    part = payload[offset : offset + length]
    return {
        "peer": "bj", "msg_id": msg_id, "body_bytes": length + 100, "tag": "grad", "step": 3,
        "critical": False, "meta": meta, "checksum": zlib.crc32(meta + part), "length": length,
        "seq": seq, "job": job,
    }  # fmt: skip


def test_stripes_are_placed_once_each_and_a_standby_copy_takes_over_from_a_worker_gone() -> None:
    payload = np.random.default_rng(1).bytes(STRIPE_BYTES + 2 * MiB)
    first = (0, STRIPE_BYTES)
    second = (STRIPE_BYTES, 2 * MiB)
    delivery_layer = TrainerDelivery(1 << 30)
    inbox, segments = delivery_layer.inbox, delivery_layer.segments
    receiver = StripeReceiver(delivery_layer, 1 << 30, lambda peer: peer == "bj")
    a, b = Worker(1), Worker(2)

    receiver.arrived(a, stripe_fields(payload, *first, msg_id=11, seq=1))  # type: ignore[arg-type]
    receiver.placed(a, a.place(payload[: first[1]]))  # type: ignore[arg-type]
    taken = {"peer": "bj", "msg_id": 11, "body_bytes": first[1] + 100, "seq": 1}
    assert a.sent == [("taken", taken, [])]
    a.sent.clear()

    # b places the second stripe; a copy of it at a stands by meanwhile (no packet)
    receiver.arrived(b, stripe_fields(payload, *second, msg_id=21, seq=1))  # type: ignore[arg-type]
    receiver.arrived(a, stripe_fields(payload, *second, msg_id=12, seq=2))  # type: ignore[arg-type]
    assert b.kinds() == ["place"] and a.kinds() == []
    b.generation += 1  # b exited before it placed it: a places its copy
    receiver.worker_gone(b)  # type: ignore[arg-type]
    for _, _, fds in b.sent:  # what went to the process that exited
        os.close(*fds)
    b.sent.clear()
    assert a.kinds() == ["place"]
    receiver.placed(a, a.place(payload[STRIPE_BYTES:]))  # type: ignore[arg-type]
    assert a.sent == []  # the completing stripe is confirmed when a trainer takes it

    delivery = inbox.mailbox.take("grad", "bj", 3)
    assert delivery is not None and (delivery.msg_id, delivery.meta) == (5, META)
    assert bytes(delivery.payload) == payload  # written by the workers, never copied here
    assert segments.made == 1
    # a late copy of a stripe of a message already whole is not placed: confirmed at once
    receiver.arrived(b, stripe_fields(payload, *first, msg_id=31, seq=2))  # type: ignore[arg-type]
    taken = {"peer": "bj", "msg_id": 31, "body_bytes": first[1] + 100, "seq": 2}
    assert b.sent == [("taken", taken, [])]
    receiver.taken(delivery)
    taken = {"peer": "bj", "msg_id": 12, "body_bytes": 2 * MiB + 100, "seq": 2}
    assert a.sent == [("taken", taken, [])]


def test_a_stripe_whose_bytes_do_not_make_the_declared_checksum_is_not_delivered() -> None:
    payload = np.random.default_rng(2).bytes(2 * MiB)
    delivery_layer = TrainerDelivery(1 << 30)
    inbox = delivery_layer.inbox
    receiver = StripeReceiver(delivery_layer, 1 << 30, lambda peer: peer == "bj")
    a = Worker(1)
    fields = stripe_fields(payload, 0, len(payload), msg_id=1, seq=1)
    fields["checksum"] ^= 1  # what the worker's session verified is not what was declared
    receiver.arrived(a, fields)  # type: ignore[arg-type]
    receiver.placed(a, a.place(payload))  # type: ignore[arg-type]
    assert a.kinds() == ["taken"]
    assert inbox.mailbox.take("grad", "bj", 3) is None


def test_a_message_is_delivered_in_the_job_its_stripes_name() -> None:
    payload = np.random.default_rng(3).bytes(2 * MiB)
    delivery_layer = TrainerDelivery(1 << 30)
    inbox = delivery_layer.inbox
    receiver = StripeReceiver(delivery_layer, 1 << 30, lambda peer: peer == "bj")
    a = Worker(1)
    fields = stripe_fields(payload, 0, len(payload), msg_id=1, seq=1, job="llama-run3")
    receiver.arrived(a, fields)  # type: ignore[arg-type]
    receiver.placed(a, a.place(payload))  # type: ignore[arg-type]
    assert inbox.mailbox.take("grad", "bj", 3) is None  # not the default job's
    delivery = inbox.mailbox.take("grad", "bj", 3, "llama-run3")
    assert delivery is not None and delivery.job == "llama-run3"
    assert bytes(delivery.payload) == payload
    receiver.taken(delivery)
    assert a.kinds() == ["taken"]
