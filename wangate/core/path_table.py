"""The session's paths to one peer: a record per path, which are up, and what a path
shows in ``paths``.

Part of ``PeerSession``. The table owns the records (``PathRecord``, by name, in the
order the paths first came up) and every change of a path's state: up when its
connection is, down when it closes or goes silent past its timeout, up again when it
is heard. A record outlives its connection: a path that comes back keeps its
estimator, its byte counts and the references the peer's truncated numbers expand
against. The sender and the control streams read the same records (``records``); what
a change means to them (sending again what a path had in flight, the frames it took
with it) is the session's to do, in its order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Final

from wangate.core.estimator import PathEstimator
from wangate.core.events import Event, PathStateChanged
from wangate.core.frames import MAX_DATAGRAM_HEADER_BYTES
from wangate.core.liveness import PEER_QUIET_S
from wangate.core.paths import PathReceiver, PathRecord, PathSender, SentDatagram
from wangate.core.states import PathStateKind, PeerStateKind
from wangate.errors import LocalProtocolError

MIN_DATAGRAM_BYTES: Final = MAX_DATAGRAM_HEADER_BYTES + 64


class PathTable:
    """Every path's record, and the bookkeeping of which are up (``PathStateChanged``
    goes on the session's event queue, shared)."""

    def __init__(self, events: deque[Event], configured_paths: int = 0) -> None:
        self.records: dict[str, PathRecord] = {}  # shared with the sender and the control
        self._events = events
        self.configured_paths = configured_paths  # the peer is "up" only with this many

    def get(self, path: str) -> PathRecord | None:
        return self.records.get(path)

    def connect(self, path: str, datagram_bytes: int, now: float) -> PathRecord:
        """``path``'s connection is up, carrying datagrams of ``datagram_bytes``: its
        record (new, or the one it had), connected and heard now. Its state moves with
        ``move`` once the session has heard the peer."""
        if datagram_bytes < MIN_DATAGRAM_BYTES:
            raise LocalProtocolError(f"path {path}: datagrams of {datagram_bytes} B are too small")
        record = self.records.get(path)
        if record is None:
            record = PathRecord(PathSender(path, datagram_bytes, PathEstimator()), PathReceiver())
            self.records[path] = record
        sender = record.sender
        sender.datagram_bytes = datagram_bytes
        record.connected = True
        sender.last_sent_at = now  # first probe after an interval: the peer may not be ready
        sender.estimator.on_heard(now)
        return record

    def disconnect(self, path: str, record: PathRecord, reason: str) -> None:
        """``path``'s connection closed (its in-flight data already taken, ``outage``)."""
        record.connected = False
        self.move(path, record, PathStateKind.DOWN, reason)
        # acks owed on the old connection die with it; the byte count carries on, and so
        # do the references the peer's truncated sequence numbers and stamps expand against
        old = record.receiver
        record.receiver = PathReceiver(
            newest_seq=old.newest_seq,
            clock_units=old.clock_units,
            received_bytes=old.received_bytes,
        )

    def outage(self, record: PathRecord) -> list[SentDatagram]:
        """The path carries nothing more (closed, or silent past its timeout): what it
        had in flight, taken for the session to send elsewhere; the losses that led up
        to it were the outage, not the path's loss rate."""
        lost = record.sender.take_all_inflight()
        record.sender.estimator.forget_losses()
        return lost

    def move(
        self, path: str, record: PathRecord, state: PathStateKind, why: str, *, quiet: bool = False
    ) -> bool:
        """Every change of a path's state: reported as ``PathStateChanged`` unless
        ``quiet``; whether it changed."""
        changed = record.move(path, state, why)
        if changed and not quiet:
            self._events.append(PathStateChanged(path, state, why))
        return changed

    def heard(self, path: str, record: PathRecord, now: float) -> None:
        """Anything at all arrived on ``path``: a path declared down is back."""
        record.sender.estimator.on_heard(now)
        if not record.usable and record.connected:
            record.sender.back_at = now
            self.move(path, record, PathStateKind.UP, "heard again")

    def judge(self, path: str, record: PathRecord, now: float) -> tuple[bool, bool]:
        """Move a connected path to what its estimator says at ``now``: (whether its
        state changed, whether it went down just now)."""
        state = record.sender.estimator.state(now)
        went_down = record.usable and state.kind == PathStateKind.DOWN
        return self.move(path, record, state.kind, state.reason), went_down

    def peer_restarted(self) -> None:
        """The peer is a new instance: nothing of ours is in flight to it any more (nor
        in the path's estimate of it), and it counts its sequence numbers and its clock
        afresh."""
        for record in self.records.values():
            estimator = record.sender.estimator
            for sent in record.sender.take_all_inflight():
                estimator.on_abandoned(sent.size_bytes, sent.sent_at)
            record.receiver = PathReceiver(received_bytes=record.receiver.received_bytes)

    # ------------------------------------------------------------------- reads

    def paths_up(self) -> tuple[int, int]:
        """(paths connected and up, paths there should be) for the peer's liveness."""
        up = sum(1 for r in self.records.values() if r.connected and r.state == PathStateKind.UP)
        return up, max(self.configured_paths, len(self.records))

    def hearing_peer(self) -> bool:
        """Whether any path may carry data now."""
        return any(r.open for r in self.records.values())

    def best_srtt_s(self) -> float:
        """The smoothed RTT of the fastest connected path (0 with none)."""
        return min(
            (r.sender.estimator.srtt_s for r in self.records.values() if r.connected),
            default=0.0,
        )

    def snapshot(
        self,
        path: str,
        now: float,
        routing: Mapping[str, object],
        peer_state: PeerStateKind,
        peer_silence: str,
    ) -> dict[str, object]:
        """``path``'s row for ``paths``: its estimator's, its own counters, then
        ``routing`` (the sender's view of it), then its state as the peer's liveness
        makes it (``peer_silence``: why the peer is unreachable, if it is)."""
        record = self.records[path]
        sender = record.sender
        row: dict[str, object] = dict(sender.estimator.snapshot(now))
        row["recv_bytes"] = record.receiver.received_bytes
        row["usable"] = record.usable
        row["spurious_losses"] = sender.spurious_losses
        row["rto_ms"] = sender.retransmission_timeout_s() * 1e3
        row.update(routing)
        # A silent peer's paths are not "up" while the path's own timeout runs (it is
        # generous so a busy host does not flap): they follow the peer's silence.
        heard_at = sender.estimator.last_heard_at
        silent_s = math.inf if heard_at is None else now - heard_at
        if peer_state == PeerStateKind.UNREACHABLE:
            row["state"] = PathStateKind.DOWN
            row["state_reason"] = f"peer unreachable: {peer_silence}"
        elif silent_s > PEER_QUIET_S and row.get("state") == PathStateKind.UP:
            row["state"] = PathStateKind.DEGRADED
            row["state_reason"] = f"silent for {silent_s:.1f} s"
        row["peer_state"] = peer_state
        return row
