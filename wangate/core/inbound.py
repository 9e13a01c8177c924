"""Messages on their way in: reassembly from shards and FEC repair symbols, admission
against the inbox window, verification, and what the sender must be told.

A sender that counts every byte of a message acknowledged but hears no "done" asks again
with byte 0 (a poke); a receiver still assembling that message answers with the ranges
it lacks (``RangesMissing``), whatever made the two disagree.

A message is admitted when its first shard or symbol arrives and it fits the window
(else nothing of it is acknowledged and the sender repairs it later). It is delivered
once every byte is there and its checksum matches; the sender is then told it is done.
If a message whose blocks were rebuilt by FEC fails its checksum, those blocks are
thrown away and asked for again by range (``RepairRequested``): a corrupt block is
repaired, never delivered.

A message still being assembled that makes no progress (no new byte, no new repair
symbol) for ``idle_timeout_s`` is dropped as expired: its sender gave up on it or went
quiet, and its bytes must not hold the window forever.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final

from wangate.core.coding import CodingShape, InboundCoding
from wangate.core.events import Event, MessageDropped, MessageProgress, MessageReceived
from wangate.core.frames import (
    MAX_MISSING_RANGES,
    REJECT_CHECKSUM,
    REJECT_EXPIRED,
    REJECT_MALFORMED,
    REJECT_TOO_LARGE,
    REJECT_UNKNOWN_JOB,
    MessageRejected,
    RangesMissing,
    RepairDatagram,
    RepairRequested,
    ShardDatagram,
)
from wangate.core.message import HEAD_BYTES, MessageHeader, head_job, payload_offset, verify_body
from wangate.core.rangeset import RangeSet
from wangate.errors import ChecksumError, LocalProtocolError, RemoteProtocolError

MAX_DONE_PENDING: Final = 4096
DEFAULT_IDLE_TIMEOUT_S: Final = 60.0
PROGRESS_MIN_STEP_BYTES: Final = 4 << 20  # progress reports: at most 64 per message, none smaller
PROGRESS_STEPS: Final = 64

Body = bytearray | memoryview  # writable, exactly the message's size
# (size, where the payload starts if known, the job it names if known): placing the
# payload is the allocator's, and so is what memory a job's bodies may reuse
Allocate = Callable[[int, int | None, str | None], Body]
Free = Callable[[Body], None]


def _no_free(body: Body) -> None:
    pass


def _new_bytearray(size_bytes: int, payload_offset: int | None, job: str | None) -> Body:
    return bytearray(size_bytes)


def progress_step(msg_len: int) -> int:
    """Bytes of contiguous prefix between two progress reports of one message."""
    return max(PROGRESS_MIN_STEP_BYTES, -(-msg_len // PROGRESS_STEPS))


class InboundMessage:
    __slots__ = (
        "body",
        "coding",
        "prefix_bytes",
        "progressed_at",
        "received",
        "reported_bytes",
        "started_at",
    )

    def __init__(self, body: Body, now: float) -> None:
        self.body = body
        self.received = RangeSet()
        self.started_at = now
        self.progressed_at = now  # last new byte or repair symbol (or creation)
        self.coding: InboundCoding | None = None
        self.prefix_bytes = 0  # contiguous from offset 0
        self.reported_bytes = 0  # prefix at the last MessageProgress (0: none yet)


class Reassembly:
    """The receiving half of one peer's messages.

    ``now`` passed to the methods must never go backwards (a monotonic clock).
    """

    def __init__(
        self,
        max_message_bytes: int,
        window_bytes: int,
        events: deque[Event],
        *,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        screen: Callable[[MessageHeader], str | None] | None = None,
    ) -> None:
        if not 0.0 < idle_timeout_s < math.inf:
            raise LocalProtocolError(
                f"inbound idle timeout must be a positive number of seconds, not {idle_timeout_s}"
            )
        self.max_message_bytes = max_message_bytes
        self.window_bytes = window_bytes
        self.idle_timeout_s = idle_timeout_s
        self._events = events
        # the shell's last word on a whole, verified message: why it must not be
        # delivered (rejected to its sender with that reason), or None
        self._screen = screen
        self.jobs: frozenset[str] | None = None  # the jobs this site serves; None: any
        # in progress, least recently progressed first (``_progressed`` moves to the end),
        # so the first one is the next to expire: expire/next_expiry are O(1) amortised
        self.inbound: OrderedDict[int, InboundMessage] = OrderedDict()
        # the bodies of those whose shards may be written in before they are handled
        # (``place_shards``, then ``accept_run``): every message in progress that no FEC
        # repair symbol reached (a repaired one decodes block by block, per datagram)
        self.placeable: dict[int, Body] = {}
        self._newest_progressed = 0  # at the end of ``inbound`` (if still in it)
        self.completed = RangeSet()  # message ids delivered
        # of those, the ones a trainer here took: "done" said again brings "taken" too
        self.taken = RangeSet()
        self.rejected = RangeSet()  # message ids dropped: acknowledged, never confirmed
        self.held_bytes = 0  # in progress + delivered and not yet consumed
        self.consumed_bytes = 0
        self.rejections: deque[MessageRejected] = deque()
        # what the sender must send again: rebuilt blocks that failed the checksum, and
        # the ranges still missing of a message whose confirmation it asked for
        self.repair_requests: deque[RepairRequested | RangesMissing] = deque()
        self.done_pending: dict[int, None] = {}  # ordered set of ids to confirm
        self.messages_received = 0
        self.bytes_received = 0
        self.blocks_decoded = 0
        self.symbols_recovered = 0  # source symbols rebuilt from repair symbols
        self.ranges_missing_sent = 0  # answers to a "done?" for an incomplete message
        # where bodies are assembled: the shell may give shared memory that becomes
        # the trainer's, so a message is written once, in place (``use_buffers``)
        self.allocate: Allocate = _new_bytearray
        self.free: Free = _no_free
        # messages from this size on report their contiguous prefix (MessageProgress)
        self.progress_min_bytes: float = math.inf

    def use_buffers(
        self, allocate: Allocate, free: Free, progress_min_bytes: float = math.inf
    ) -> None:
        """Assemble bodies in ``allocate(size)``; ``free(body)`` takes back one that
        will not be delivered (dropped, expired, the peer restarted). Messages of
        ``progress_min_bytes`` or more report their prefix as it grows."""
        self.allocate = allocate
        self.free = free
        self.progress_min_bytes = progress_min_bytes

    # ------------------------------------------------------------ admission

    def _message(
        self, msg_id: int, msg_len: int, now: float, first_bytes: bytes | memoryview | None = None
    ) -> InboundMessage | bool | None:
        """The message a datagram belongs to; True: already finished; None: refused."""
        if msg_id in self.rejected:
            return True  # ack it so the sender stops; the rejection told it the rest
        if msg_id in self.completed:
            if len(self.done_pending) < MAX_DONE_PENDING:
                self.done_pending[msg_id] = None  # the sender did not hear "done" yet
            return True
        message = self.inbound.get(msg_id)
        if message is None:
            if msg_len > self.max_message_bytes:
                self._reject(msg_id, REJECT_TOO_LARGE, f"message of {msg_len} bytes")
                return True
            if self.held_bytes + msg_len > self.window_bytes + self.max_message_bytes:
                return None  # beyond what we granted: the sender will repair it later
            start = job = None
            if first_bytes is not None:
                start, job = payload_offset(first_bytes), head_job(first_bytes)
            message = InboundMessage(self.allocate(msg_len, start, job), now)
            self.inbound[msg_id] = message
            self.placeable[msg_id] = message.body
            self._newest_progressed = msg_id
            self.held_bytes += msg_len
        elif msg_len != len(message.body):
            raise RemoteProtocolError(
                f"message {msg_id}: datagram says {msg_len} bytes, earlier ones {len(message.body)}"
            )
        return message

    def accept_shard(self, shard: ShardDatagram, now: float) -> bool:
        """Store a shard; False means it was refused and must not be acknowledged."""
        # a message's first shard usually comes first: it says where the payload starts
        first = shard.data if shard.offset == 0 else None
        message = self._message(shard.msg_id, shard.msg_len, now, first)
        if not isinstance(message, InboundMessage):
            return message is True
        end = shard.offset + len(shard.data)
        new_bytes = message.received.add(shard.offset, end)
        if new_bytes:
            self._progressed(shard.msg_id, message, now)
            message.body[shard.offset : end] = shard.data
            coding = message.coding
            if coding is not None and coding.decoders:
                coding.bytes_received(shard.offset, end, new_bytes)
                block = coding.shape.block_of(shard.offset)
                self._decode(message, block)
            if shard.offset <= message.prefix_bytes:  # else the prefix cannot have grown
                self._report(shard.msg_id, message)
        self._maybe_finish(shard.msg_id, message)
        if end == 1 and shard.msg_len > 1 and shard.msg_id in self.inbound:
            # the sender's "done?" (wire.md, "Asking again"): it counts every byte as
            # acknowledged, yet some are not here: say which, or the message stalls
            # until it expires
            gaps = message.received.gaps(0, shard.msg_len, MAX_MISSING_RANGES)
            self.repair_requests.append(RangesMissing(shard.msg_id, tuple(gaps)))
            self.ranges_missing_sent += 1
        return True

    def accept_run(self, msg_id: int, msg_len: int, start: int, end: int, now: float) -> bool:
        """Shards of ``[start, end)`` (``start`` > 0), already written into the body
        ``placeable`` had for ``msg_id``, as ``accept_shard`` would have taken them one
        by one, except that the prefix is reported (``MessageProgress``) once, after all."""
        message = self._message(msg_id, msg_len, now)
        if not isinstance(message, InboundMessage):
            return message is True  # finished by an earlier datagram of the same batch
        if message.coding is not None:  # place_shards leaves a repaired message alone
            raise LocalProtocolError(f"message {msg_id}: shards placed after its repair")
        if message.received.add(start, end):
            self._progressed(msg_id, message, now)
            if start <= message.prefix_bytes:
                self._report(msg_id, message)
        self._maybe_finish(msg_id, message)
        return True

    def accept_repair(self, repair: RepairDatagram, now: float) -> bool:
        message = self._message(repair.msg_id, repair.msg_len, now)
        if not isinstance(message, InboundMessage):
            return message is True
        shape = CodingShape(repair.msg_len, repair.symbol_bytes, repair.k)
        if message.coding is None:
            message.coding = InboundCoding(shape)
            self.placeable.pop(repair.msg_id, None)
        elif message.coding.shape != shape:
            raise RemoteProtocolError(f"message {repair.msg_id}: repair symbols changed shape")
        start, end = shape.block_range(repair.block)
        if not message.received.covers(start, end):
            decoder = message.coding.decoders.get(repair.block)
            held = 0 if decoder is None else decoder.symbol_count
            message.coding.add_repair(repair.block, repair.index, repair.data)
            if message.coding.decoders[repair.block].symbol_count > held:
                self._progressed(repair.msg_id, message, now)
            self._decode(message, repair.block)
            self._report(repair.msg_id, message)
            self._maybe_finish(repair.msg_id, message)
        return True

    def _progressed(self, msg_id: int, message: InboundMessage, now: float) -> None:
        message.progressed_at = now
        if msg_id != self._newest_progressed:  # the usual shard: already at the end
            self.inbound.move_to_end(msg_id)
            self._newest_progressed = msg_id

    def _decode(self, message: InboundMessage, block: int) -> None:
        assert message.coding is not None
        written = message.coding.try_decode(block, message.body, message.received)
        for start, end in written:
            message.received.add(start, end)
        if written:
            self.blocks_decoded += 1
            self.symbols_recovered += len(written)

    def _report(self, msg_id: int, message: InboundMessage) -> None:
        """Report the contiguous prefix when it first holds the header, then each step."""
        size = len(message.body)
        if size < self.progress_min_bytes:
            return
        prefix = message.prefix_bytes = message.received.prefix_end()
        if prefix >= size:
            return  # whole: MessageReceived (or a drop) says the rest
        if message.reported_bytes == 0:
            start = payload_offset(message.body[:HEAD_BYTES]) if prefix >= HEAD_BYTES else None
            if start is None or prefix < start:
                return  # the header is not in yet (or is not one: the end tells)
        elif prefix < message.reported_bytes + progress_step(size):
            return
        message.reported_bytes = prefix
        self._events.append(MessageProgress(msg_id, memoryview(message.body), prefix))

    # ----------------------------------------------------------- completion

    def _maybe_finish(self, msg_id: int, message: InboundMessage) -> None:
        if not message.received.covers(0, len(message.body)):
            return
        try:
            header, payload = verify_body(message.body)
        except ChecksumError as exc:
            coding = message.coding
            if coding is not None and coding.decoded_blocks:
                # a rebuilt block is the likely culprit: ask for its sources by range
                blocks = tuple(sorted(coding.decoded_blocks))
                for block in blocks:
                    message.received.remove(*coding.shape.block_range(block))
                    coding.bytes_removed(block)
                coding.decoded_blocks.clear()
                self.repair_requests.append(RepairRequested(msg_id, blocks))
                return
            self._drop(msg_id, message, REJECT_CHECKSUM, str(exc))
            return
        except RemoteProtocolError as exc:
            self._drop(msg_id, message, REJECT_MALFORMED, str(exc))
            return
        refused = None if self._screen is None else self._screen(header)
        if refused is not None:
            self._drop(msg_id, message, REJECT_MALFORMED, refused)
            return
        if self.jobs is not None and header.job not in self.jobs:
            served = ", ".join(sorted(self.jobs))
            reason = f"no job {header.job!r} here (its jobs: {served})"
            self._drop(msg_id, message, REJECT_UNKNOWN_JOB, reason)
            return
        del self.inbound[msg_id]
        self.placeable.pop(msg_id, None)
        self.completed.add(msg_id, msg_id + 1)
        self.done_pending[msg_id] = None
        self.messages_received += 1
        self.bytes_received += len(message.body)
        self._events.append(MessageReceived(msg_id, header, payload, len(message.body)))

    # -------------------------------------------------------------- expiry

    def next_expiry(self) -> float | None:
        """When ``expire`` will next drop a message (None: nothing in progress). O(1)."""
        for message in self.inbound.values():  # the least recently progressed
            return message.progressed_at + self.idle_timeout_s
        return None

    def restart_clocks(self, now: float) -> None:
        """No path to the peer works: nothing can make progress, so nothing is idle."""
        for message in self.inbound.values():
            message.progressed_at = now

    def expire(self, now: float) -> None:
        """Drop every message that made no progress for ``idle_timeout_s`` (at ``now``).

        Like a checksum failure: its bytes leave the window and count as consumed (the
        sender gets that credit back), later datagrams of it are acknowledged and
        ignored, and the sender is told with ``MessageRejected`` (``REJECT_EXPIRED``).
        O(1) amortised: each message expires once.
        """
        inbound = self.inbound
        while inbound:
            msg_id = next(iter(inbound))
            message = inbound[msg_id]
            if now < message.progressed_at + self.idle_timeout_s:
                return
            reason = (
                f"no data for {self.idle_timeout_s:g} s: abandoned by its sender? "
                f"({message.received.total()} of {len(message.body)} bytes received)"
            )
            self._drop(msg_id, message, REJECT_EXPIRED, reason)

    # ------------------------------------------------------------- dropping

    def _drop(self, msg_id: int, message: InboundMessage, code: int, reason: str) -> None:
        del self.inbound[msg_id]
        self.placeable.pop(msg_id, None)
        self.release(len(message.body))
        self.free(message.body)
        self._reject(msg_id, code, reason)

    def _reject(self, msg_id: int, code: int, reason: str) -> None:
        self.rejected.add(msg_id, msg_id + 1)
        self._events.append(MessageDropped(msg_id, reason, code))
        self.rejections.append(MessageRejected(msg_id, code, reason))

    def release(self, body_bytes: int, msg_id: int = 0) -> None:
        """A trainer took ``body_bytes`` (of message ``msg_id``, if known)."""
        self.held_bytes -= body_bytes
        self.consumed_bytes += body_bytes
        if msg_id in self.completed:
            self.taken.add(msg_id, msg_id + 1)

    def take_done(self, limit: int) -> tuple[int, ...]:
        ids = tuple(self.done_pending)[:limit]
        for msg_id in ids:
            del self.done_pending[msg_id]
        return ids

    def peer_restarted(self) -> None:
        # Delivered messages not yet consumed stay with the trainers: they still count
        # against the window, and their later release must not grant the new instance
        # more than one window in all.
        self.held_bytes -= sum(len(m.body) for m in self.inbound.values())
        for message in self.inbound.values():
            self.free(message.body)
        self.inbound.clear()
        self.placeable.clear()
        self.completed.clear()
        self.taken.clear()
        self.rejected.clear()
        self.done_pending.clear()
        self.repair_requests.clear()
        self.consumed_bytes = -self.held_bytes
