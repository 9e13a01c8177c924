"""Our side of sending to one peer: messages from submit to the peer's "done", what each
path carries next, and what a lost datagram sends again.

Part of ``PeerSession`` (whose path table, control outbox and event queue it shares): a
message waits in the ``Outbox`` until the peer's credit admits it, then the
``OutboundQueue`` cuts it into pieces that the ``PathScheduler`` places, critical
pieces on the critical route and bulk where it finishes first. Keep-alive probes go
on a path with nothing else to carry.

Jobs share it (``set_jobs``): the ``Outbox`` starts their messages fairly and within each
job's cap of bytes held at the peer, the queue serves them fairly
(``wangate.core.fairqueue``), and a job limited to some paths is carried only there:
bulk placement then weighs only the paths it may use.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Final

from wangate.core.buffer import Buffer
from wangate.core.control_outbox import ControlOutbox
from wangate.core.estimator import PathEstimator
from wangate.core.events import Event, MessageDelivered, SendFailed
from wangate.core.fairqueue import JobSendStats
from wangate.core.frames import (
    ShardSpan,
    encode_probe,
    encode_repair,
    encode_shard,
    message_header_bytes,
    stamp,
)
from wangate.core.governor import BulkGovernor, common_delay_s
from wangate.core.jobs import DEFAULT_POLICIES, JobPolicy
from wangate.core.message import MessageHeader
from wangate.core.outbound import CodingPolicy, OutboundQueue
from wangate.core.outbound_message import OutboundMessage, Piece
from wangate.core.outbox import ALL_SENT, Outbox
from wangate.core.paths import PathRecord, PathSender, SentDatagram
from wangate.core.scheduler import (
    CRITICAL_ACTIVE_S,
    IDLE_SELECT_INTERVAL_S,
    SELECT_INTERVAL_S,
    PathScheduler,
)
from wangate.core.sent_outcomes import SentOutcomes
from wangate.core.states import PathStateKind
from wangate.core.timers import TimerName
from wangate.engine._engine import encode_shard_span

PROBE_INTERVAL_S: Final = 0.1  # keep-alive probe on an idle path (RTT stays fresh)
# An idle path needs one probe per interval between the two sites, not one each way:
# the site whose name sorts first probes; the other answers each probe at once, so each
# side hears the other within the interval. The answering site probes only if the
# prober's next probe is this late (two intervals: a late timer on a busy host does not
# make both sides probe), and at least this often for its own RTT samples.
ANSWERED_PROBE_WAIT_S: Final = 2 * PROBE_INTERVAL_S
ANSWERED_PROBE_INTERVAL_S: Final = 1.0
DONE_TIMEOUT_S: Final = 1.0  # all acked but no "done" from the receiver: ask again after this
DONE_CHECK_S: Final = 0.25


class Sender:
    """Submitted messages until done, and what each path carries next."""

    def __init__(
        self,
        local_site: str,
        peer: str,
        paths: dict[str, PathRecord],
        events: deque[Event],
        control: ControlOutbox,
        now: float,
        coding: CodingPolicy | None,
        governor: BulkGovernor | None,
    ) -> None:
        self.local_site = local_site
        self.peer = peer
        self._paths = paths  # the session's, shared
        self._events = events  # the session's, shared
        self._control_outbox = control  # the session's: a new critical route is news to the peer
        self._next_msg_id = 1
        self.outbox = Outbox(peer)  # submitted, not yet admitted by credit; deadlines
        self.queue = OutboundQueue(coding)
        self.queue.waiting = self.outbox.waiting
        self.queue.header_bytes = message_header_bytes
        self.scheduler = PathScheduler()
        self.outcomes = SentOutcomes(paths, self.queue, self.scheduler.selector)
        self.last_critical_at = -CRITICAL_ACTIVE_S
        # without one, bulk is never slowed for critical traffic ([critical] in config)
        self.governor = governor or BulkGovernor(target_delay_s=math.inf)
        self._done_check_at = now + DONE_CHECK_S

        self.messages_sent = 0
        self.bytes_sent = 0
        self.repair_datagrams = 0
        self.policies: Mapping[str, JobPolicy] = DEFAULT_POLICIES
        # per (job, path): [message bytes sent (data and repairs), datagrams]
        self._sent_by_job: dict[tuple[str, str], list[int]] = {}
        # paths left without data between one message's last byte and the next one's
        self._dry_since: float | None = None
        self.send_gaps = 0
        self.send_gap_s = 0.0

    @property
    def last_msg_id(self) -> int:
        return self._next_msg_id - 1

    def knows(self, msg_id: int) -> bool:
        """Whether ``msg_id`` is still being sent (waiting for credit, or in flight)."""
        return msg_id in self.queue.messages or any(m.msg_id == msg_id for m in self.outbox.waiting)

    def add(
        self,
        header: MessageHeader,
        head: bytes,
        payload: Buffer,
        now: float,
        deadline_at: float | None,
    ) -> int:
        """Queue a message (``head``: its header encoded); its id."""
        msg_id = self._next_msg_id
        self._next_msg_id += 1
        message = OutboundMessage(msg_id, head, payload, header.critical, header.job)
        message.tag = header.tag
        message.step = header.step
        message.started_at = now
        if header.critical:
            self.last_critical_at = now
        self.outbox.add(message, deadline_at)
        self.admit(now)
        return msg_id

    def set_jobs(self, policies: Mapping[str, JobPolicy], now: float | None = None) -> None:
        """Each job's weight, paths and cap (a job with none: ``JobPolicy()``), for the
        messages queued too; with ``now``, messages a higher cap allows start at once
        (else at the next submit, credit or take)."""
        self.policies = dict(policies)
        self.outbox.policies = self.policies
        self.queue.set_policies(self.policies)
        if now is not None:
            self.admit(now)

    def drop(self, msg_id: int) -> OutboundMessage | None:
        """Stop sending a started message (it failed): it no longer counts as held."""
        self.outbox.release(msg_id)
        return self.queue.drop(msg_id)

    def taken(self, msg_ids: Iterable[int], now: float) -> None:
        """Trainers at the peer took these messages: their jobs hold less there."""
        released = [self.outbox.release(msg_id) for msg_id in msg_ids]
        if any(released):
            self.admit(now)  # a job at its cap may go on

    def fail_all(self, why: str) -> None:
        """The peer went silent: every message not yet done fails for ``why``, except
        those it had every byte of. Like a done message, such a one may have reached a
        trainer there, its "done" lost or on the way: it waits for the peer to come back
        (it asks again then) or for its restart (which fails it)."""
        for message in self.queue.clear(keep_whole=True):
            self.outbox.release(message.msg_id)
            reason = why
            if message.next_offset >= message.body_len:
                # every byte went out once: its acks, or it, may have died with the peer
                reason = why + ALL_SENT
            self._events.append(SendFailed(message.msg_id, reason, message.tag, message.step))
        self._events.extend(self.outbox.fail_all(why))

    def peer_restarted(self) -> None:
        """The peer forgot every message in progress: they fail; its credit starts afresh."""
        for message in self.queue.clear():
            self._events.append(
                SendFailed(
                    message.msg_id,
                    f"peer {self.peer} restarted mid-message",
                    message.tag,
                    message.step,
                    restarted=True,
                )
            )
        self.outbox.reset()

    def expire(self, now: float) -> None:
        """Messages past their deadline fail."""
        held = self.outbox.held_messages
        self._events.extend(self.outbox.expire(now, self.queue.messages, self.drop))
        if self.outbox.held_messages < held:
            self.admit(now)  # a job at its cap may go on

    def check_done(self, now: float) -> None:
        """Ask again about messages acked long ago but never reported done."""
        if now < self._done_check_at:
            return
        self._done_check_at = now + DONE_CHECK_S
        timeout_s = max(
            [DONE_TIMEOUT_S, *(4 * r.sender.estimator.srtt_s for r in self._paths.values())]
        )
        for message in list(self.queue.messages.values()):
            if message.acked_at is not None and now - message.acked_at > timeout_s:
                self.queue.poke(message.msg_id)

    def deadlines(self) -> dict[TimerName, float]:
        """When sending needs the timer next, by name (a name absent: not now); with
        ``probe_due_at`` and the paths' own, the session adds to it."""
        deadlines: dict[TimerName, float] = {"route selection": self.scheduler.next_select_at}
        message_deadline = self.outbox.next_deadline(self.queue.messages)
        if message_deadline is not None:
            deadlines["message deadline"] = message_deadline
        if self.queue.messages:
            deadlines["done check"] = self._done_check_at
            bulk_at = self.governor.next_allowed_at()
            if bulk_at is not None and self.queue.has_bulk_work:
                deadlines["bulk pacing"] = bulk_at
        return deadlines

    def set_peer_limits(self, max_message_bytes: int) -> None:
        self.outbox.peer_max_message = max_message_bytes

    def admit(self, now: float) -> None:
        started, failed = self.outbox.admit()
        if started and self._dry_since is not None:
            # the paths had nothing to send since the last message's end: a gap, from
            # the trainer (nothing submitted) or from the peer's credit (nothing admitted)
            self.send_gaps += 1
            self.send_gap_s += now - self._dry_since
            self._dry_since = None
        for message in started:
            self.queue.add(message)
        if started:
            # route and coding may have been chosen while idle, long ago: afresh now
            # (before the first piece is placed), then as often as while sending
            scheduler = self.scheduler
            scheduler.next_select_at = min(
                scheduler.next_select_at, scheduler.selected_at + SELECT_INTERVAL_S
            )
            if now >= scheduler.next_select_at:
                self.reselect(now)
        self._events.extend(failed)

    def pending_bytes(self) -> int:
        return self.outbox.waiting_bytes() + sum(m.body_len for m in self.queue.messages.values())

    def send_batch(self, path: str, now: float, limit: int) -> list[bytes | ShardSpan]:
        """Up to ``limit`` datagrams for ``path``: what ``datagram_to_send`` gives one call
        after another, a run of one message's plain shards as one ``ShardSpan`` (which
        paths may carry data is read once: sending changes it not)."""
        items: list[bytes | ShardSpan] = []
        usable, estimators = self.usable(), self._estimators()
        room = limit
        while room > 0:
            taken = self._to_send(path, now, usable, estimators, room, items)
            if not taken:
                break
            room -= taken
        return items

    def datagrams_to_send(self, path: str, now: float, limit: int) -> list[bytes]:
        """``send_batch``'s datagrams, each as bytes (spans framed by the engine)."""
        datagrams: list[bytes] = []
        for item in self.send_batch(path, now, limit):
            if isinstance(item, bytes):
                datagrams.append(item)
            else:
                datagrams += encode_shard_span(item)
        return datagrams

    def datagram_to_send(self, path: str, now: float) -> bytes | None:
        items: list[bytes | ShardSpan] = []
        self._to_send(path, now, self.usable(), self._estimators(), 1, items)
        if not items:
            return None
        item = items[0]
        assert isinstance(item, bytes)  # a span takes room for two or more
        return item

    def _to_send(
        self,
        path: str,
        now: float,
        usable: dict[str, bool],
        estimators: dict[str, PathEstimator],
        room: int,
        items: list[bytes | ShardSpan],
    ) -> int:
        """What ``path`` carries next, at most ``room`` datagrams of it, onto ``items``:
        how many datagrams (0: none now)."""
        record = self._paths.get(path)
        if record is None or not record.connected:
            return 0
        sender = record.sender
        if record.usable:
            piece = self._next_piece(path, sender.datagram_bytes, now, usable, estimators)
            if piece is not None:
                message = piece.message
                counts = self._sent_by_job.get((message.job, path))
                if counts is None:
                    counts = self._sent_by_job[message.job, path] = [0, 0]
                counts[0] += piece.size_bytes
                counts[1] += 1
                if piece.is_repair_symbol:
                    data = self.queue.repair_symbol_data(piece)
                    seq = sender.record(
                        SentDatagram(
                            message.msg_id, 0, 0, now, len(data), piece.block, piece.symbol
                        )
                    )
                    assert message.shape is not None
                    items.append(
                        encode_repair(
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
                    )
                    return 1
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
                elif room > 1 and not message.critical and not self.queue.work.restricted:
                    return self._stripe(
                        path, sender, piece, seq, now, usable, estimators, room, counts, items
                    )
                items.append(_shard(seq, now, message, piece.start, piece.end))
                return 1
        # asked for a datagram and nothing to carry: the path is not the limit now
        sender.estimator.on_app_limited(now)
        if now >= self.probe_due_at(path, record):
            seq = sender.record(SentDatagram(0, 0, 0, now, 0))
            items.append(encode_probe(seq, stamp(now)))
            return 1
        return 0

    def _stripe(
        self,
        path: str,
        sender: PathSender,
        piece: Piece,
        seq: int,
        now: float,
        usable: dict[str, bool],
        estimators: dict[str, PathEstimator],
        room: int,
        counts: list[int],
        items: list[bytes | ShardSpan],
    ) -> int:
        """After a plain bulk piece (its datagram recorded as ``seq``), the pieces of its
        message that the next calls would give this path, up to ``room`` datagrams in
        all, as one span: per datagram, only what sending here can change is asked
        again (critical work for this path, the bulk governor, whether another path
        would finish the backlog sooner, the job's turn); the rest stands within one
        call. The message's first piece, which carries its header, goes as bytes."""
        message, queue, scheduler = piece.message, self.queue, self.scheduler
        governor = self.governor
        base = len(message.head)
        start = piece.start
        if start < base:
            items.append(_shard(seq, now, message, start, piece.end))
            start, seq = piece.end, seq + 1
        space = sender.datagram_bytes
        others = any(ok for name, ok in usable.items() if name != path)
        critical_active = now - self.last_critical_at < CRITICAL_ACTIVE_S
        msg_id, end, count = message.msg_id, piece.end, 1
        while count < room:
            if queue.has_critical_work and queue.work.critical_for(
                path, scheduler.critical_route(usable)
            ):
                break
            if now >= governor.next_update_at or not governor.allows(now):
                break
            if others and not scheduler.bulk_helps(
                path, estimators, usable, queue.bulk_backlog_bytes, space, now, critical_active
            ):
                break
            next_end, block, index = queue.take_next(message, path, space)
            if not next_end:
                break
            sender.record(SentDatagram(msg_id, end, next_end, now, next_end - end, block, index))
            governor.on_bulk_sent(space)
            counts[0] += next_end - end
            counts[1] += 1
            end = next_end
            count += 1
        spanned = count - 1 if start > piece.start else count  # datagrams from start
        if spanned == 1:
            items.append(_shard(seq, now, message, start, end))
        elif spanned > 1:
            stride = piece.end - piece.start  # every piece but a message's last is as long
            items.append(
                ShardSpan(
                    message.payload,
                    base,
                    seq,
                    stamp(now),
                    msg_id,
                    message.body_len,
                    start,
                    end,
                    stride,
                    message.critical,
                )
            )
        return count

    def probe_due_at(self, path: str, record: PathRecord) -> float:
        """When ``path``'s keep-alive probe is due if nothing else is sent on it: an
        interval after our last datagram; at the answering site (the later name), on a
        validated path where the peer probed since (answered at once: it heard us), when
        its next probe is overdue, but at least every ``ANSWERED_PROBE_INTERVAL_S`` for
        our own RTT samples."""
        last_sent_at = record.sender.last_sent_at
        if (
            self.local_site > self.peer
            and record.probe_heard_at > last_sent_at
            and self.scheduler.selector.is_validated(path)
        ):
            return min(
                record.probe_heard_at + ANSWERED_PROBE_WAIT_S,
                last_sent_at + ANSWERED_PROBE_INTERVAL_S,
            )
        return last_sent_at + PROBE_INTERVAL_S

    def has_critical_for(self, path: str) -> bool:
        """Whether critical work (or a duplicate of it) waits that ``path`` would carry."""
        queue, scheduler = self.queue, self.scheduler
        if queue.has_critical_work and queue.work.critical_for(
            path, scheduler.critical_route(self.usable())
        ):
            return True
        return bool(scheduler.duplicates) and scheduler.duplicate_target() == path

    def usable(self) -> dict[str, bool]:
        return {n: r.open for n, r in self._paths.items()}

    def _estimators(self) -> dict[str, PathEstimator]:
        return {n: r.sender.estimator for n, r in self._paths.items()}

    def _next_piece(
        self,
        path: str,
        max_bytes: int,
        now: float,
        usable: dict[str, bool],
        estimators: dict[str, PathEstimator],
    ) -> Piece | None:
        """What ``path`` should carry next: critical work if it is the critical route,
        duplicates if it backs up a lossy route, bulk if it finishes it earliest."""
        queue, scheduler = self.queue, self.scheduler
        if not queue.has_work() and not scheduler.duplicates:
            if self._dry_since is None and queue.messages:
                self._dry_since = now  # all sent, some not confirmed: the next may be late
            return None  # the common idle case: nothing to decide
        work = queue.work
        if queue.has_critical_work:
            route = scheduler.critical_route(usable)
            if work.critical_for(path, route):
                piece = queue.take(max_bytes, critical=True, path=path, route=route)
                if piece is not None:
                    if not work.restricted or work.allowed(
                        piece.message.job, scheduler.duplicate_target()
                    ):
                        scheduler.offer_duplicate(piece)
                    return piece
        piece = scheduler.take_duplicate(path, work.allowed if work.restricted else None)
        if piece is not None:
            return piece
        if not queue.has_bulk_work:
            return None
        critical_active = now - self.last_critical_at < CRITICAL_ACTIVE_S
        governor = self.governor
        if now >= governor.next_update_at:
            paths = self._paths
            delay_s = common_delay_s(paths[n].sender.estimator for n, ok in usable.items() if ok)
            governor.update(now, delay_s, critical_active)
        if not governor.allows(now):
            return None
        backlog = queue.bulk_backlog_bytes
        if not work.restricted:  # the common case: every job may use every path
            if not scheduler.bulk_helps(
                path, estimators, usable, backlog, max_bytes, now, critical_active
            ):
                return None
            piece = queue.take(max_bytes, critical=False, path=path)
        else:  # asked per job, once per set of paths: the paths it may use
            answers: dict[frozenset[str] | None, bool] = {}

            def helps(paths: frozenset[str] | None) -> bool:
                if paths not in answers:
                    ok = (
                        usable
                        if paths is None
                        else {n: u and n in paths for n, u in usable.items()}
                    )
                    answers[paths] = scheduler.bulk_helps(
                        path, estimators, ok, backlog, max_bytes, now, critical_active
                    )
                return answers[paths]

            piece = queue.take(max_bytes, critical=False, path=path, helps=helps)
        if piece is not None:
            governor.on_bulk_sent(max_bytes)  # CPU is spent per datagram, full or not
        return piece

    def _sending(self, now: float) -> bool:
        """Messages in flight or critical traffic lately: the route and the coding
        follow the paths closely; otherwise nothing uses them until a submit."""
        return bool(self.queue.messages) or now - self.last_critical_at < CRITICAL_ACTIVE_S

    def reselect(self, now: float) -> None:
        usable = self.usable()
        open_paths = {n for n, ok in usable.items() if ok}
        interval_s = SELECT_INTERVAL_S if self._sending(now) else IDLE_SELECT_INTERVAL_S
        change = self.scheduler.update(now, self._estimators(), open_paths, interval_s)
        if change is not None:
            self._events.append(change)
            self._control_outbox.owe_route()
            left = self._paths.get(change.previous or "")
            if left is not None and left.sender.estimator.state(now).kind != PathStateKind.UP:
                self._rescue_critical(left)
        self.queue.adapt_coding([self._paths[n].sender for n in open_paths])

    def _rescue_critical(self, record: PathRecord) -> None:
        """The critical route left a path that went bad: the critical data still on it
        is repaired on the new route now, not after the old path's timeout (a late
        arrival is harmless; the receiver keeps the first copy)."""
        messages = self.queue.messages
        seqs = [
            seq
            for seq, sent in record.sender.inflight.items()
            if sent.msg_id in messages and messages[sent.msg_id].critical
        ]
        if seqs:
            self.outcomes.requeue(record, record.sender.give_up(seqs), outage=True)

    def job_stats(self) -> dict[str, JobSendStats]:
        """Per job: what it sent on each path, and where its messages are (a read)."""
        outbox = self.outbox
        jobs = dict.fromkeys(self.policies, 0)
        in_flight: dict[str, int] = {}
        for message in self.queue.messages.values():
            in_flight[message.job] = in_flight.get(message.job, 0) + 1
        sent: dict[str, dict[str, list[int]]] = {}
        for (job, path), counts in self._sent_by_job.items():
            sent.setdefault(job, {})[path] = counts
        for names in (in_flight, sent, outbox.held_bytes, outbox.started_messages):
            jobs.update(dict.fromkeys(names, 0))
        waiting = outbox.waiting.by_job
        jobs.update(dict.fromkeys(waiting, 0))
        stats = {}
        for job in jobs:
            by_path = sent.get(job, {})
            fifo = waiting.get(job, ())
            stats[job] = JobSendStats(
                bytes_sent_by_path={p: c[0] for p, c in by_path.items()},
                datagrams_sent_by_path={p: c[1] for p, c in by_path.items()},
                messages_started=outbox.started_messages.get(job, 0),
                messages_in_flight=in_flight.get(job, 0),
                held_bytes=outbox.held_bytes.get(job, 0),
                waiting_bytes=sum(m.body_len for m in fifo),
                waiting_messages=len(fifo),
                critical_debt_bytes=self.queue.work.debt_bytes(job),
            )
        return stats

    def confirmed(self, done: OutboundMessage, now: float) -> None:
        self.messages_sent += 1
        self.bytes_sent += done.body_len
        self._events.append(
            MessageDelivered(done.msg_id, done.body_len, now - done.started_at, done.critical)
        )


def _shard(seq: int, now: float, message: OutboundMessage, start: int, end: int) -> bytes:
    """The datagram carrying ``message``'s bytes [start, end) as ``seq``."""
    return encode_shard(
        seq,
        stamp(now),
        message.msg_id,
        message.body_len,
        start,
        message.read(start, end),
        message.critical,
    )
