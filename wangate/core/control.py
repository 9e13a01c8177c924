"""The control streams: what the session does with what the peer sends on them
(proto/wire.md, "Control frames"; proto/delivery.md for done and taken).

Part of ``PeerSession``: each frame from the peer goes to its handler here, and the
sender hears what it says (acks, credit, done, taken, rejections, repair requests).
The sender keeps what the peer holds but no trainer took yet (``held``): if the peer
restarts, those fail. What we send on the streams is ``wangate.core.control_outbox``'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from wangate.core.control_outbox import CREDIT_REFRESH_S as CREDIT_REFRESH_S
from wangate.core.events import Event, MessageTaken, SendFailed
from wangate.core.frames import (
    Ack,
    ControlFrame,
    Credit,
    MessageRejected,
    MessagesDone,
    MessagesTaken,
    RangesMissing,
    RepairRequested,
    RouteChosen,
)
from wangate.core.inbound import Reassembly
from wangate.core.sending import Sender
from wangate.errors import RemoteProtocolError

MAX_HELD_RECORDS: Final = 1 << 20  # done-not-taken records kept per peer (a few dozen bytes each)


class ControlStreams:
    """What comes from the peer on the control streams; what it holds of ours."""

    def __init__(
        self,
        events: deque[Event],
        send: Sender,
        inbound: Reassembly,
        inbox_window_bytes: int,
    ) -> None:
        self._events = events  # the session's, shared
        self._send = send
        self._inbound = inbound
        self._inbox_window_bytes = inbox_window_bytes
        self.peer_critical_path: str | None = None  # the path the peer sends critical data on
        # done (the peer holds it) but not taken by a trainer there: id -> (tag, step)
        self.held: dict[int, tuple[str, int]] = {}

    @property
    def granted_bytes(self) -> int:
        """What our credit grants the peer: what trainers here consumed, plus the window."""
        return max(0, self._inbound.consumed_bytes + self._inbox_window_bytes)

    def check(self, path: str, frame: ControlFrame) -> None:
        """Raise if ``frame`` has no handler here (a second ``Hello``): the peer's error."""
        if type(frame) not in _HANDLERS:
            raise RemoteProtocolError(
                f"unexpected {type(frame).__name__.lower()} frame on path {path}"
            )

    def handle(self, path: str, frame: ControlFrame, now: float) -> None:
        """One control frame from the peer on ``path``'s stream (``check`` passed)."""
        _HANDLERS[type(frame)](self, path, frame, now)

    def peer_restarted(self) -> None:
        """Every message the old instance held for its trainers is lost."""
        why = f"peer {self._send.peer} restarted with it in its inbox, before a trainer took it"
        for msg_id, (tag, step) in self.held.items():
            self._events.append(SendFailed(msg_id, why, tag, step, restarted=True))
        self.held.clear()

    def _on_ack(self, path: str, frame: Ack, now: float) -> None:
        self._send.outcomes.on_ack(path, frame, now)

    def _on_credit(self, path: str, frame: Credit, now: float) -> None:
        if self._send.outbox.grant(frame.granted_bytes):
            self._send.admit(now)

    def _on_route(self, path: str, frame: RouteChosen, now: float) -> None:
        self.peer_critical_path = frame.path

    def _on_done(self, path: str, frame: MessagesDone, now: float) -> None:
        for msg_id in frame.msg_ids:
            done = self._send.queue.done(msg_id)
            if done is not None:
                self._send.confirmed(done, now)
                if len(self.held) < MAX_HELD_RECORDS:
                    self.held[msg_id] = (done.tag, done.step)

    def _on_taken(self, path: str, frame: MessagesTaken, now: float) -> None:
        for msg_id in frame.msg_ids:
            if self.held.pop(msg_id, None) is not None:
                self._events.append(MessageTaken(msg_id))
                continue
            done = self._send.queue.done(msg_id)  # "taken" overtook "done" on another path
            if done is not None:
                self._send.confirmed(done, now)
                self._events.append(MessageTaken(msg_id))
        self._send.taken(frame.msg_ids, now)  # after: a job's cap may start more

    def _on_repair_request(self, path: str, frame: RepairRequested, now: float) -> None:
        self._send.queue.repair_blocks(frame.msg_id, frame.blocks)

    def _on_ranges_missing(self, path: str, frame: RangesMissing, now: float) -> None:
        self._send.queue.resend_ranges(frame.msg_id, frame.ranges)

    def _on_rejected(self, path: str, frame: MessageRejected, now: float) -> None:
        dropped = self._send.drop(frame.msg_id)
        if dropped is not None:
            self._events.append(
                SendFailed(
                    frame.msg_id,
                    f"peer {self._send.peer} rejected it: {frame.reason}",
                    dropped.tag,
                    dropped.step,
                )
            )
            self._send.admit(now)  # its job holds less: a job at its cap may go on


_Handler = Callable[[ControlStreams, str, ControlFrame, float], None]
# Every control frame the peer may send once a path is up; Hello is not among them.
_HANDLERS: Final[dict[type, _Handler]] = {
    Ack: ControlStreams._on_ack,  # type: ignore[dict-item]
    Credit: ControlStreams._on_credit,  # type: ignore[dict-item]
    RouteChosen: ControlStreams._on_route,  # type: ignore[dict-item]
    MessagesDone: ControlStreams._on_done,  # type: ignore[dict-item]
    MessagesTaken: ControlStreams._on_taken,  # type: ignore[dict-item]
    RepairRequested: ControlStreams._on_repair_request,  # type: ignore[dict-item]
    RangesMissing: ControlStreams._on_ranges_missing,  # type: ignore[dict-item]
    MessageRejected: ControlStreams._on_rejected,  # type: ignore[dict-item]
}
