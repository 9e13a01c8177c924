"""The sender's side of credit and deadlines: messages not yet started, and deadlines.

Credit (proto/wire.md, "Flow control"): a message starts only when the bodies started,
this one included, fit within the largest grant seen. Critical messages wait in front
and may also use the slack the receiver keeps for one maximum message beyond its window,
so they never wait for bulk to be consumed. A message larger than the peer's limit fails
at once.

Jobs (``wangate.core.jobs``): messages wait in a FIFO per job, critical ones in front of
their job's. The next to start is a waiting job's first message: a critical one first,
else the job that started the fewest body bytes per weight so far (start-time fair
queueing, an idle job coming back level with the others). A job whose held bytes (bodies
started and not yet taken by a trainer at the peer) plus its next message would pass its
``max_inflight_bytes`` is passed over, and does not hold up the jobs behind it; one that
holds nothing may start any message, however large, so it is never stuck. The grant
binds all jobs: when the message chosen does not fit, nothing starts.

Deadlines: a message submitted with one fails when it passes unless the peer has
confirmed it by then, whether it still waits here or is being sent; the reason says how
much of it was acknowledged.

Pure: time comes in as ``now``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from wangate.core.events import SendFailed
from wangate.core.fairqueue import NO_POLICY
from wangate.core.jobs import DEFAULT_POLICIES, JobPolicy
from wangate.core.outbound_message import OutboundMessage

# Of a trainer's deadline, what is spent before its message reaches a session and is not
# counted: a message handed on at once keeps the deadline as the trainer gave it, so its
# failure names that deadline, not one a few microseconds shorter.
DEADLINE_SLACK_S: Final = 0.01
# What a failure adds when every byte of the message went out once and it then failed
# unconfirmed (silence, a deadline): it may be whole there, even taken (proto/delivery.md
# "Limits").
ALL_SENT: Final = ", after all of it was sent (a trainer there may have taken it)"


def deadline_left_s(deadline_s: float, spent_s: float) -> float:
    """What is left of ``deadline_s`` after ``spent_s`` on the way to a session."""
    return deadline_s if spent_s < DEADLINE_SLACK_S else max(0.001, deadline_s - spent_s)


class WaitingMessages:
    """Messages waiting to start, a FIFO per job; read as one collection (``len``,
    ``in``, iteration job by job)."""

    def __init__(self) -> None:
        self.by_job: dict[str, deque[OutboundMessage]] = {}
        self._count = 0

    def add(self, message: OutboundMessage) -> None:
        fifo = self.by_job.setdefault(message.job, deque())
        if message.critical:
            fifo.appendleft(message)
        else:
            fifo.append(message)
        self._count += 1

    def pop(self, job: str) -> OutboundMessage:
        """The first message of ``job``'s FIFO, taken out."""
        fifo = self.by_job[job]
        message = fifo.popleft()
        self._count -= 1
        if not fifo:
            del self.by_job[job]
        return message

    def remove(self, message: OutboundMessage) -> None:
        fifo = self.by_job.get(message.job)
        if fifo is None:
            raise ValueError("not waiting")
        fifo.remove(message)
        self._count -= 1
        if not fifo:
            del self.by_job[message.job]

    def clear(self) -> None:
        self.by_job.clear()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[OutboundMessage]:
        for fifo in self.by_job.values():
            yield from fifo

    def __contains__(self, message: object) -> bool:
        if not isinstance(message, OutboundMessage):
            return False
        return message in self.by_job.get(message.job, ())


class Outbox:
    def __init__(self, peer: str, policies: Mapping[str, JobPolicy] = DEFAULT_POLICIES) -> None:
        self.peer = peer
        self.policies = policies  # per job; a job with none gets JobPolicy()
        self.waiting = WaitingMessages()
        self.granted_bytes = 0  # the largest grant seen
        self.started_bytes = 0  # bodies started since the peer's instance began
        self.peer_max_message: int | None = None  # from the peer's Hello
        # (deadline, id, message) of messages submitted with one; done ones leave lazily
        self._deadlines: list[tuple[float, int, OutboundMessage]] = []
        # started, not yet taken at the peer (nor failed): id -> (job, body bytes)
        self._held: dict[int, tuple[str, int]] = {}
        self.held_bytes: dict[str, int] = {}  # per job, of those
        self.started_messages: dict[str, int] = {}  # per job, since the session began
        self._tags: dict[str, float] = {}  # per job: bodies started / weight (virtual)
        self._vtime = 0.0  # the tag of the latest bulk start

    def add(self, message: OutboundMessage, deadline_at: float | None) -> None:
        if deadline_at is not None:
            message.deadline_at = deadline_at
            heapq.heappush(self._deadlines, (deadline_at, message.msg_id, message))
        self.waiting.add(message)

    def grant(self, granted_bytes: int) -> bool:
        """A Credit frame; True when it allows more than before."""
        if granted_bytes <= self.granted_bytes:
            return False
        self.granted_bytes = granted_bytes
        return True

    def reset(self) -> None:
        """The peer restarted: its credit starts from zero again, and it holds nothing."""
        self.granted_bytes = 0
        self.started_bytes = 0
        self._held.clear()
        self.held_bytes.clear()

    @property
    def held_messages(self) -> int:
        return len(self._held)

    def release(self, msg_id: int) -> bool:
        """A started message no longer counts against its job's cap (a trainer at the
        peer took it, or it failed); whether it did."""
        entry = self._held.pop(msg_id, None)
        if entry is None:
            return False
        job, body_bytes = entry
        left = self.held_bytes[job] - body_bytes
        if left:
            self.held_bytes[job] = left
        else:
            del self.held_bytes[job]
        return True

    def _next(self) -> OutboundMessage | None:
        """The message to start next: a critical one first, then the job furthest
        behind its share; a job at its cap is passed over; a message over the peer's
        limit at once (it fails)."""
        limit = self.peer_max_message
        best: OutboundMessage | None = None
        best_key = (True, 0.0)
        for job, fifo in self.waiting.by_job.items():
            head = fifo[0]
            if limit is not None and head.body_len > limit:
                return head
            held = self.held_bytes.get(job, 0)
            cap = self.policies.get(job, NO_POLICY).max_inflight_bytes
            if cap is not None and held and held + head.body_len > cap:
                continue
            key = (not head.critical, max(self._tags.get(job, 0.0), self._vtime))
            if best is None or key < best_key:
                best, best_key = head, key
        return best

    def _start(self, message: OutboundMessage) -> None:
        job, body_bytes = message.job, message.body_len
        weight = max(self.policies.get(job, NO_POLICY).weight, 1e-6)
        start = max(self._tags.get(job, 0.0), self._vtime)
        self._tags[job] = start + body_bytes / weight
        if not message.critical:  # a critical one goes first whatever its job's tag
            self._vtime = start
        self.started_bytes += body_bytes
        self._held[message.msg_id] = (job, body_bytes)
        self.held_bytes[job] = self.held_bytes.get(job, 0) + body_bytes
        self.started_messages[job] = self.started_messages.get(job, 0) + 1

    def admit(self) -> tuple[list[OutboundMessage], list[SendFailed]]:
        """The messages that may start now, in order, and those that never can."""
        started: list[OutboundMessage] = []
        failed: list[SendFailed] = []
        limit = self.peer_max_message
        while self.waiting:
            message = self._next()
            if message is None:
                break  # every job waiting is at its cap
            if limit is not None and message.body_len > limit:
                self.waiting.pop(message.job)
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
            self.waiting.pop(message.job)
            self._start(message)
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
            reason = (
                f"deadline of {deadline_at - message.started_at:.3g} s passed before "
                f"{self.peer} confirmed it ({acked} of {message.body_len} bytes acknowledged)"
            )
            if message.next_offset >= message.body_len:
                reason += ALL_SENT  # it may be whole there, its acks on the way
            failed.append(SendFailed(msg_id, reason, message.tag, message.step))
        return failed
