"""Stripes: how a message is cut for the workers and put back together (pure).

With ``[workers] count >= 2`` the coordinator cuts each message into stripes of at most
``STRIPE_BYTES`` and hands each stripe to one worker, where it travels as an ordinary
message of that worker's session (proto/workers.md). The stripe's header carries the
original tag, step and critical flag; its meta starts with a ``StripeDescriptor``
(which message of which coordinator instance, where the stripe lies in it, the whole
message's checksum), followed by the original meta. The receiving coordinator puts the
stripes back with a ``StripeReassembly``: exact offsets, duplicates dropped, any order, and
each message complete exactly once.

No I/O and no clock here: the coordinator (wangate.workers.coordinator) is the shell.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from wangate.checksum import crc32_combine
from wangate.core.message import MessageHeader
from wangate.errors import RemoteProtocolError

# Measured (bench/workers.py): a few MiB keeps every worker busy on a large message and
# the coordinator's work per stripe (a copy, two control messages) under 1 % of the
# workers' per-datagram cost.
STRIPE_BYTES = 4 << 20
STRIPE_MAGIC = b"WGS1"
_DESCRIPTOR = struct.Struct("!4sQQQQI")  # magic, instance, message id, offset, total, CRC
DESCRIPTOR_BYTES = _DESCRIPTOR.size  # 40
MAX_DONE = 65536  # completed messages remembered, so a late duplicate is not delivered again


@dataclass(frozen=True)
class StripeDescriptor:
    """Where one stripe lies in which message (the start of the stripe's meta)."""

    instance: int  # the sending coordinator's instance id: message ids restart with it
    msg_id: int  # the sending coordinator's id of the whole message
    offset: int  # of the stripe's first payload byte in the message's payload
    total: int  # payload bytes of the whole message
    checksum: int  # the whole message's checksum (CRC-32 of meta then payload)

    def encode(self, meta: bytes) -> bytes:
        """The stripe's meta: this descriptor, then the message's own meta."""
        return (
            _DESCRIPTOR.pack(
                STRIPE_MAGIC, self.instance, self.msg_id, self.offset, self.total, self.checksum
            )
            + meta
        )

    @classmethod
    def decode(cls, stripe_meta: bytes, stripe_bytes: int) -> tuple[StripeDescriptor, bytes]:
        """The descriptor and the message's own meta; raises ``RemoteProtocolError``
        when ``stripe_meta`` does not start with one that fits ``stripe_bytes``."""
        if len(stripe_meta) < DESCRIPTOR_BYTES:
            raise RemoteProtocolError(
                f"stripe meta of {len(stripe_meta)} bytes is shorter than a stripe descriptor "
                f"({DESCRIPTOR_BYTES}): is the peer's [workers] count the same as ours?"
            )
        magic, instance, msg_id, offset, total, checksum = _DESCRIPTOR.unpack_from(stripe_meta)
        if magic != STRIPE_MAGIC:
            raise RemoteProtocolError(
                f"message is not a stripe (starts {bytes(magic)!r}, not {STRIPE_MAGIC!r}): "
                "is the peer's [workers] count the same as ours?"
            )
        if offset + stripe_bytes > total:
            raise RemoteProtocolError(
                f"stripe of {stripe_bytes} bytes at offset {offset} runs past the message's "
                f"{total} bytes"
            )
        return cls(instance, msg_id, offset, total, checksum), bytes(stripe_meta[DESCRIPTOR_BYTES:])


def refuse_stripes(header: MessageHeader) -> str | None:
    """For a gateway without workers: why a message whose meta is a stripe's must not
    reach a trainer (it is a part of a message, with the descriptor in front), or None."""
    meta = header.meta
    if len(meta) >= DESCRIPTOR_BYTES and meta[: len(STRIPE_MAGIC)] == STRIPE_MAGIC:
        return (
            "it is a stripe of a gateway with worker processes ([workers] count >= 2) and "
            "this gateway runs none: both sites of a pair must set the same [workers] count"
        )
    return None


def stripe_ranges(total: int, stripe_bytes: int = STRIPE_BYTES) -> list[tuple[int, int]]:
    """(offset, length) of each stripe of a payload of ``total`` bytes, in order.

    An empty payload is one empty stripe: it must still travel.
    """
    if stripe_bytes <= 0:
        raise ValueError("stripe_bytes must be positive")
    if total == 0:
        return [(0, 0)]
    return [(offset, min(stripe_bytes, total - offset)) for offset in range(0, total, stripe_bytes)]


def assign_workers(
    lengths: Sequence[int], queued_bytes: Mapping[int, int], workers: Sequence[int]
) -> list[int]:
    """The worker for each stripe: the one with the fewest bytes queued (lowest index on
    a tie), counting the stripes assigned before it."""
    if not workers:
        raise ValueError("no worker to assign stripes to")
    queued = {w: queued_bytes.get(w, 0) for w in workers}
    chosen = []
    for length in lengths:
        worker = min(workers, key=lambda w: (queued[w], w))
        queued[worker] += max(length, 1)
        chosen.append(worker)
    return chosen


class Added(Enum):
    DUPLICATE = "duplicate"  # this stripe (or its whole message) came before: drop it
    PARTIAL = "partial"  # new; the message still misses stripes
    COMPLETE = "complete"  # new, and the message is now whole


T = TypeVar("T")


@dataclass
class _Assembly(Generic[T]):
    total: int
    context: T
    stripes: dict[int, tuple[int, int]] = field(default_factory=dict)  # offset -> length, CRC
    received: int = 0
    last_at: float = 0.0  # when its last new stripe came


class StripeReassembly(Generic[T]):
    """Messages being put back together from stripes, keyed by ``(source, instance,
    msg_id)``; ``T`` is what the shell keeps with each (its buffer)."""

    def __init__(self, max_done: int = MAX_DONE) -> None:
        self._open: dict[Hashable, _Assembly[T]] = {}
        self._done: OrderedDict[Hashable, None] = OrderedDict()
        self._max_done = max_done

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, key: Hashable) -> bool:
        """Whether the message is being assembled (some stripe came, it is not done)."""
        return key in self._open

    def is_new(self, key: Hashable) -> bool:
        """Whether no stripe of this message came yet (the shell then makes its buffer)."""
        return key not in self._open and key not in self._done

    def add(
        self,
        key: Hashable,
        descriptor: StripeDescriptor,
        length: int,
        crc: int,
        context: T,
        now: float = 0.0,
    ) -> Added:
        """Account one stripe of ``length`` payload bytes whose CRC-32 is ``crc``.

        ``context`` is kept with a message's first stripe. Raises
        ``RemoteProtocolError`` for a stripe that contradicts earlier ones (another
        total, or overlapping another stripe without being it).
        """
        if self.check(key, descriptor, length):
            return Added.DUPLICATE
        assembly = self.open(key, descriptor.total, context, now)
        offset = descriptor.offset
        assembly.stripes[offset] = (length, crc)
        assembly.received += length
        assembly.last_at = now
        if assembly.received < assembly.total:
            return Added.PARTIAL
        return Added.COMPLETE

    def check(self, key: Hashable, descriptor: StripeDescriptor, length: int) -> bool:
        """Whether the stripe is a duplicate (its message done, or its offset known),
        without accounting it. Raises ``RemoteProtocolError`` for a stripe that
        contradicts earlier ones (another total, or overlapping another stripe without
        being it)."""
        if key in self._done:
            return True
        assembly = self._open.get(key)
        if assembly is None:
            return False
        if assembly.total != descriptor.total:
            raise RemoteProtocolError(
                f"stripe of message {descriptor.msg_id} says {descriptor.total} bytes, an "
                f"earlier one said {assembly.total}"
            )
        offset = descriptor.offset
        known = assembly.stripes.get(offset)
        if known is not None:
            if known[0] != length:
                raise RemoteProtocolError(
                    f"two stripes of message {descriptor.msg_id} at offset {offset} differ in "
                    f"length ({known[0]} and {length} bytes)"
                )
            return True
        end = offset + length
        for other, (other_length, _) in assembly.stripes.items():
            if other < end and offset < other + other_length:
                raise RemoteProtocolError(
                    f"stripe [{offset}, {end}) of message {descriptor.msg_id} overlaps "
                    f"[{other}, {other + other_length})"
                )
        return False

    def open(self, key: Hashable, total: int, context: T, now: float = 0.0) -> _Assembly[T]:
        """The message's assembly, made with ``context`` if it has none yet."""
        assembly = self._open.get(key)
        if assembly is None:
            assembly = self._open[key] = _Assembly(total, context, last_at=now)
        return assembly

    def context(self, key: Hashable) -> T:
        return self._open[key].context

    def finish(self, key: Hashable, meta_crc: int) -> tuple[T, int]:
        """Close a complete message: its context and the CRC-32 of its meta followed by
        its payload (combined from the stripes' CRCs, no pass over the bytes)."""
        assembly = self._open.pop(key)
        crc = meta_crc
        for offset in sorted(assembly.stripes):
            length, stripe_crc = assembly.stripes[offset]
            crc = crc32_combine(crc, stripe_crc, length)
        self._remember(key)
        return assembly.context, crc

    def drop(self, key: Hashable) -> T | None:
        """Give a message up (it failed): later stripes of it are duplicates."""
        assembly = self._open.pop(key, None)
        self._remember(key)
        return None if assembly is None else assembly.context

    def keys(self) -> list[Hashable]:
        return list(self._open)

    def idle(self, now: float, idle_s: float) -> list[Hashable]:
        """Messages that got no new stripe for ``idle_s`` (their sender restarted, or
        gave them up): the shell drops them, as a session drops a partial message."""
        return [k for k, a in self._open.items() if now - a.last_at >= idle_s]

    def _remember(self, key: Hashable) -> None:
        self._done[key] = None
        while len(self._done) > self._max_done:
            self._done.popitem(last=False)


def stripe_crc(stripe_checksum: int, stripe_meta_crc: int, length: int) -> int:
    """The CRC-32 of a stripe's payload alone, from its message checksum (CRC of meta
    then payload) and the CRC of its meta: CRC is linear, so
    crc(M || P) = combine(crc(M), 0, len P) XOR crc(P)."""
    return (stripe_checksum ^ crc32_combine(stripe_meta_crc, 0, length)) & 0xFFFFFFFF
