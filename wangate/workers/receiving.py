"""The receiving coordinator's stripes: into the message's delivery segment, each
message delivered once, in the order it completed (proto/workers.md, "Stripes").

A worker that received a stripe (verified by its session) says so (``arrived``); the
coordinator places it: it makes the message's segment at its first stripe and hands
the worker that segment's descriptor and the stripe's offset in it (``place``); the
worker writes the stripe there and says so (``placed``). The coordinator never copies
a payload byte: it only accounts stripes and combines their CRCs. One worker at a time
may place a given stripe, and none once it is placed, so nothing writes into a segment
after it is delivered. A new stripe that does not complete its message is confirmed
once placed (the worker tells its peer: its credit is free); the one that completes it
is confirmed when a trainer takes the message, so the sender's ``wait`` means what it
means without workers.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from wangate.delivery.delivered import Delivery
from wangate.delivery.trainers import TrainerDelivery
from wangate.errors import RemoteProtocolError
from wangate.shm import new_segment
from wangate.workers.pool import WorkerHandle
from wangate.workers.stripes import Added, StripeDescriptor, StripeReassembly, stripe_crc

log = logging.getLogger("wangate.workers")

STRIPE_NAME = "wangate-stripe"

# the worker and process generation that delivered a completing stripe, its id there,
# its body's bytes and its arrival there: what to confirm once a trainer takes the message
Held = tuple[WorkerHandle, int, int, int, int]


@dataclass
class _In:
    """A message being assembled from stripes."""

    buffer: bytearray | memoryview
    tag: str
    step: int
    critical: bool
    meta: bytes
    fd: int  # the buffer's segment, which workers write the stripes into
    payload_offset: int  # of the buffer (the payload) in that segment
    own_fd: bool  # not the delivery's: closed when the message is done
    job: str


@dataclass
class _Placing:
    """A stripe a worker was told to place, not placed yet."""

    key: Hashable
    descriptor: StripeDescriptor
    length: int
    crc: int
    fields: dict[str, Any]
    generation: int


def take(handle: WorkerHandle, generation: int, peer: str, fields: dict[str, Any]) -> None:
    """Tell the worker its stripe was taken: its credit is free, the sender learns it."""
    if handle.generation == generation:  # a restarted worker's session never had it
        handle.send(
            "taken",
            {
                "peer": peer,
                "msg_id": fields["msg_id"],
                "body_bytes": fields["body_bytes"],
                "seq": fields["seq"],
            },
        )


def _taken(held: Held) -> dict[str, Any]:
    return {"msg_id": held[2], "body_bytes": held[3], "seq": held[4]}


class StripeReceiver:
    def __init__(
        self,
        delivery: TrainerDelivery,
        max_message_bytes: int,
        is_peer: Callable[[str], bool],
    ) -> None:
        self._delivery = delivery
        self._segments = delivery.segments
        self._max_message_bytes = max_message_bytes
        self._is_peer = is_peer
        self._reassembly: StripeReassembly[_In] = StripeReassembly()
        self._held: dict[tuple[str, int], Held] = {}  # delivered, not taken yet
        # stripes being placed: by (worker, its arrival seq), and by (message, offset)
        self._placing: dict[tuple[int, int], _Placing] = {}
        self._placing_at: dict[tuple[Hashable, int], tuple[int, int]] = {}
        # duplicates that came while another worker placed the stripe
        self._standby: dict[tuple[Hashable, int], list[tuple[WorkerHandle, int, Any]]] = {}

    @property
    def held_count(self) -> int:
        return len(self._held)

    def arrived(self, handle: WorkerHandle, fields: dict[str, Any]) -> None:
        """A worker holds a stripe it received: tell it where to place it, or that it
        is not needed (a duplicate, the peer's error)."""
        peer, length = fields["peer"], fields["length"]
        try:
            if not self._is_peer(peer):
                raise RemoteProtocolError(f"a stripe from {peer!r}, which is not a peer")
            descriptor, meta = StripeDescriptor.decode(fields["meta"], length)
            if descriptor.total > self._max_message_bytes:
                raise RemoteProtocolError(
                    f"a stripe of a message of {descriptor.total} bytes, over "
                    f"limits.max_message_bytes ({self._max_message_bytes})"
                )
            key = (peer, descriptor.instance, descriptor.msg_id)
            new_message = self._reassembly.is_new(key)
            duplicate = self._reassembly.check(key, descriptor, length)
        except RemoteProtocolError as exc:
            log.warning("worker %d: dropped a stripe from %s: %s", handle.index, peer, exc)
            take(handle, handle.generation, peer, fields)
            return
        if duplicate:
            take(handle, handle.generation, peer, fields)
            return
        if (key, descriptor.offset) in self._placing_at:
            # another worker places it; this copy stands by in case that worker exits
            standby = self._standby.setdefault((key, descriptor.offset), [])
            standby.append((handle, handle.generation, fields))
            return
        if new_message:
            try:
                assembly = self._new_assembly(descriptor.total, fields, meta)
            except OSError as exc:  # out of descriptors or memory: this message is lost
                log.error("no segment for a message from %s: %s; dropped", peer, exc)
                self._reassembly.drop(key)
                take(handle, handle.generation, peer, fields)
                return
            self._reassembly.open(key, descriptor.total, assembly, time.monotonic())
        else:
            assembly = self._reassembly.context(key)
        crc = stripe_crc(fields["checksum"], zlib.crc32(fields["meta"]), length)
        placing = (handle.index, fields["seq"])
        self._placing[placing] = _Placing(key, descriptor, length, crc, fields, handle.generation)
        self._placing_at[(key, descriptor.offset)] = placing
        handle.send(
            "place",
            {"seq": fields["seq"], "offset": assembly.payload_offset + descriptor.offset},
            [os.dup(assembly.fd)],
        )

    def _new_assembly(self, total: int, fields: dict[str, Any], meta: bytes) -> _In:
        # no reuse (job None): a worker maps the segment writable, which a seal once
        # handed would refuse
        buffer = self._segments.allocate(total, 0, None)
        fd = self._segments.descriptor(buffer)
        own = fd is None  # small, or too many segments alive: one only for assembly
        if fd is None:
            fd, mapping = new_segment(total, STRIPE_NAME)
            buffer, offset = memoryview(mapping)[:total], 0
        else:
            offset = memoryview(memoryview(buffer).obj).nbytes - len(buffer)  # payload ends it
        return _In(
            buffer,
            fields["tag"],
            fields["step"],
            fields["critical"],
            meta,
            fd,
            offset,
            own,
            fields["job"],
        )

    def placed(self, handle: WorkerHandle, seq: int) -> None:
        """The worker wrote the stripe it numbered ``seq`` into the message's segment."""
        placing = self._placing.pop((handle.index, seq), None)
        if placing is None or placing.generation != handle.generation:
            return
        key, descriptor, length = placing.key, placing.descriptor, placing.length
        peer = placing.fields["peer"]
        self._placing_at.pop((key, descriptor.offset), None)
        for other, generation, other_fields in self._standby.pop((key, descriptor.offset), []):
            take(other, generation, peer, other_fields)  # not needed any more
        fields = placing.fields
        if key not in self._reassembly:  # dropped meanwhile (idle)
            take(handle, handle.generation, peer, fields)
            return
        context = self._reassembly.context(key)
        try:
            now = time.monotonic()
            added = self._reassembly.add(key, descriptor, length, placing.crc, context, now)
        except RemoteProtocolError as exc:
            log.warning("worker %d: dropped a stripe from %s: %s", handle.index, peer, exc)
            added = Added.DUPLICATE
        if added is not Added.COMPLETE:
            take(handle, handle.generation, peer, fields)
            return
        meta_crc = zlib.crc32(context.meta)
        assembly, crc = self._reassembly.finish(key, meta_crc)
        if assembly.own_fd:
            os.close(assembly.fd)
        if crc != descriptor.checksum:
            log.warning(
                "message %d from %s: checksum %08x, sender declared %08x; dropped",
                descriptor.msg_id,
                peer,
                crc,
                descriptor.checksum,
            )
            self._segments.free(assembly.buffer)
            take(handle, handle.generation, peer, fields)
            return
        delivery = Delivery(
            source=peer,
            tag=assembly.tag,
            step=assembly.step,
            critical=assembly.critical,
            meta=assembly.meta,
            payload=assembly.buffer,
            checksum=descriptor.checksum,
            msg_id=descriptor.msg_id,
            job=assembly.job,
        )
        held = (handle, handle.generation, fields["msg_id"], fields["body_bytes"], fields["seq"])
        previous = self._held.pop((peer, descriptor.msg_id), None)
        if previous is not None:  # the peer restarted: its ids began again
            take(previous[0], previous[1], peer, _taken(previous))
        self._held[(peer, descriptor.msg_id)] = held
        self._delivery.arrived(delivery)  # in the order messages complete

    def worker_gone(self, handle: WorkerHandle) -> None:
        """What a worker that exited was placing: others may place it now (its
        peer sends it again)."""
        for placing in [p for p in self._placing if p[0] == handle.index]:
            entry = self._placing.pop(placing)
            at = (entry.key, entry.descriptor.offset)
            self._placing_at.pop(at, None)
            for other, generation, fields in self._standby.pop(at, []):
                if other.generation == generation and other is not handle:
                    self.arrived(other, fields)  # the first still there places it, or stands by

    def drop_idle(self, now: float, idle_s: float) -> None:
        """Drop partial messages that got no new stripe for ``idle_s``."""
        for key in self._reassembly.idle(now, idle_s):
            assembly = self._reassembly.drop(key)
            if assembly is not None:
                log.warning("a partial message (%s) got nothing for %g s: dropped", key, idle_s)
                self._segments.free(assembly.buffer)
                if assembly.own_fd:
                    os.close(assembly.fd)

    def taken(self, delivery: Delivery) -> None:
        """A trainer took ``delivery``: confirm the stripe that completed it."""
        held = self._held.pop((delivery.source, delivery.msg_id), None)
        if held is not None:
            take(held[0], held[1], delivery.source, _taken(held))
