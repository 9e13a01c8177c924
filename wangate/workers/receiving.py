"""The receiving coordinator's stripes: into the message's delivery segment, each
message delivered once, in the order it completed (proto/workers.md, "Stripes").

A stripe arrives from a worker in the segment its session assembled it in; it is
copied once into the delivery segment at its offset. A new stripe that does not
complete its message is confirmed at once (the worker tells its peer: its credit is
free); the one that completes it is confirmed when a trainer takes the message, so the
sender's ``wait`` means what it means without workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wangate.errors import RemoteProtocolError
from wangate.localapi.inbox import Inbox
from wangate.localapi.segments import InboundSegments, SegmentError, map_segment
from wangate.service import Delivery
from wangate.workers.pool import WorkerHandle
from wangate.workers.stripes import Added, StripeDescriptor, StripeReassembly, stripe_crc

log = logging.getLogger("wangate.workers")

# the worker and process generation that delivered a completing stripe, its id there
# and its body's bytes: what to confirm once a trainer takes the message
Held = tuple[WorkerHandle, int, int, int]


@dataclass
class _In:
    """A message being assembled from stripes."""

    buffer: bytearray | memoryview
    tag: str
    step: int
    critical: bool
    meta: bytes


def take(handle: WorkerHandle, generation: int, peer: str, fields: dict[str, Any]) -> None:
    """Tell the worker its stripe was taken: its credit is free, the sender learns it."""
    if handle.generation == generation:  # a restarted worker's session never had it
        handle.send(
            "taken",
            {"peer": peer, "msg_id": fields["msg_id"], "body_bytes": fields["body_bytes"]},
        )


def _taken(held: Held) -> dict[str, Any]:
    return {"msg_id": held[2], "body_bytes": held[3]}


class StripeReceiver:
    def __init__(
        self,
        inbox: Inbox,
        segments: InboundSegments,
        max_message_bytes: int,
        is_peer: Callable[[str], bool],
    ) -> None:
        self._inbox = inbox
        self._segments = segments
        self._max_message_bytes = max_message_bytes
        self._is_peer = is_peer
        self._reassembly: StripeReassembly[_In] = StripeReassembly()
        self._held: dict[tuple[str, int], Held] = {}  # delivered, not taken yet
        self._refused: dict[str, deque[Delivery]] = {}
        self._redelivery: dict[str, asyncio.Task[None]] = {}
        self.copied_bytes = 0  # stripe bytes copied into delivery segments

    @property
    def held_count(self) -> int:
        return len(self._held)

    def received(self, handle: WorkerHandle, fields: dict[str, Any], fd: int) -> None:
        """A stripe a worker received, in the segment ``fd`` (now ours to close)."""
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
            source = map_segment(fd, fields["offset"], length)
        except (RemoteProtocolError, SegmentError) as exc:
            log.warning("worker %d: dropped a message from %s: %s", handle.index, peer, exc)
            take(handle, handle.generation, fields["peer"], fields)
            return
        finally:
            os.close(fd)
        key = (peer, descriptor.instance, descriptor.msg_id)
        if self._reassembly.is_new(key):
            assembly = _In(
                self._segments.allocate(descriptor.total, 0),
                fields["tag"],
                fields["step"],
                fields["critical"],
                meta,
            )
        else:
            assembly = self._reassembly.context(key)
        crc = stripe_crc(fields["checksum"], zlib.crc32(fields["meta"]), length)
        try:
            added = self._reassembly.add(key, descriptor, length, crc, assembly, time.monotonic())
        except RemoteProtocolError as exc:
            log.warning("worker %d: dropped a stripe from %s: %s", handle.index, peer, exc)
            added = Added.DUPLICATE
        if added is Added.DUPLICATE:
            take(handle, handle.generation, peer, fields)
            return
        assembly.buffer[descriptor.offset : descriptor.offset + length] = source
        self.copied_bytes += length
        del source
        if added is Added.PARTIAL:
            take(handle, handle.generation, peer, fields)
            return
        assembly, crc = self._reassembly.finish(key, zlib.crc32(assembly.meta))
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
        )
        held = (handle, handle.generation, fields["msg_id"], fields["body_bytes"])
        previous = self._held.pop((peer, descriptor.msg_id), None)
        if previous is not None:  # the peer restarted: its ids began again
            take(previous[0], previous[1], peer, _taken(previous))
        self._held[(peer, descriptor.msg_id)] = held
        self._deliver(delivery)

    def drop_idle(self, now: float, idle_s: float) -> None:
        """Drop partial messages that got no new stripe for ``idle_s``."""
        for key in self._reassembly.idle(now, idle_s):
            assembly = self._reassembly.drop(key)
            if assembly is not None:
                log.warning("a partial message (%s) got nothing for %g s: dropped", key, idle_s)
                self._segments.free(assembly.buffer)

    def _deliver(self, delivery: Delivery) -> None:
        source = delivery.source
        refused = self._refused.setdefault(source, deque())
        if refused or not self._inbox.try_deliver(delivery):
            refused.append(delivery)
            if source not in self._redelivery:
                task = asyncio.get_running_loop().create_task(self._redeliver(source))
                self._redelivery[source] = task

    async def _redeliver(self, source: str) -> None:
        refused = self._refused[source]
        try:
            while refused:
                await self._inbox.deliver(refused[0])
                refused.popleft()
        finally:
            self._redelivery.pop(source, None)

    def taken(self, delivery: Delivery) -> None:
        """A trainer took ``delivery``: confirm the stripe that completed it."""
        held = self._held.pop((delivery.source, delivery.msg_id), None)
        if held is not None:
            take(held[0], held[1], delivery.source, _taken(held))

    def close(self) -> None:
        for task in self._redelivery.values():
            task.cancel()
