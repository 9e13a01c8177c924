"""The control streams: what the session sends on them and what it does with what the
peer sends (proto/wire.md, "Control frames"; proto/delivery.md for done and taken).

Part of ``PeerSession``: per path, acks and credit go on that path's stream; frames
about whole messages (done, taken, rejected, repair requests) go on one path at a time,
the end-to-end path, and are sent again on another if that path goes down with them.
The sender keeps what the peer holds but no trainer took yet (``held``): if the peer
restarts, those fail.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from wangate.core.events import Event, MessageTaken, SendFailed
from wangate.core.frames import (
    MAX_DONE_IDS,
    Ack,
    ControlFrame,
    Credit,
    MessageRejected,
    MessagesDone,
    MessagesTaken,
    RepairRequested,
    RouteChosen,
    encode_control,
)
from wangate.core.inbound import Reassembly
from wangate.core.paths import PathRecord
from wangate.core.replay import SentFrames
from wangate.core.sending import Sender
from wangate.errors import RemoteProtocolError

# Re-advertise credit on a path at most this often, along with other control frames
# that go on it anyway (never a packet of its own: the stream is reliable, and a path
# that comes up, or consumption, sends credit at once)
CREDIT_REFRESH_S = 1.0
MAX_HELD_RECORDS = 1 << 20  # done-not-taken records kept per peer (a few dozen bytes each)


class ControlStreams:
    """What goes on each path's control stream, and what comes from the peer on it."""

    def __init__(
        self,
        paths: dict[str, PathRecord],
        events: deque[Event],
        send: Sender,
        inbound: Reassembly,
        inbox_window_bytes: int,
    ) -> None:
        self._paths = paths  # the session's, shared
        self._events = events  # the session's, shared
        self._send = send
        self._inbound = inbound
        self._inbox_window_bytes = inbox_window_bytes
        self.peer_critical_path: str | None = None  # the path the peer sends critical data on
        # done (the peer holds it) but not taken by a trainer there: id -> (tag, step)
        self.held: dict[int, tuple[str, int]] = {}
        self.credit_dirty: set[str] = set()  # paths owed a credit frame
        self.taken_pending: dict[int, None] = {}  # ordered set of ids to report taken
        self.sent_frames = SentFrames()  # end-to-end frames each path carried lately
        self.replay = b""  # such frames a path took down with it: they go again

    @property
    def granted_bytes(self) -> int:
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

    def path_lost(self, path: str, now: float) -> None:
        """``path`` carries nothing more: the end-to-end frames it may have taken with
        it go again."""
        self.replay += self.sent_frames.lost_with(path, now)

    def peer_restarted(self) -> None:
        """Every message the old instance held for its trainers is lost; frames about
        the old instance's messages would name the new one's."""
        why = f"peer {self._send.peer} restarted with it in its inbox, before a trainer took it"
        for msg_id, (tag, step) in self.held.items():
            self._events.append(SendFailed(msg_id, why, tag, step))
        self.held.clear()
        self.sent_frames = SentFrames()
        self.replay = b""
        self.credit_dirty.update(self._paths)

    def _on_ack(self, path: str, frame: Ack, now: float) -> None:
        self._send.on_ack(path, frame, now)

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

    def to_send(self, path: str, now: float) -> bytes:
        """Control frames due on ``path``'s stream (may be empty)."""
        out: list[bytes] = []
        record = self._paths.get(path)
        if record is not None:
            ack = record.receiver.take_ack(now)
            if ack is not None:
                out.append(encode_control(ack))
        if path in self.credit_dirty:
            self.credit_dirty.discard(path)
            out.append(encode_control(Credit(self.granted_bytes)))
            if record is not None:
                record.credit_sent_at = now
        current = self._send.scheduler.selector.current
        inbound = self._inbound
        pending = (
            self.replay
            or inbound.rejections
            or inbound.repair_requests
            or inbound.done_pending
            or self.taken_pending
        )
        if pending and path == self._end_to_end_path():
            first = len(out)
            if self.replay:
                out.append(self.replay)
                self.replay = b""
            while inbound.rejections:
                out.append(encode_control(inbound.rejections.popleft()))
            while inbound.repair_requests:
                out.append(encode_control(inbound.repair_requests.popleft()))
            while inbound.done_pending:
                out.append(encode_control(MessagesDone(inbound.take_done(MAX_DONE_IDS))))
            while self.taken_pending:  # after "done": the sender expects them in that order
                ids = tuple(self.taken_pending)[:MAX_DONE_IDS]
                for msg_id in ids:
                    del self.taken_pending[msg_id]
                out.append(encode_control(MessagesTaken(ids)))
            self.sent_frames.sent(path, b"".join(out[first:]), now)
        if self._send.route_dirty and current is not None and path == current:
            self._send.route_dirty = False
            out.append(encode_control(RouteChosen(current)))
        if out and record is not None and now - record.credit_sent_at >= CREDIT_REFRESH_S:
            record.credit_sent_at = now
            out.append(encode_control(Credit(self.granted_bytes)))
        return b"".join(out)

    def _end_to_end_path(self) -> str | None:
        """Where frames about whole messages go: the critical route, else the fastest
        usable path (a silent path would hold them back until it times out)."""
        usable = [n for n, ok in self._send.usable().items() if ok]
        current = self._send.scheduler.selector.current
        if current in usable:
            return current
        if not usable:
            return next(iter(self._paths), None)
        return min(usable, key=lambda n: self._paths[n].sender.estimator.srtt_s)


_Handler = Callable[[ControlStreams, str, ControlFrame, float], None]
# Every control frame the peer may send once a path is up; Hello is not among them.
_HANDLERS: dict[type, _Handler] = {
    Ack: ControlStreams._on_ack,  # type: ignore[dict-item]
    Credit: ControlStreams._on_credit,  # type: ignore[dict-item]
    RouteChosen: ControlStreams._on_route,  # type: ignore[dict-item]
    MessagesDone: ControlStreams._on_done,  # type: ignore[dict-item]
    MessagesTaken: ControlStreams._on_taken,  # type: ignore[dict-item]
    RepairRequested: ControlStreams._on_repair_request,  # type: ignore[dict-item]
    MessageRejected: ControlStreams._on_rejected,  # type: ignore[dict-item]
}
