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
``submit`` refuses new ones, until it is heard again.

Delivery (proto/delivery.md): a message is *done* when the peer gateway holds all of it
(``MessagesDone``) and *taken* when a trainer there took it (``MessagesTaken``). Between
the two the sender keeps its (id, tag, step): if the peer restarts, those fail.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from wangate.core.buffer import Buffer
from wangate.core.estimator import PathEstimator
from wangate.core.events import (
    Event,
    MessageDelivered,
    MessageTaken,
    PathStateChanged,
    PeerStateChanged,
    SendFailed,
)
from wangate.core.fec import parity_for_loss
from wangate.core.frames import (
    MAX_DATAGRAM_HEADER_BYTES,
    MAX_DONE_IDS,
    Ack,
    ControlFrame,
    Credit,
    MessageRejected,
    MessagesDone,
    MessagesTaken,
    ProbeDatagram,
    RepairDatagram,
    RepairRequested,
    RouteChosen,
    decode_datagram,
    encode_control,
    encode_probe,
    encode_repair,
    encode_shard,
    message_header_bytes,
    stamp,
    stamp_age_s,
)
from wangate.core.governor import BulkGovernor, common_delay_s
from wangate.core.inbound import (
    DEFAULT_IDLE_TIMEOUT_S,
    MAX_DONE_PENDING,
    Allocate,
    Free,
    Reassembly,
)
from wangate.core.liveness import DEFAULT_PEER_DEAD_S, PEER_QUIET_S, PeerLiveness
from wangate.core.message import MessageHeader
from wangate.core.outbound import CodingPolicy, OutboundMessage, OutboundQueue, Piece
from wangate.core.outbox import Outbox
from wangate.core.paths import (
    CRITICAL_ACK_DELAY_S,
    MAX_ACK_DELAY_S,
    PathReceiver,
    PathSender,
    SentDatagram,
    repair_horizon_bytes,
)
from wangate.core.replay import SentFrames
from wangate.core.scheduler import (
    CRITICAL_ACTIVE_S,
    IDLE_SELECT_INTERVAL_S,
    SELECT_INTERVAL_S,
    PathScheduler,
)
from wangate.core.states import PATH_TRANSITIONS, PathStateKind, PeerStateKind, check_transition
from wangate.errors import LocalProtocolError, PeerUnreachable, RemoteProtocolError

PROBE_INTERVAL_S = 0.1  # keep-alive probe on an idle path (RTT stays fresh)
# An idle path needs one probe per interval between the two sites, not one each way:
# the site whose name sorts first probes; the other answers each probe at once, so each
# side hears the other within the interval. The answering site probes only if the
# prober's next probe is this late (two intervals: a late timer on a busy host does not
# make both sides probe), and at least this often for its own RTT samples.
ANSWERED_PROBE_WAIT_S = 2 * PROBE_INTERVAL_S
ANSWERED_PROBE_INTERVAL_S = 1.0
# Re-advertise credit on a path at most this often, along with other control frames
# that go on it anyway (never a packet of its own: the stream is reliable, and a path
# that comes up, or consumption, sends credit at once)
CREDIT_REFRESH_S = 1.0
# A timer that fires this late says our process was held up (a busy host): acks that
# arrived meanwhile may still wait unread, and judging the paths now would declare lost
# what they cover (each in-flight datagram past its timeout: a second of repairs for
# nothing). The timer's work waits for one more turn of the driver's loop, which reads
# the sockets first (no timer is armed sooner than 1 ms: uvloop polls before it fires).
LATE_TIMER_S = 0.005
LATE_TIMER_RECHECK_S = 0.001
DONE_TIMEOUT_S = 1.0  # all acked but no "done" from the receiver: ask again after this
DONE_CHECK_S = 0.25
MIN_DATAGRAM_BYTES = MAX_DATAGRAM_HEADER_BYTES + 64
MAX_HELD_RECORDS = 1 << 20  # done-not-taken records kept per peer (a few dozen bytes each)


@dataclass
class PathRecord:
    """Everything the session knows of one path, in one place.

    ``connected``: the shell reported the path's connection up (``path_up``) and not
    since down; ``state``/``why``: what was last reported as ``PathStateChanged``.
    """

    sender: PathSender
    receiver: PathReceiver
    connected: bool = True
    state: PathStateKind = PathStateKind.UP
    why: str = "connected"
    probe_heard_at: float = -math.inf  # the peer's last keep-alive probe on this path
    credit_sent_at: float = -math.inf

    @property
    def usable(self) -> bool:
        """Not declared down: neither closed nor silent past its timeout."""
        return self.state != PathStateKind.DOWN

    @property
    def open(self) -> bool:
        """May carry data now."""
        return self.usable and self.connected

    def move(self, name: str, state: PathStateKind, why: str) -> bool:
        """The path is ``state`` for ``why`` from now on; whether that changes its state
        (``PATH_TRANSITIONS``)."""
        changed = check_transition(PATH_TRANSITIONS, self.state, state, f"path {name}")
        self.state, self.why = state, why
        return changed


class PeerSession:
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
        self._paths: dict[str, PathRecord] = {}

        # sending
        self._next_msg_id = 1
        self._outbox = Outbox(peer)  # submitted, not yet admitted by credit; deadlines
        self._queue = OutboundQueue(coding)
        self._queue.waiting = self._outbox.waiting
        self._queue.header_bytes = message_header_bytes
        self._scheduler = PathScheduler()
        self._route_dirty = False  # tell the peer our critical route
        self._last_critical_at = -CRITICAL_ACTIVE_S
        # without one, bulk is never slowed for critical traffic ([critical] in config)
        self._governor = governor or BulkGovernor(target_delay_s=math.inf)
        self.peer_critical_path: str | None = None  # the path the peer sends critical data on

        self._liveness = PeerLiveness(peer_dead_s, now)
        self.configured_paths = configured_paths
        # done (the peer holds it) but not taken by a trainer there: id -> (tag, step)
        self._held: dict[int, tuple[str, int]] = {}

        # receiving
        self._inbound = Reassembly(
            max_message_bytes,
            self.inbox_window_bytes,
            self._events,
            idle_timeout_s=partial_idle_s,
            screen=screen,
        )
        self._credit_dirty: set[str] = set()
        self._largest_msg_id_in = 0  # against which truncated message ids are expanded
        self._taken_pending: dict[int, None] = {}  # ordered set of ids to report taken
        self._sent_frames = SentFrames()  # end-to-end frames each path carried lately
        self._replay = b""  # such frames a path took down with it: they go again
        self._done_check_at = now + DONE_CHECK_S
        self._timer_at: float | None = None  # what get_timer last asked for
        self._recheck_at: float | None = None  # a late timer's work, after a read

        self.messages_sent = 0
        self.bytes_sent = 0
        self.repair_datagrams = 0
        # paths left without data between one message's last byte and the next one's
        self._dry_since: float | None = None
        self.send_gaps = 0
        self.late_timers = 0  # timers that fired late enough to wait for a read first
        self.send_gap_s = 0.0

    # ------------------------------------------------------------------- paths

    @property
    def path_names(self) -> list[str]:
        return list(self._paths)

    def path_up(self, path: str, *, datagram_bytes: int, now: float) -> None:
        """A path's connection is established and authenticated."""
        if datagram_bytes < MIN_DATAGRAM_BYTES:
            raise LocalProtocolError(f"path {path}: datagrams of {datagram_bytes} B are too small")
        record = self._paths.get(path)
        if record is None:
            record = PathRecord(PathSender(path, datagram_bytes, PathEstimator()), PathReceiver())
            self._paths[path] = record
        sender = record.sender
        sender.datagram_bytes = datagram_bytes
        record.connected = True
        sender.last_sent_at = now  # first probe after an interval: the peer may not be ready
        sender.estimator.on_heard(now)
        self._heard_peer(now)
        self._credit_dirty.add(path)
        self._route_dirty = True
        # a degraded path whose connection was replaced is not news
        self._move_path(path, record, PathStateKind.UP, "connected", quiet=not record.usable)
        self._reselect(now)

    def path_down(self, path: str, now: float, reason: str) -> None:
        """A path's connection closed: whatever it had in flight goes out elsewhere."""
        record = self._paths.get(path)
        if record is None:
            return
        self._gone(path, record, now)
        record.connected = False
        self._move_path(path, record, PathStateKind.DOWN, reason)
        # acks owed on the old connection die with it; the byte count carries on, and so
        # do the references the peer's truncated sequence numbers and stamps expand against
        old = record.receiver
        record.receiver = PathReceiver(
            newest_seq=old.newest_seq,
            clock_units=old.clock_units,
            received_bytes=old.received_bytes,
        )
        self._reselect(now)

    def _gone(self, path: str, record: PathRecord, now: float) -> None:
        """``path`` carries nothing more (closed, or silent past its timeout): what it had
        in flight goes out elsewhere, and so do the frames about whole messages it may
        have taken with it."""
        sender = record.sender
        self._requeue(record, sender.take_all_inflight(), outage=True)
        sender.estimator.forget_losses()
        self._replay += self._sent_frames.lost_with(path, now)

    def _move_path(
        self, path: str, record: PathRecord, state: PathStateKind, why: str, *, quiet: bool = False
    ) -> bool:
        """Every change of a path's state: reported as ``PathStateChanged`` unless
        ``quiet``; whether it changed."""
        changed = record.move(path, state, why)
        if changed and not quiet:
            self._events.append(PathStateChanged(path, state, why))
        return changed

    def peer_restarted(self, now: float) -> None:
        """The peer came back as a new instance: it forgot everything in progress, and
        every message it held for its trainers is lost."""
        for message in self._queue.clear():
            self._events.append(
                SendFailed(
                    message.msg_id,
                    f"peer {self.peer} restarted mid-message",
                    message.tag,
                    message.step,
                )
            )
        for msg_id, (tag, step) in self._held.items():
            self._events.append(
                SendFailed(
                    msg_id,
                    f"peer {self.peer} restarted with it in its inbox, before a trainer took it",
                    tag,
                    step,
                )
            )
        self._held.clear()
        self._liveness.restarted(now)
        self._update_liveness(now)
        for record in self._paths.values():
            record.sender.take_all_inflight()
            # the new instance counts its sequence numbers and its clock afresh
            record.receiver = PathReceiver(received_bytes=record.receiver.received_bytes)
        self._largest_msg_id_in = 0
        self._outbox.reset()
        self._inbound.peer_restarted()
        # frames about the old instance's messages would name the new one's
        self._sent_frames = SentFrames()
        self._replay = b""
        self._credit_dirty.update(self._paths)

    # ---------------------------------------------------------------- liveness

    def silent_s(self, now: float) -> float:
        """How long nothing has been heard from the peer (since start if never)."""
        return self._liveness.silent_s(now)

    def peer_state(self, now: float) -> tuple[PeerStateKind, str]:
        """(state, reason): the state is up, degraded, unreachable or restarted."""
        state = self._judged_state(now)
        return state, self._liveness.reason(now, *self._paths_up(), state)

    def _paths_up(self) -> tuple[int, int]:
        up = sum(1 for r in self._paths.values() if r.connected and r.state == PathStateKind.UP)
        return up, max(self.configured_paths, len(self._paths))

    def _update_liveness(self, now: float) -> None:
        liveness = self._liveness
        paths = self._paths_up()
        state = liveness.classify(now, *paths)
        if state == PeerStateKind.UNREACHABLE and not liveness.unreachable:
            liveness.unreachable = True
            why = f"peer {self.peer} unreachable: {liveness.silence_reason(now)}"
            for message in self._queue.clear():
                self._events.append(SendFailed(message.msg_id, why, message.tag, message.step))
            self._events.extend(self._outbox.fail_all(why))
        if liveness.move(state):
            self._events.append(PeerStateChanged(state, liveness.reason(now, *paths)))

    def _heard_peer(self, now: float) -> None:
        if self._liveness.heard(now):
            self._update_liveness(now)  # back: traffic resumes by itself

    def _held_up(self, now: float) -> bool:
        """Whether our own timer is overdue or its work waits for a read: then the
        process was held up, what the peer sent meanwhile may still wait unread, and the
        peer's silence includes ours. Only the timer, after the read, judges the peer
        then (LATE_TIMER_S)."""
        if self._recheck_at is not None:
            return True
        return self._timer_at is not None and now - self._timer_at > LATE_TIMER_S

    def _judged_state(self, now: float) -> PeerStateKind:
        """The peer's state at ``now`` as the timer commits it, for a question (status,
        paths, a send): nothing changes. While held up, the state last committed."""
        if self._held_up(now):
            return self._liveness.state
        return self._liveness.classify(now, *self._paths_up())

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

    @property
    def last_msg_id(self) -> int:
        return self._next_msg_id - 1

    def message_state(self, msg_id: int) -> str | None:
        """``sending``, ``held`` (the peer holds it, no trainer took it yet), or None
        when this session no longer knows it (taken, failed, or never sent)."""
        if msg_id in self._queue.messages or any(m.msg_id == msg_id for m in self._outbox.waiting):
            return "sending"
        return "held" if msg_id in self._held else None

    # ----------------------------------------------------------------- sending

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
        msg_id = self._next_msg_id
        self._next_msg_id += 1
        message = OutboundMessage(msg_id, head, payload, header.critical)
        message.tag = header.tag
        message.step = header.step
        message.started_at = now
        if header.critical:
            self._last_critical_at = now
        self._outbox.add(message, deadline_at)
        self._admit(now)
        return msg_id

    def set_peer_limits(self, max_message_bytes: int) -> None:
        self._outbox.peer_max_message = max_message_bytes

    def _admit(self, now: float) -> None:
        started, failed = self._outbox.admit()
        if started and self._dry_since is not None:
            # the paths had nothing to send since the last message's end: a gap, from
            # the trainer (nothing submitted) or from the peer's credit (nothing admitted)
            self.send_gaps += 1
            self.send_gap_s += now - self._dry_since
            self._dry_since = None
        for message in started:
            self._queue.add(message)
        if started:
            # route and coding may have been chosen while idle, long ago: afresh now
            # (before the first piece is placed), then as often as while sending
            scheduler = self._scheduler
            scheduler.next_select_at = min(
                scheduler.next_select_at, scheduler.selected_at + SELECT_INTERVAL_S
            )
            if now >= scheduler.next_select_at:
                self._reselect(now)
        self._events.extend(failed)

    def pending_bytes(self) -> int:
        return self._outbox.waiting_bytes() + sum(m.body_len for m in self._queue.messages.values())

    def datagram_to_send(self, path: str, now: float) -> bytes | None:
        record = self._paths.get(path)
        if record is None or not record.connected:
            return None
        sender = record.sender
        if record.usable:
            piece = self._next_piece(path, sender.datagram_bytes, now)
            if piece is not None:
                message = piece.message
                if piece.is_repair_symbol:
                    data = self._queue.repair_symbol_data(piece)
                    seq = sender.record(
                        SentDatagram(
                            message.msg_id, 0, 0, now, len(data), piece.block, piece.symbol
                        )
                    )
                    assert message.shape is not None
                    return encode_repair(
                        seq,
                        stamp(now),
                        message.msg_id,
                        message.body_len,
                        piece.block,
                        piece.symbol,
                        message.shape.k,
                        data,
                        message.critical,
                    )
                sent = SentDatagram(
                    message.msg_id,
                    piece.start,
                    piece.end,
                    now,
                    piece.end - piece.start,
                    piece.block,
                    piece.symbol,
                )
                seq = sender.record(sent)
                if piece.repair:
                    self.repair_datagrams += 1
                return encode_shard(
                    seq,
                    stamp(now),
                    message.msg_id,
                    message.body_len,
                    piece.start,
                    message.read(piece.start, piece.end),
                    message.critical,
                )
        # asked for a datagram and nothing to carry: the path is not the limit now
        sender.estimator.on_app_limited(now)
        if now >= self._probe_due_at(path, record):
            seq = sender.record(SentDatagram(0, 0, 0, now, 0))
            return encode_probe(seq, stamp(now))
        return None

    def _probe_due_at(self, path: str, record: PathRecord) -> float:
        """When ``path``'s keep-alive probe is due if nothing else is sent on it: an
        interval after our last datagram; at the answering site (the later name), on a
        validated path where the peer probed since (answered at once: it heard us), when
        its next probe is overdue, but at least every ``ANSWERED_PROBE_INTERVAL_S`` for
        our own RTT samples."""
        last_sent_at = record.sender.last_sent_at
        if (
            self.local_site > self.peer
            and record.probe_heard_at > last_sent_at
            and self._scheduler.selector.is_validated(path)
        ):
            return min(
                record.probe_heard_at + ANSWERED_PROBE_WAIT_S,
                last_sent_at + ANSWERED_PROBE_INTERVAL_S,
            )
        return last_sent_at + PROBE_INTERVAL_S

    def has_critical_for(self, path: str) -> bool:
        """Whether critical work (or a duplicate of it) waits that ``path`` would carry."""
        queue, scheduler = self._queue, self._scheduler
        if queue.has_critical_work and scheduler.takes_critical(path, self._usable()):
            return True
        return bool(scheduler.duplicates) and scheduler.duplicate_target() == path

    def _usable(self) -> dict[str, bool]:
        return {n: r.open for n, r in self._paths.items()}

    def _estimators(self) -> dict[str, PathEstimator]:
        return {n: r.sender.estimator for n, r in self._paths.items()}

    def _next_piece(self, path: str, max_bytes: int, now: float) -> Piece | None:
        """What ``path`` should carry next: critical work if it is the critical route,
        duplicates if it backs up a lossy route, bulk if it finishes it earliest."""
        queue, scheduler = self._queue, self._scheduler
        if not queue.has_work() and not scheduler.duplicates:
            if self._dry_since is None and queue.messages:
                self._dry_since = now  # all sent, some not confirmed: the next may be late
            return None  # the common idle case: nothing to decide
        usable = self._usable()  # once per datagram, not once per question
        if queue.has_critical_work and scheduler.takes_critical(path, usable):
            piece = queue.take(max_bytes, critical=True)
            if piece is not None:
                scheduler.offer_duplicate(piece)
                return piece
        piece = scheduler.take_duplicate(path)
        if piece is not None:
            return piece
        if not queue.has_bulk_work:
            return None
        critical_active = now - self._last_critical_at < CRITICAL_ACTIVE_S
        governor = self._governor
        if now >= governor.next_update_at:
            paths = self._paths
            delay_s = common_delay_s(paths[n].sender.estimator for n, ok in usable.items() if ok)
            governor.update(now, delay_s, critical_active)
        if governor.allows(now) and scheduler.bulk_helps(
            path,
            self._estimators(),
            usable,
            queue.bulk_backlog_bytes,
            max_bytes,
            now,
            critical_active,
        ):
            piece = queue.take(max_bytes, critical=False)
            if piece is not None:
                governor.on_bulk_sent(max_bytes)  # CPU is spent per datagram, full or not
            return piece
        return None

    def _sending(self, now: float) -> bool:
        """Messages in flight or critical traffic lately: the route and the coding
        follow the paths closely; otherwise nothing uses them until a submit."""
        return bool(self._queue.messages) or now - self._last_critical_at < CRITICAL_ACTIVE_S

    def _reselect(self, now: float) -> None:
        usable = self._usable()
        open_paths = {n for n, ok in usable.items() if ok}
        interval_s = SELECT_INTERVAL_S if self._sending(now) else IDLE_SELECT_INTERVAL_S
        change = self._scheduler.update(now, self._estimators(), open_paths, interval_s)
        if change is not None:
            self._events.append(change)
            self._route_dirty = True
            left = self._paths.get(change.previous or "")
            if left is not None and left.sender.estimator.state(now).kind != PathStateKind.UP:
                self._rescue_critical(left)
        self._adapt_coding(open_paths)

    def _rescue_critical(self, record: PathRecord) -> None:
        """The critical route left a path that went bad: the critical data still on it
        is repaired on the new route now, not after the old path's timeout (a late
        arrival is harmless; the receiver keeps the first copy)."""
        messages = self._queue.messages
        seqs = [
            seq
            for seq, sent in record.sender.inflight.items()
            if sent.msg_id in messages and messages[sent.msg_id].critical
        ]
        if seqs:
            self._requeue(record, record.sender.give_up(seqs), outage=True)

    def _adapt_coding(self, open_paths: set[str]) -> None:
        """Symbol size fits every open path; repair count follows the measured loss,
        and where it is spent (``OutboundQueue.round_trip_costs``) what the paths send
        while a loss is found and repaired."""
        queue, policy = self._queue, self._queue.coding
        if not policy.k or not open_paths:
            queue.symbol_bytes = 0
            return
        senders = [self._paths[n].sender for n in open_paths]
        queue.symbol_bytes = min(s.datagram_bytes for s in senders)  # less each one's header
        queue.largest_datagram_bytes = max(s.datagram_bytes for s in senders)
        # random loss seen by a block spread over the paths in proportion to their rates
        rates = [s.estimator.planning_rate_bps for s in senders]
        loss = sum(s.estimator.random_loss_rate * r for s, r in zip(senders, rates, strict=True))
        loss /= sum(rates)
        queue.repair_count = parity_for_loss(
            loss, policy.k, floor=policy.min_repair, ceiling=policy.max_repair
        )
        queue.loss_rate = loss
        queue.tail_bytes = sum(repair_horizon_bytes(s) for s in senders)

    def _requeue(
        self, record: PathRecord, lost: Iterable[SentDatagram], *, outage: bool = False
    ) -> None:
        """Send elsewhere what ``record``'s path lost (or swallowed in an outage)."""
        sender = record.sender
        estimator = sender.estimator
        for sent in lost:
            if outage or not record.usable or sent.sent_at < sender.back_at:  # the outage
                estimator.on_abandoned(sent.size_bytes, sent.sent_at)
            else:
                estimator.on_lost(sent.size_bytes, sent.sent_at)
            if sent.msg_id:
                self._queue.mark_lost(sent.msg_id, sent.start, sent.end, sent.block, sent.symbol)

    def _on_ack(self, path: str, ack: Ack, now: float) -> None:
        record = self._paths.get(path)
        if record is None:
            return
        sender = record.sender
        est = sender.estimator
        acked, late_acked = sender.acknowledge(ack, now)
        if acked:
            # Only an ack of something still in flight times the path (RFC 9002 §5.1):
            # one of datagrams given up long ago may have waited out an outage behind
            # lost stream data, and a sample of seconds would hold the path back.
            rtt_s = stamp_age_s(now, ack.echo_stamp)
            if 0.0 < rtt_s < 60.0:
                est.on_rtt_sample(rtt_s, now, ack_delay_s=ack.ack_delay_us / 1e6)
            self._scheduler.selector.record_probe_ok(path, now)
        for sent in acked:
            est.on_acked(sent.size_bytes, now, sent_at=sent.sent_at)
        for sent in acked:
            if sent.msg_id:
                self._queue.mark_acked(
                    sent.msg_id, sent.start, sent.end, sent.block, sent.symbol, now
                )
        for sent in late_acked:
            if sent.msg_id:
                self._queue.mark_acked(
                    sent.msg_id,
                    sent.start,
                    sent.end,
                    sent.block,
                    sent.symbol,
                    now,
                    declared_lost=True,
                )
        self._requeue(record, sender.detect_lost(now, alone=self._alone(path)))

    def _alone(self, path: str) -> bool:
        """Whether no path but ``path`` may carry data now."""
        return not any(r.open for n, r in self._paths.items() if n != path)

    # --------------------------------------------------------------- receiving

    def handle_datagram(self, path: str, data: bytes, now: float) -> None:
        """One DATAGRAM frame from the peer; raises RemoteProtocolError if malformed."""
        record = self._paths.get(path)
        if record is None:
            raise LocalProtocolError(f"datagram on path {path} that is not up")
        receiver, sender = record.receiver, record.sender
        self._heard(path, record, now)
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
        self._release(body_bytes)
        if msg_id and len(self._taken_pending) < MAX_DONE_PENDING:
            self._taken_pending[msg_id] = None

    def _release(self, body_bytes: int) -> None:
        self._inbound.release(body_bytes)
        self._credit_dirty.update(self._paths)

    @property
    def granted_bytes(self) -> int:
        return max(0, self._inbound.consumed_bytes + self.inbox_window_bytes)

    # ----------------------------------------------------------------- control

    def _heard(self, path: str, record: PathRecord, now: float) -> None:
        """Anything at all arrived on ``path``: a path declared down is back."""
        self._heard_peer(now)
        record.sender.estimator.on_heard(now)
        if not record.usable and record.connected:
            record.sender.back_at = now
            self._move_path(path, record, PathStateKind.UP, "heard again")

    def handle_control(self, path: str, frame: ControlFrame, now: float) -> None:
        """One control frame from the peer on ``path``'s stream, dispatched by its type;
        a frame with no handler here (a second ``Hello``) is the peer's error."""
        handler = _CONTROL_HANDLERS.get(type(frame))
        if handler is None:
            raise RemoteProtocolError(
                f"unexpected {type(frame).__name__.lower()} frame on path {path}"
            )
        record = self._paths.get(path)
        if record is not None:
            self._heard(path, record, now)
        handler(self, path, frame, now)

    def _on_credit(self, path: str, frame: Credit, now: float) -> None:
        if self._outbox.grant(frame.granted_bytes):
            self._admit(now)

    def _on_route(self, path: str, frame: RouteChosen, now: float) -> None:
        self.peer_critical_path = frame.path

    def _on_done(self, path: str, frame: MessagesDone, now: float) -> None:
        for msg_id in frame.msg_ids:
            done = self._queue.done(msg_id)
            if done is not None:
                self._confirmed(done, now)
                if len(self._held) < MAX_HELD_RECORDS:
                    self._held[msg_id] = (done.tag, done.step)

    def _on_taken(self, path: str, frame: MessagesTaken, now: float) -> None:
        for msg_id in frame.msg_ids:
            if self._held.pop(msg_id, None) is not None:
                self._events.append(MessageTaken(msg_id))
                continue
            done = self._queue.done(msg_id)  # "taken" overtook "done" on another path
            if done is not None:
                self._confirmed(done, now)
                self._events.append(MessageTaken(msg_id))

    def _on_repair_request(self, path: str, frame: RepairRequested, now: float) -> None:
        self._queue.repair_blocks(frame.msg_id, frame.blocks)

    def _on_rejected(self, path: str, frame: MessageRejected, now: float) -> None:
        dropped = self._queue.drop(frame.msg_id)
        if dropped is not None:
            self._events.append(
                SendFailed(
                    frame.msg_id,
                    f"peer {self.peer} rejected it: {frame.reason}",
                    dropped.tag,
                    dropped.step,
                )
            )

    def _confirmed(self, done: OutboundMessage, now: float) -> None:
        self.messages_sent += 1
        self.bytes_sent += done.body_len
        self._events.append(
            MessageDelivered(done.msg_id, done.body_len, now - done.started_at, done.critical)
        )

    def control_to_send(self, path: str, now: float) -> bytes:
        """Control frames due on ``path``'s stream (may be empty)."""
        out: list[bytes] = []
        record = self._paths.get(path)
        if record is not None:
            ack = record.receiver.take_ack(now)
            if ack is not None:
                out.append(encode_control(ack))
        if path in self._credit_dirty:
            self._credit_dirty.discard(path)
            out.append(encode_control(Credit(self.granted_bytes)))
            if record is not None:
                record.credit_sent_at = now
        current = self._scheduler.selector.current
        inbound = self._inbound
        pending = (
            self._replay
            or inbound.rejections
            or inbound.repair_requests
            or inbound.done_pending
            or self._taken_pending
        )
        if pending and path == self._end_to_end_path():
            first = len(out)
            if self._replay:
                out.append(self._replay)
                self._replay = b""
            while inbound.rejections:
                out.append(encode_control(inbound.rejections.popleft()))
            while inbound.repair_requests:
                out.append(encode_control(inbound.repair_requests.popleft()))
            while inbound.done_pending:
                out.append(encode_control(MessagesDone(inbound.take_done(MAX_DONE_IDS))))
            while self._taken_pending:  # after "done": the sender expects them in that order
                ids = tuple(self._taken_pending)[:MAX_DONE_IDS]
                for msg_id in ids:
                    del self._taken_pending[msg_id]
                out.append(encode_control(MessagesTaken(ids)))
            self._sent_frames.sent(path, b"".join(out[first:]), now)
        if self._route_dirty and current is not None and path == current:
            self._route_dirty = False
            out.append(encode_control(RouteChosen(current)))
        if out and record is not None and now - record.credit_sent_at >= CREDIT_REFRESH_S:
            record.credit_sent_at = now
            out.append(encode_control(Credit(self.granted_bytes)))
        return b"".join(out)

    def _end_to_end_path(self) -> str | None:
        """Where frames about whole messages go: the critical route, else the fastest
        usable path (a silent path would hold them back until it times out)."""
        usable = [n for n, ok in self._usable().items() if ok]
        current = self._scheduler.selector.current
        if current in usable:
            return current
        if not usable:
            return next(iter(self._paths), None)
        return min(usable, key=lambda n: self._paths[n].sender.estimator.srtt_s)

    # ------------------------------------------------------------ timers/events

    def get_timer(self) -> float | None:
        deadlines: list[float] = [
            self._scheduler.next_select_at,
            self._liveness.next_change_at(),
        ]
        if self._inbound.inbound and self._hearing_peer():  # get_timer runs per datagram
            expiry = self._inbound.next_expiry()
            if expiry is not None:
                deadlines.append(expiry)
        message_deadline = self._outbox.next_deadline(self._queue.messages)
        if message_deadline is not None:
            deadlines.append(message_deadline)
        if self._queue.messages:
            deadlines.append(self._done_check_at)
            bulk_at = self._governor.next_allowed_at()
            if bulk_at is not None and self._queue.has_bulk_work:
                deadlines.append(bulk_at)
        for name, record in self._paths.items():
            if not record.connected:
                continue  # nothing in flight, nothing owed, and no probe until path_up
            sender = record.sender
            loss = sender.loss_deadline()
            if loss is not None:
                deadlines.append(loss)
            deadlines.append(self._probe_due_at(name, record))
            heard_at = sender.estimator.last_heard_at
            if record.usable and heard_at is not None:
                deadlines.append(heard_at + sender.estimator.silence_timeout_s())
            ack = record.receiver.ack_deadline()
            if ack is not None:
                deadlines.append(ack)
        timer = min(deadlines)
        if self._recheck_at is not None:
            timer = max(timer, self._recheck_at)  # nothing is judged before that read
        self._timer_at = timer
        return timer

    def _hearing_peer(self) -> bool:
        return any(self._usable().values())

    def _expire_inbound(self, now: float) -> None:
        inbound = self._inbound
        if not inbound.inbound:
            return
        if not self._hearing_peer():
            inbound.restart_clocks(now)  # an outage does not make the peer's messages idle
            return
        dropped = len(inbound.rejections)
        inbound.expire(now)
        if len(inbound.rejections) > dropped:
            self._credit_dirty.update(self._paths)  # their bytes count as consumed

    def handle_timer(self, now: float) -> None:
        late_s = 0.0 if self._timer_at is None else now - self._timer_at
        if self._recheck_at is None and late_s > LATE_TIMER_S:
            self._recheck_at = now + LATE_TIMER_RECHECK_S
            self.late_timers += 1
            return
        self._recheck_at = None
        self._update_liveness(now)
        self._events.extend(self._outbox.expire(now, self._queue.messages, self._queue.drop))
        self._expire_inbound(now)
        changed = False
        for name, record in self._paths.items():
            sender = record.sender
            self._requeue(record, sender.detect_lost(now, alone=self._alone(name)))
            if not record.connected:
                continue
            state = sender.estimator.state(now)
            went_down = record.usable and state.kind == PathStateKind.DOWN
            changed |= self._move_path(name, record, state.kind, state.reason)
            if went_down:
                self._gone(name, record, now)
        if changed or now >= self._scheduler.next_select_at:
            self._reselect(now)
        if now >= self._done_check_at:
            self._done_check_at = now + DONE_CHECK_S
            timeout_s = max(
                [DONE_TIMEOUT_S, *(4 * r.sender.estimator.srtt_s for r in self._paths.values())]
            )
            for message in list(self._queue.messages.values()):
                if message.acked_at is not None and now - message.acked_at > timeout_s:
                    self._queue.poke(message.msg_id)

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    # ------------------------------------------------------------------- views

    def path_snapshot(self, path: str, now: float) -> dict[str, object]:
        record = self._paths[path]
        sender = record.sender
        row: dict[str, object] = dict(sender.estimator.snapshot(now))
        row["recv_bytes"] = record.receiver.received_bytes
        row["usable"] = record.usable
        row["spurious_losses"] = sender.spurious_losses
        row["rto_ms"] = sender.retransmission_timeout_s() * 1e3
        row["role"] = self._scheduler.role(path)
        row["peer_role"] = "critical" if self.peer_critical_path == path else "bulk"
        change = self._scheduler.last_change
        row["last_switch_s"] = None if change is None else round(now - change.at, 3)
        row["last_switch_reason"] = None if change is None else change.reason
        # A silent peer's paths are not "up" while the path's own timeout runs (it is
        # generous so a busy host does not flap): they follow the peer's silence.
        peer_state = self._judged_state(now)
        heard_at = sender.estimator.last_heard_at
        silent_s = math.inf if heard_at is None else now - heard_at
        if peer_state == PeerStateKind.UNREACHABLE:
            row["state"] = PathStateKind.DOWN
            row["state_reason"] = f"peer unreachable: {self._liveness.silence_reason(now)}"
        elif silent_s > PEER_QUIET_S and row.get("state") == PathStateKind.UP:
            row["state"] = PathStateKind.DEGRADED
            row["state_reason"] = f"silent for {silent_s:.1f} s"
        row["peer_state"] = peer_state
        return row

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
            "messages_held": len(self._held),  # done, no trainer there took it yet
        }

    def status(self) -> dict[str, int]:
        queue, inbound = self._queue, self._inbound
        return {
            "messages_sent": self.messages_sent,
            "messages_received": inbound.messages_received,
            "bytes_sent": self.bytes_sent,
            "bytes_received": inbound.bytes_received,
            "messages_waiting": len(self._outbox.waiting),
            "messages_in_flight": len(queue.messages),
            "inbound_in_progress": len(inbound.inbound),
            "repair_datagrams": self.repair_datagrams,
            "send_gaps": self.send_gaps,
            "late_timers": self.late_timers,
            "send_gap_us": int(self.send_gap_s * 1e6),
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
            "peer_granted_bytes": self._outbox.granted_bytes,
            # bulk's rate while critical traffic flows and the hosts are busy (0: no limit)
            "bulk_limit_bps": int(self._governor.rate_bps or 0),
            "bulk_limit_cuts": self._governor.cuts,
        }


_ControlHandler = Callable[[PeerSession, str, ControlFrame, float], None]
# Every control frame the peer may send once a path is up; Hello is not among them.
_CONTROL_HANDLERS: dict[type, _ControlHandler] = {
    Ack: PeerSession._on_ack,  # type: ignore[dict-item]
    Credit: PeerSession._on_credit,  # type: ignore[dict-item]
    RouteChosen: PeerSession._on_route,  # type: ignore[dict-item]
    MessagesDone: PeerSession._on_done,  # type: ignore[dict-item]
    MessagesTaken: PeerSession._on_taken,  # type: ignore[dict-item]
    RepairRequested: PeerSession._on_repair_request,  # type: ignore[dict-item]
    MessageRejected: PeerSession._on_rejected,  # type: ignore[dict-item]
}
