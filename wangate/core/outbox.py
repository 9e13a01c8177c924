"""The sender's side of credit and deadlines: messages not yet started, and deadlines.

Credit (proto/wire.md, "Flow control"): a message starts only when the bodies started,
this one included, fit within the largest grant seen. Critical messages wait in front
and may also use the slack the receiver keeps for one maximum message beyond its window,
so they never wait for bulk to be consumed. A message larger than the peer's limit fails
at once.

Deadlines: a message submitted with one fails when it passes unless the peer has
confirmed it by then, whether it still waits here or is being sent; the reason says how
much of it was acknowledged.

Pure: time comes in as ``now``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping

from wangate.core.events import SendFailed
from wangate.core.outbound import OutboundMessage


class Outbox:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.waiting: deque[OutboundMessage] = deque()
        self.granted_bytes = 0  # the largest grant seen
        self.started_bytes = 0  # bodies started since the peer's instance began
        self.peer_max_message: int | None = None  # from the peer's Hello
        # (deadline, id, message) of messages submitted with one; done ones leave lazily
        self._deadlines: list[tuple[float, int, OutboundMessage]] = []

    def add(self, message: OutboundMessage, deadline_at: float | None) -> None:
        if deadline_at is not None:
            message.deadline_at = deadline_at
            heapq.heappush(self._deadlines, (deadline_at, message.msg_id, message))
        if message.critical:
            self.waiting.appendleft(message)
        else:
            self.waiting.append(message)

    def grant(self, granted_bytes: int) -> bool:
        """A Credit frame; True when it allows more than before."""
        if granted_bytes <= self.granted_bytes:
            return False
        self.granted_bytes = granted_bytes
        return True

    def reset(self) -> None:
        """The peer restarted: its credit starts from zero again."""
        self.granted_bytes = 0
        self.started_bytes = 0

    def admit(self) -> tuple[list[OutboundMessage], list[SendFailed]]:
        """The messages that may start now, in order, and those that never can."""
        started: list[OutboundMessage] = []
        failed: list[SendFailed] = []
        limit = self.peer_max_message
        while self.waiting:
            message = self.waiting[0]
            if limit is not None and message.body_len > limit:
                self.waiting.popleft()
                failed.append(
                    SendFailed(
                        message.msg_id,
                        f"message of {message.body_len} bytes exceeds peer {self.peer}'s "
                        f"limit of {limit}",
                        message.tag,
                        message.step,
                    )
                )
                continue
            slack = limit or 0 if message.critical else 0
            if self.started_bytes + message.body_len > self.granted_bytes + slack:
                break
            self.waiting.popleft()
            self.started_bytes += message.body_len
            started.append(message)
        return started, failed

    def fail_all(self, reason: str) -> list[SendFailed]:
        """Give up every message still waiting for credit."""
        failed = [SendFailed(m.msg_id, reason, m.tag, m.step) for m in self.waiting]
        self.waiting.clear()
        return failed

    def waiting_bytes(self) -> int:
        return sum(m.body_len for m in self.waiting)

    # ---------------------------------------------------------------- deadlines

    def _pending(self, message: OutboundMessage, sending: Mapping[int, OutboundMessage]) -> bool:
        return sending.get(message.msg_id) is message or message in self.waiting

    def next_deadline(self, sending: Mapping[int, OutboundMessage]) -> float | None:
        """The earliest deadline of a message still waiting or in ``sending``."""
        heap = self._deadlines
        while heap and not self._pending(heap[0][2], sending):
            heapq.heappop(heap)  # done or failed since: no wake-up for it
        return heap[0][0] if heap else None

    def expire(
        self,
        now: float,
        sending: Mapping[int, OutboundMessage],
        give_up: Callable[[int], object],
    ) -> list[SendFailed]:
        """Fail every pending message whose deadline passed; ``give_up(msg_id)`` stops
        sending one that had started."""
        failed: list[SendFailed] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline_at, msg_id, message = heapq.heappop(heap)
            if not self._pending(message, sending):
                continue
            if message in self.waiting:
                self.waiting.remove(message)
            else:
                give_up(msg_id)
            acked = message.acked.covered_bytes(0, message.body_len)
            failed.append(
                SendFailed(
                    msg_id,
                    f"deadline of {deadline_at - message.started_at:.3g} s passed before "
                    f"{self.peer} confirmed it ({acked} of {message.body_len} bytes acknowledged)",
                    message.tag,
                    message.step,
                )
            )
        return failed
