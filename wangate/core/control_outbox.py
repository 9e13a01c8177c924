"""What this gateway owes the peer on its control streams, and on which path
(proto/wire.md, "Control frames"; proto/delivery.md for done and taken).

Part of ``PeerSession``: every outgoing control frame is queued or decided here, and
``to_send(path, now)`` is the one place that writes a path's stream. Per path: the
acks its receiver owes (kept in the path's record, as it receives), credit when owed
(the path came up, a trainer took a message, one expired, the peer restarted) and
again along with other frames at most every ``CREDIT_REFRESH_S``, and our critical
route, on that route. Frames about whole messages (rejections, repair requests and
"done", which the reassembly queues as it finds them; "taken", queued here) go on one
path at a time, the end-to-end path, and again on another if that path goes down with
them. What the peer sends on the streams is ``wangate.core.control``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from wangate.core.frames import (
    MAX_DONE_IDS,
    Credit,
    MessagesDone,
    MessagesTaken,
    RouteChosen,
    encode_control,
)
from wangate.core.inbound import MAX_DONE_PENDING, Reassembly
from wangate.core.paths import PathRecord
from wangate.core.replay import SentFrames

# Re-advertise credit on a path at most this often, along with other control frames
# that go on it anyway (never a packet of its own: the stream is reliable, and a path
# that comes up, or consumption, sends credit at once)
CREDIT_REFRESH_S: Final = 1.0


class ControlOutbox:
    """The control frames owed to the peer, per path and end to end; the session's
    path records and reassembly are read, not owned."""

    def __init__(self, paths: Mapping[str, PathRecord], inbound: Reassembly) -> None:
        self._paths = paths  # the session's, shared
        self._inbound = inbound  # queues the end-to-end frames about what it receives
        self.credit_owed: set[str] = set()  # paths owed a credit frame
        self.credit_sent_at: dict[str, float] = {}  # per path, for the refresh
        self.route_owed = False  # our critical route changed: tell the peer, on it
        self.taken_pending: dict[int, None] = {}  # ordered set of ids to report taken
        self.sent_frames = SentFrames()  # end-to-end frames each path carried lately
        self.replay = b""  # such frames a path took down with it: they go again

    def owe_credit(self, path: str) -> None:
        self.credit_owed.add(path)

    def owe_credit_everywhere(self) -> None:
        """The grant grew (bytes consumed, or expired): every path says so."""
        self.credit_owed.update(self._paths)

    def owe_route(self) -> None:
        self.route_owed = True

    def owe_taken(self, msg_id: int) -> None:
        """Tell the peer a trainer here took its message ``msg_id`` (with
        ``MAX_DONE_PENDING`` ids unreported, no more are queued)."""
        if len(self.taken_pending) < MAX_DONE_PENDING:
            self.taken_pending[msg_id] = None

    def path_lost(self, path: str, now: float) -> None:
        """``path`` carries nothing more: the end-to-end frames it may have taken with
        it go again."""
        self.replay += self.sent_frames.lost_with(path, now)

    def peer_restarted(self) -> None:
        """Frames about the old instance's messages would name the new one's; the new
        one hears our grant afresh."""
        self.sent_frames = SentFrames()
        self.replay = b""
        self.owe_credit_everywhere()

    def to_send(self, path: str, now: float, *, granted_bytes: int, route: str | None) -> bytes:
        """Control frames due on ``path``'s stream (may be empty): ``granted_bytes`` is
        the grant to advertise, ``route`` our critical route."""
        out: list[bytes] = []
        record = self._paths.get(path)
        if record is not None:
            ack = record.receiver.take_ack(now)
            if ack is not None:
                out.append(encode_control(ack))
        if path in self.credit_owed:
            self.credit_owed.discard(path)
            out.append(encode_control(Credit(granted_bytes)))
            if record is not None:
                self.credit_sent_at[path] = now
        inbound = self._inbound
        pending = (
            self.replay
            or inbound.rejections
            or inbound.repair_requests
            or inbound.done_pending
            or self.taken_pending
        )
        if pending and path == self._end_to_end_path(route):
            first = len(out)
            if self.replay:
                out.append(self.replay)
                self.replay = b""
            while inbound.rejections:
                out.append(encode_control(inbound.rejections.popleft()))
            while inbound.repair_requests:
                out.append(encode_control(inbound.repair_requests.popleft()))
            while inbound.done_pending:
                done = inbound.take_done(MAX_DONE_IDS)
                out.append(encode_control(MessagesDone(done)))
                # said again (the sender asked): what a trainer took since is said too
                for msg_id in done:
                    if msg_id in inbound.taken:
                        self.owe_taken(msg_id)
            while self.taken_pending:  # after "done": the sender expects them in that order
                ids = tuple(self.taken_pending)[:MAX_DONE_IDS]
                for msg_id in ids:
                    del self.taken_pending[msg_id]
                out.append(encode_control(MessagesTaken(ids)))
            self.sent_frames.sent(path, b"".join(out[first:]), now)
        if self.route_owed and route is not None and path == route:
            self.route_owed = False
            out.append(encode_control(RouteChosen(route)))
        if (
            out
            and record is not None
            and now - self.credit_sent_at.get(path, -math.inf) >= CREDIT_REFRESH_S
        ):
            self.credit_sent_at[path] = now
            out.append(encode_control(Credit(granted_bytes)))
        return b"".join(out)

    def _end_to_end_path(self, route: str | None) -> str | None:
        """Where frames about whole messages go: the critical route, else the fastest
        usable path (a silent path would hold them back until it times out)."""
        usable = [n for n, r in self._paths.items() if r.open]
        if route in usable:
            return route
        if not usable:
            return next(iter(self._paths), None)
        return min(usable, key=lambda n: self._paths[n].sender.estimator.srtt_s)
