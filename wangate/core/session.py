"""Everything between this gateway and one peer gateway, with no I/O at all.

The daemon feeds it what arrived (``handle_datagram``, ``handle_control``) and the
time, and pulls what to send (``datagram_to_send(path)``, ``control_to_send(path)``)
whenever a path can take more, plus events (``next_event``) and the next deadline
(``get_timer``/``handle_timer``), as aioquic's ``QuicConnection`` is driven.

Flow control: the receiver grants cumulative message bytes (``Credit``, like QUIC's
MAX_DATA); the sender starts a message only when it fits the grant, so a receiver never
holds more than its inbox window plus one message.

Liveness (proto/delivery.md): the peer is *unreachable* once nothing at all has been
heard from it for ``peer_dead_s``; every message still queued for it then fails, and
``submit`` refuses new ones, until it is heard again. Only the timer and the inputs
commit that: a question (``status``, ``liveness``, ``peer_state``, ``path_snapshot``,
``check_reachable``) answers what the timer will commit, and changes nothing.

Delivery (proto/delivery.md): a message is *done* when the peer gateway holds all of it
(``MessagesDone``) and *taken* when a trainer there took it (``MessagesTaken``). Between
the two the sender keeps its (id, tag, step): if the peer restarts, those fail.

``PeerSession`` is the one facade, and its collaborators own their state, as aioquic's
``QuicConnection`` delegates to its recovery and streams: the paths' records and which
are up (``PathTable``, ``wangate.core.path_table``; one record is
``wangate.core.paths``), sending (``Sender``, ``wangate.core.sending``), what we owe the
peer on the control streams (``ControlOutbox``, ``wangate.core.control_outbox``) and
what it sends there (``ControlStreams``, ``wangate.core.control``), receiving
(``Reassembly``, ``wangate.core.inbound``), the peer's state (``PeerLiveness``,
``wangate.core.liveness``) and every deadline (``TimerTable``, ``wangate.core.timers``).
The session keeps what spans them: the order in which an input or the timer reaches
each (ARCHITECTURE.md, "The service order of a peer's session").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

from wangate.core.buffer import Buffer
from wangate.core.control import ControlStreams
from wangate.core.control_outbox import ControlOutbox
from wangate.core.events import Event, PeerStateChanged
from wangate.core.fairqueue import JobSendStats
from wangate.core.frames import (
    ControlFrame,
    ProbeDatagram,
    RepairDatagram,
    ShardSpan,
    decode_datagram,
)
from wangate.core.governor import BulkGovernor
from wangate.core.inbound import DEFAULT_IDLE_TIMEOUT_S, Allocate, Free, Reassembly
from wangate.core.jobs import JobPolicy
from wangate.core.liveness import DEFAULT_PEER_DEAD_S, PeerLiveness
from wangate.core.message import MessageHeader
from wangate.core.outbound import CodingPolicy
from wangate.core.path_table import PathTable
from wangate.core.paths import CRITICAL_ACK_DELAY_S, MAX_ACK_DELAY_S, PathRecord
from wangate.core.sending import Sender
from wangate.core.states import PathStateKind, PeerStateKind
from wangate.core.timers import LATE_TIMER_RECHECK_S as LATE_TIMER_RECHECK_S
from wangate.core.timers import LATE_TIMER_S as LATE_TIMER_S
from wangate.core.timers import TimerTable
from wangate.engine._engine import ReadDatagrams, place_shards
from wangate.errors import LocalProtocolError, PeerUnreachable, RemoteProtocolError

# After a late timer (``wangate.core.timers``) the peer has this many of its best path's
# round trips (at least ANSWER_MIN_S) to answer what we send on waking before it can be
# judged unreachable.
ANSWER_RTTS: Final = 3
ANSWER_MIN_S: Final = 0.05
# what ``place_shards`` makes of consecutive shards it wrote in (wangate/engine/src/py_shards.c):
# (msg_id, msg_len, start, end, seq_first, seq_last, count, size_bytes, critical,
#  stamp_first, stamp_last, jitter_s)
ShardRun = tuple[int, int, int, int, int, int, int, int, bool, int, int, float]


class PeerSession:
    """One peer's session: its collaborators (see the module notes) share its event
    queue and its path table's records; what an input or the timer does is here."""

    def __init__(
        self,
        local_site: str,
        peer: str,
        *,
        max_message_bytes: int,
        inbox_window_bytes: int,
        now: float,
        coding: CodingPolicy | None = None,
        governor: BulkGovernor | None = None,
        partial_idle_s: float = DEFAULT_IDLE_TIMEOUT_S,
        peer_dead_s: float = DEFAULT_PEER_DEAD_S,
        configured_paths: int = 0,
        screen: Callable[[MessageHeader], str | None] | None = None,
    ) -> None:
        self.local_site = local_site
        self.peer = peer
        self.max_message_bytes = max_message_bytes
        # a window below one message could never admit that message
        self.inbox_window_bytes = max(inbox_window_bytes, max_message_bytes)
        self._events: deque[Event] = deque()
        self._path_table = PathTable(self._events, configured_paths)
        self._paths = self._path_table.records  # shared with the sender and the control
        self._inbound = Reassembly(
            max_message_bytes,
            self.inbox_window_bytes,
            self._events,
            idle_timeout_s=partial_idle_s,
            screen=screen,
        )
        self._control_outbox = ControlOutbox(self._paths, self._inbound)
        self._send = Sender(
            local_site, peer, self._paths, self._events, self._control_outbox, now, coding, governor
        )
        self._queue, self._scheduler = self._send.queue, self._send.scheduler
        self._liveness = PeerLiveness(peer_dead_s, now)
        self._control = ControlStreams(
            self._events, self._send, self._inbound, self.inbox_window_bytes
        )
        self._timers = TimerTable()
        self._largest_msg_id_in = 0  # against which truncated message ids are expanded

    @property
    def configured_paths(self) -> int:
        """The peer is "up" only with this many paths up."""
        return self._path_table.configured_paths

    @configured_paths.setter
    def configured_paths(self, count: int) -> None:
        self._path_table.configured_paths = count

    @property
    def late_timers(self) -> int:
        """Timers that fired late enough to wait for a read first."""
        return self._timers.late_timers

    # ------------------------------------------------------------------- paths

    @property
    def path_names(self) -> list[str]:
        return list(self._paths)

    def path_up(self, path: str, *, datagram_bytes: int, now: float) -> None:
        """A path's connection is established and authenticated."""
        record = self._path_table.connect(path, datagram_bytes, now)
        self._heard_peer(now)
        self._control_outbox.owe_credit(path)
        self._control_outbox.owe_route()
        # a degraded path whose connection was replaced is not news
        quiet = not record.usable
        self._path_table.move(path, record, PathStateKind.UP, "connected", quiet=quiet)
        self._send.reselect(now)

    def path_down(self, path: str, now: float, reason: str) -> None:
        """A path's connection closed: whatever it had in flight goes out elsewhere."""
        record = self._paths.get(path)
        if record is None:
            return
        self._gone(path, record, now)
        self._path_table.disconnect(path, record, reason)
        self._send.reselect(now)

    def _gone(self, path: str, record: PathRecord, now: float) -> None:
        """``path`` carries nothing more (closed, or silent past its timeout): what it had
        in flight goes out elsewhere, and so do the frames about whole messages it may
        have taken with it."""
        self._send.outcomes.requeue(record, self._path_table.outage(record), outage=True)
        self._control_outbox.path_lost(path, now)

    def peer_restarted(self, now: float) -> None:
        """The peer came back as a new instance: it forgot everything in progress, and
        every message it held for its trainers is lost."""
        self._send.peer_restarted()
        self._control.peer_restarted()
        self._control_outbox.peer_restarted()
        self._liveness.restarted(now)
        self._update_liveness(now)
        self._path_table.peer_restarted()
        self._largest_msg_id_in = 0
        self._inbound.peer_restarted()

    # ---------------------------------------------------------------- liveness

    def silent_s(self, now: float) -> float:
        """How long nothing has been heard from the peer (since start if never)."""
        return self._liveness.silent_s(now)

    def peer_state(self, now: float) -> tuple[PeerStateKind, str]:
        """(state, reason): the state is up, degraded, unreachable or restarted."""
        state = self._judged_state(now)
        return state, self._liveness.reason(now, *self._path_table.paths_up(), state)

    def _update_liveness(self, now: float) -> None:
        liveness = self._liveness
        paths = self._path_table.paths_up()
        state = liveness.classify(now, *paths)
        if state == PeerStateKind.UNREACHABLE and not liveness.unreachable:
            liveness.unreachable = True
            self._send.fail_all(f"peer {self.peer} unreachable: {liveness.silence_reason(now)}")
        if liveness.move(state):
            self._events.append(PeerStateChanged(state, liveness.reason(now, *paths)))

    def _heard_peer(self, now: float) -> None:
        if self._liveness.heard(now):
            self._update_liveness(now)  # back: traffic resumes by itself

    def _held_up(self, now: float) -> bool:
        """Whether our own timer is overdue, or fired late not long ago: then the process
        was held up and the peer's silence includes ours. What the peer sent meanwhile
        may wait unread, or it may have sent nothing (no DATAGRAM gets through a window
        full of ours unacknowledged). So the timer judges the peer only once it had the
        time to answer what we send on waking (``TimerTable``, ``_answer_wait_s``)."""
        return self._timers.held_up(now)

    def _answer_wait_s(self) -> float:
        """How long the peer may take to answer: a few round trips of its best path."""
        wait_s = max(ANSWER_MIN_S, ANSWER_RTTS * self._path_table.best_srtt_s())
        return min(wait_s, self._liveness.peer_dead_s)

    def _judged_state(self, now: float) -> PeerStateKind:
        """The peer's state at ``now`` as the timer commits it, for a question (status,
        paths, a send): nothing changes. While held up, the state last committed."""
        if self._held_up(now):
            return self._liveness.state
        return self._liveness.classify(now, *self._path_table.paths_up())

    def check_reachable(self, now: float) -> None:
        """Raise ``PeerUnreachable`` while the peer is unreachable."""
        liveness = self._liveness
        if self._judged_state(now) == PeerStateKind.UNREACHABLE:
            raise PeerUnreachable(
                f"peer {self.peer} is unreachable: {liveness.silence_reason(now)} "
                f"(limits.peer_dead_s = {liveness.peer_dead_s:g}); it fails until heard again"
            )

    @property
    def unreachable(self) -> bool:
        """Declared unreachable: its messages failed (by the timer, or a submit)."""
        return self._liveness.unreachable

    # ----------------------------------------------------------------- sending

    @property
    def last_msg_id(self) -> int:
        return self._send.last_msg_id

    def message_state(self, msg_id: int) -> str | None:
        """``sending``, ``held`` (the peer holds it, no trainer took it yet), or None
        when this session no longer knows it (taken, failed, or never sent)."""
        if self._send.knows(msg_id):
            return "sending"
        return "held" if msg_id in self._control.held else None

    def use_body_buffers(
        self, allocate: Allocate, free: Free, progress_min_bytes: float = math.inf
    ) -> None:
        """Where inbound message bodies are assembled (default: a bytearray each), and
        from what size they report progress (``MessageProgress``)."""
        self._inbound.use_buffers(allocate, free, progress_min_bytes)

    def submit(
        self,
        header: MessageHeader,
        payload: Buffer,
        now: float,
        *,
        deadline_at: float | None = None,
    ) -> int:
        """Queue a message; with ``deadline_at`` it fails unless confirmed by then."""
        head = header.encode()
        size = len(head) + len(memoryview(payload).cast("B"))
        if size > self.max_message_bytes:
            raise LocalProtocolError(
                f"message of {size} bytes exceeds this gateway's limit of {self.max_message_bytes}"
            )
        if not self._held_up(now):
            self._update_liveness(now)  # an input: a peer found unreachable fails its messages
        self.check_reachable(now)
        return self._send.add(header, head, payload, now, deadline_at)

    def set_served_jobs(self, jobs: frozenset[str] | None) -> None:
        """The jobs whose messages this site takes; a message of another is rejected to
        its sender (``REJECT_UNKNOWN_JOB``). None: every job."""
        self._inbound.jobs = jobs

    def set_peer_limits(self, max_message_bytes: int) -> None:
        self._send.outbox.peer_max_message = max_message_bytes

    def set_jobs(self, policies: Mapping[str, JobPolicy], now: float | None = None) -> None:
        """How the jobs share sending to this peer (``wangate.core.jobs``): weight,
        paths, cap of bytes held at the peer; a job with none gets ``JobPolicy()``.
        It applies to queued messages too; pass ``now`` to start at once what a raised
        cap allows."""
        self._send.set_jobs(policies, now)

    def job_stats(self) -> dict[str, JobSendStats]:
        """Per job: bytes and datagrams sent per path, messages started and in flight,
        bytes held at the peer, waiting for credit, critical debt (a read)."""
        return self._send.job_stats()

    def pending_bytes(self) -> int:
        return self._send.pending_bytes()

    def datagram_to_send(self, path: str, now: float) -> bytes | None:
        """The next datagram for ``path``: data, a repair or a keep-alive probe; None
        when it has nothing to carry now."""
        return self._send.datagram_to_send(path, now)

    def send_batch(self, path: str, now: float, limit: int) -> list[bytes | ShardSpan]:
        """Up to ``limit`` datagrams for ``path``, as ``datagram_to_send`` one after
        another would give them; a run of one message's shards as one ``ShardSpan``
        (which the engine frames: ``PathChannel.queue_many``)."""
        return self._send.send_batch(path, now, limit)

    def datagrams_to_send(self, path: str, now: float, limit: int) -> list[bytes]:
        """``send_batch``, every datagram as bytes."""
        return self._send.datagrams_to_send(path, now, limit)

    def has_critical_for(self, path: str) -> bool:
        """Whether critical work (or a duplicate of it) waits that ``path`` would carry."""
        return self._send.has_critical_for(path)

    def control_to_send(self, path: str, now: float) -> bytes:
        """Control frames due on ``path``'s stream (may be empty)."""
        route = self._scheduler.selector.current
        granted = self._control.granted_bytes
        return self._control_outbox.to_send(path, now, granted_bytes=granted, route=route)

    # --------------------------------------------------------------- receiving

    def handle_datagram(self, path: str, data: bytes, now: float) -> None:
        """One DATAGRAM frame from the peer; raises RemoteProtocolError if malformed."""
        record = self._paths.get(path)
        if record is None:
            raise LocalProtocolError(f"datagram on path {path} that is not up")
        self._heard(path, record, now)
        self._handle_datagram(record, data, now)

    def handle_datagrams(
        self, path: str, datagrams: list[bytes] | ReadDatagrams, now: float
    ) -> list[RemoteProtocolError]:
        """DATAGRAM frames read together on ``path`` (a list, or a read's frames where
        they lie), each as ``handle_datagram`` would: the malformed ones' errors, in
        order (the rest are handled all the same)."""
        record = self._paths.get(path)
        if record is None:
            raise LocalProtocolError(f"datagram on path {path} that is not up")
        self._heard(path, record, now)
        errors: list[RemoteProtocolError] = []
        # the usual shards of messages under way are written into their bodies in C and
        # come back as runs; the rest as they came, each handled on its own
        placed = place_shards(
            datagrams, self._inbound.placeable, record.receiver.newest_seq, self._largest_msg_id_in
        )
        for item in placed:
            if isinstance(item, tuple):
                self._handle_run(record, item, now)
                continue
            try:
                self._handle_datagram(record, item, now)
            except RemoteProtocolError as exc:
                errors.append(exc)
        return errors

    def _handle_run(self, record: PathRecord, run: ShardRun, now: float) -> None:
        """Shards ``place_shards`` wrote in, as ``_handle_datagram`` would each."""
        msg_id, msg_len, start, end = run[0], run[1], run[2], run[3]
        seq_first, seq_last, count, size_bytes = run[4], run[5], run[6], run[7]
        critical, stamp_first, stamp_last, jitter_s = run[8], run[9], run[10], run[11]
        receiver, estimator = record.receiver, record.sender.estimator
        estimator.on_transit_sample(now - receiver.sender_clock_s(stamp_first), now)
        if count > 1:
            last_transit_s = now - receiver.sender_clock_s(stamp_last)
            estimator.on_transit_run(count - 1, jitter_s, last_transit_s)
        if msg_id > self._largest_msg_id_in:
            self._largest_msg_id_in = msg_id
        if self._inbound.accept_run(msg_id, msg_len, start, end, now):
            receiver.received_bytes += size_bytes
            ack_within_s = CRITICAL_ACK_DELAY_S if critical else MAX_ACK_DELAY_S
            receiver.on_datagrams(seq_first, seq_last, stamp_last, now, ack_within_s)

    def _handle_datagram(self, record: PathRecord, data: bytes, now: float) -> None:
        receiver, sender = record.receiver, record.sender
        datagram = decode_datagram(data, receiver.newest_seq, self._largest_msg_id_in)
        sender.estimator.on_transit_sample(now - receiver.sender_clock_s(datagram.sent_stamp), now)
        if isinstance(datagram, ProbeDatagram):
            record.probe_heard_at = now
            receiver.on_datagram(datagram.path_seq, datagram.sent_stamp, now, ack_within_s=0.0)
            return
        if datagram.msg_id > self._largest_msg_id_in:
            self._largest_msg_id_in = datagram.msg_id
        if isinstance(datagram, RepairDatagram):
            accepted = self._inbound.accept_repair(datagram, now)
        else:
            accepted = self._inbound.accept_shard(datagram, now)
        if accepted:
            receiver.received_bytes += len(data)
            ack_within_s = CRITICAL_ACK_DELAY_S if datagram.critical else MAX_ACK_DELAY_S
            receiver.on_datagram(datagram.path_seq, datagram.sent_stamp, now, ack_within_s)

    def consumed(self, body_bytes: int, msg_id: int = 0) -> None:
        """A trainer took received message ``msg_id``: its bytes no longer count against
        the window, and the sender learns it was delivered."""
        self._inbound.release(body_bytes, msg_id)
        self._control_outbox.owe_credit_everywhere()
        if msg_id:
            self._control_outbox.owe_taken(msg_id)

    @property
    def granted_bytes(self) -> int:
        return self._control.granted_bytes

    def _heard(self, path: str, record: PathRecord, now: float) -> None:
        """Anything at all arrived on ``path``: a path declared down is back."""
        self._heard_peer(now)
        self._path_table.heard(path, record, now)

    def handle_control(self, path: str, frame: ControlFrame, now: float) -> None:
        """One control frame from the peer on ``path``'s stream, dispatched by its type;
        a frame with no handler here (a second ``Hello``) is the peer's error."""
        self._control.check(path, frame)
        record = self._paths.get(path)
        if record is not None:
            self._heard(path, record, now)
        self._control.handle(path, frame, now)

    # ------------------------------------------------------------ timers/events

    def get_timer(self) -> float | None:
        """The next deadline: the timer table's earliest, each named deadline set afresh
        from its owner (a name absent: not now)."""
        timers = self._timers
        deadlines = self._send.deadlines()
        # the peer is not judged before the answer-by hold
        deadlines["peer liveness"] = timers.not_before_answer(self._liveness.next_change_at())
        inbound = self._inbound
        if inbound.inbound and self._path_table.hearing_peer():  # get_timer runs per datagram
            expiry = inbound.next_expiry()
            if expiry is not None:
                deadlines["inbound expiry"] = expiry
        for name, record in self._paths.items():
            if not record.connected:
                continue  # nothing in flight, nothing owed, and no probe until path_up
            sender = record.sender
            loss = sender.loss_deadline()
            if loss is not None:
                deadlines["loss", name] = loss
            deadlines["probe", name] = self._send.probe_due_at(name, record)
            heard_at = sender.estimator.last_heard_at
            if record.usable and heard_at is not None:
                deadlines["silence", name] = heard_at + sender.estimator.silence_timeout_s()
            ack = record.receiver.ack_deadline()
            if ack is not None:
                deadlines["ack", name] = ack
        return timers.arm(deadlines)

    def _expire_inbound(self, now: float) -> None:
        inbound = self._inbound
        if not inbound.inbound:
            return
        if not self._path_table.hearing_peer():
            inbound.restart_clocks(now)  # an outage does not make the peer's messages idle
            return
        dropped = len(inbound.rejections)
        inbound.expire(now)
        if len(inbound.rejections) > dropped:
            self._control_outbox.owe_credit_everywhere()  # their bytes count as consumed

    def handle_timer(self, now: float) -> None:
        """The timer fired: unless it is late (``TimerTable``), the session's service
        in its fixed order. Every step runs at every timer, not only at its own
        deadline: the peer's liveness and the paths' states commit what inputs changed
        since, whatever deadline woke it, and the order fixes the events'."""
        timers = self._timers
        if timers.defer_if_late(now, self._answer_wait_s):
            return
        if timers.answer_due(now):
            self._update_liveness(now)
        send = self._send
        send.expire(now)
        self._expire_inbound(now)
        changed = False
        table = self._path_table
        for name, record in self._paths.items():
            sender = record.sender
            send.outcomes.requeue(record, sender.detect_lost(now, alone=send.outcomes.alone(name)))
            if not record.connected:
                continue
            moved, went_down = table.judge(name, record, now)
            changed |= moved
            if went_down:
                self._gone(name, record, now)
        if changed or now >= send.scheduler.next_select_at:
            send.reselect(now)
        send.check_done(now)

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    # ------------------------------------------------------------------- views

    def path_snapshot(self, path: str, now: float) -> dict[str, object]:
        scheduler = self._scheduler
        change = scheduler.last_change
        routing: dict[str, object] = {
            "role": scheduler.role(path),
            "peer_role": "critical" if self._control.peer_critical_path == path else "bulk",
            "last_switch_s": None if change is None else round(now - change.at, 3),
            "last_switch_reason": None if change is None else change.reason,
        }
        peer_state = self._judged_state(now)
        silence = self._liveness.silence_reason(now)
        return self._path_table.snapshot(path, now, routing, peer_state, silence)

    @property
    def messages_received(self) -> int:
        return self._inbound.messages_received

    def liveness(self, now: float) -> dict[str, object]:
        """The peer's state as ``status`` shows it (proto/delivery.md)."""
        state, reason = self.peer_state(now)
        return {
            "state": state,
            "state_reason": reason,
            "silent_s": round(self.silent_s(now), 3),
            "messages_held": len(self._control.held),  # done, no trainer there took it yet
        }

    def status(self) -> dict[str, int]:
        send, queue, inbound = self._send, self._queue, self._inbound
        return {
            "messages_sent": send.messages_sent,
            "messages_received": inbound.messages_received,
            "bytes_sent": send.bytes_sent,
            "bytes_received": inbound.bytes_received,
            "messages_waiting": len(send.outbox.waiting),
            "messages_in_flight": len(queue.messages),
            "inbound_in_progress": len(inbound.inbound),
            "repair_datagrams": send.repair_datagrams,
            "send_gaps": send.send_gaps,
            "late_timers": self._timers.late_timers,
            "send_gap_us": int(send.send_gap_s * 1e6),
            "repair_bytes": queue.repair_bytes,
            "source_bytes": queue.source_bytes,
            "fec_bytes": queue.fec_bytes,
            "fec_upfront_bytes": queue.fec_upfront_bytes,
            "fec_upfront_blocks": queue.fec_upfront_blocks,
            "fec_mid_blocks": queue.fec_mid_blocks,
            "fec_tail_bytes": min(queue.tail_bytes, 1 << 40),
            "fec_repair_per_block": queue.repair_count,
            "blocks_decoded": inbound.blocks_decoded,
            "symbols_recovered": inbound.symbols_recovered,
            "ranges_missing_sent": inbound.ranges_missing_sent,
            "ranges_resent": queue.ranges_resent,
            "peer_granted_bytes": send.outbox.granted_bytes,
            # bulk's rate while critical traffic flows and the hosts are busy (0: no limit)
            "bulk_limit_bps": int(send.governor.rate_bps or 0),
            "bulk_limit_cuts": send.governor.cuts,
        }
