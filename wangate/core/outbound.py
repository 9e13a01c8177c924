"""Messages on their way out: which bytes still need sending, which are acknowledged.

Work is pulled: a path that can send asks ``OutboundQueue.take(max_bytes)`` for the
next piece. Repairs of lost pieces come before new bytes, critical messages before
bulk ones, older messages before newer ones. Nothing is ever resent whole: a lost
piece comes back as exactly the byte range that was lost.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from wangate.core.rangeset import RangeSet

Buffer = bytes | bytearray | memoryview


class OutboundMessage:
    __slots__ = (
        "acked",
        "body_len",
        "critical",
        "head",
        "msg_id",
        "next_offset",
        "payload",
        "queued",
        "repairs",
        "started_at",
    )

    def __init__(self, msg_id: int, head: bytes, payload: Buffer, critical: bool) -> None:
        self.msg_id = msg_id
        self.head = head
        self.payload = memoryview(payload).cast("B")
        self.body_len = len(head) + len(self.payload)
        self.critical = critical
        self.next_offset = 0  # first byte never sent
        self.repairs: deque[tuple[int, int]] = deque()  # [start, end) to send again
        self.acked = RangeSet()
        self.queued = False  # in the queue's work list
        self.started_at = 0.0

    def read(self, start: int, end: int) -> bytes | memoryview:
        head_len = len(self.head)
        if start >= head_len:
            return self.payload[start - head_len : end - head_len]
        if end <= head_len:
            return self.head[start:end]
        return self.head[start:] + self.payload[: end - head_len]

    @property
    def has_work(self) -> bool:
        return bool(self.repairs) or self.next_offset < self.body_len

    @property
    def complete(self) -> bool:
        return self.acked.covers(0, self.body_len)


@dataclass(frozen=True)
class Piece:
    message: OutboundMessage
    start: int
    end: int
    repair: bool


class OutboundQueue:
    """Messages started (admitted by the peer's credit) and not yet fully acknowledged."""

    def __init__(self) -> None:
        self.messages: dict[int, OutboundMessage] = {}
        self._critical: deque[OutboundMessage] = deque()
        self._bulk: deque[OutboundMessage] = deque()
        self.repair_bytes = 0  # cumulative bytes sent again
        self.bulk_backlog_bytes = 0  # bulk bytes still to send (new and repairs)

    def add(self, message: OutboundMessage) -> None:
        self.messages[message.msg_id] = message
        if not message.critical:
            self.bulk_backlog_bytes += message.body_len
        self._enqueue(message)

    def _enqueue(self, message: OutboundMessage) -> None:
        if not message.queued and message.has_work:
            message.queued = True
            (self._critical if message.critical else self._bulk).append(message)

    def has_work(self) -> bool:
        return bool(self._critical) or bool(self._bulk)

    @property
    def has_critical_work(self) -> bool:
        return bool(self._critical)

    @property
    def has_bulk_work(self) -> bool:
        return bool(self._bulk)

    def take(self, max_bytes: int, *, critical: bool) -> Piece | None:
        """The next critical (or bulk) piece of at most ``max_bytes``, if any."""
        work = self._critical if critical else self._bulk
        while work:
            message = work[0]
            piece = self._take_from(message, max_bytes)
            if not message.has_work:
                work.popleft()
                message.queued = False
            if piece is not None:
                return piece
        return None

    def _take_from(self, message: OutboundMessage, max_bytes: int) -> Piece | None:
        while message.repairs:
            start, end = message.repairs.popleft()
            gap = message.acked.first_gap(start, end)
            if gap is None:
                self._settle(message, end - start)
                continue  # acknowledged after all (a late ack beat the repair)
            self._settle(message, gap[0] - start)
            start, gap_end = gap
            if gap_end < end:
                message.repairs.appendleft((gap_end, end))
            end = min(gap_end, start + max_bytes)
            if end < gap_end:
                message.repairs.appendleft((end, gap_end))
            self.repair_bytes += end - start
            self._settle(message, end - start)
            return Piece(message, start, end, True)
        if message.next_offset < message.body_len:
            start = message.next_offset
            end = min(message.body_len, start + max_bytes)
            message.next_offset = end
            self._settle(message, end - start)
            return Piece(message, start, end, False)
        return None

    def _settle(self, message: OutboundMessage, size_bytes: int) -> None:
        """``size_bytes`` of the message's work left the backlog (sent, or acked meanwhile)."""
        if not message.critical:
            self.bulk_backlog_bytes -= size_bytes

    def mark_lost(self, msg_id: int, start: int, end: int) -> None:
        message = self.messages.get(msg_id)
        if message is None or message.acked.covers(start, end):
            return
        message.repairs.append((start, end))
        if not message.critical:
            self.bulk_backlog_bytes += end - start
        self._enqueue(message)

    def mark_acked(self, msg_id: int, start: int, end: int) -> OutboundMessage | None:
        """Record delivery of a range; returns the message if that completed it."""
        message = self.messages.get(msg_id)
        if message is None:
            return None
        message.acked.add(start, end)
        if message.next_offset >= message.body_len and message.complete:
            del self.messages[msg_id]
            return message
        return None

    def drop(self, msg_id: int) -> OutboundMessage | None:
        message = self.messages.pop(msg_id, None)
        if message is not None:
            if not message.critical:
                self.bulk_backlog_bytes -= (message.body_len - message.next_offset) + sum(
                    end - start for start, end in message.repairs
                )
            message.repairs.clear()
            message.next_offset = message.body_len
        return message

    def clear(self) -> list[OutboundMessage]:
        dropped = list(self.messages.values())
        for message in dropped:
            self.drop(message.msg_id)
        self._critical.clear()
        self._bulk.clear()
        return dropped
