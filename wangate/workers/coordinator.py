"""The coordinator: the daemon process when ``[workers] count >= 2``.

It keeps what must be global (the local API, peers known and their state, message
ids, backpressure, delivery to trainers in order, outcomes, metrics, ``status`` and
``paths``) and does no per-datagram work: messages are cut into stripes
(wangate.workers.stripes) and handed to the worker processes (wangate.workers.worker)
as shared-memory segments. Worker 0 carries the critical messages, so bulk work cannot
make them wait behind it; the bulk stripes go to workers 1..N-1 by their queue depth.

A stripe is confirmed when the receiving coordinator has it (or, for the stripe that
completes a message, when a trainer took the message): a message is delivered once
every stripe is confirmed. A worker that exits is started again and every stripe it
held unconfirmed is sent again; the receiving coordinator drops what it has already
seen, so nothing is delivered twice (proto/workers.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

from wangate import __version__
from wangate.checksum import crc32_combine
from wangate.config import Config
from wangate.daemon import Gateway
from wangate.errors import (
    DeadlineExceeded,
    GatewayError,
    PeerUnreachable,
    RecvTimeout,
    RemoteProtocolError,
)
from wangate.errors import MessageFailed as MessageFailedError
from wangate.net.peer_driver import MAX_OUTCOMES, RECENT_FAILURES
from wangate.reload import ReloadPlan
from wangate.rows import GatewayStatus, PathRow
from wangate.service import Delivery, Submission
from wangate.workers.channel import ChannelError
from wangate.workers.merge import merged_peer, silent_s, worker_maps, worker_rows
from wangate.workers.pool import WorkerHandle
from wangate.workers.receiving import StripeReceiver
from wangate.workers.sending import OutMessage, Stripe, stage_payload
from wangate.workers.stripes import (
    StripeDescriptor,
    assign_workers,
)

log = logging.getLogger("wangate.workers")

STARTUP_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 4  # sends of one stripe that failed (a worker that exits does not count)
DEADLINE_SLACK_S = 0.01  # of a deadline spent in the coordinator that a worker ignores
RESTART_BACKOFF_S = 1.0  # a worker that exits within this of its start waits this long
# failures a new attempt cannot mend
# (one worker finding the peer unreachable is not final: another may reach it; the
# peer is unreachable when every worker finds it so, see _reported)
FINAL_CODES = frozenset({"deadline", "bad_request", "unknown_peer", "peer_restarted"})


class Coordinator(Gateway):
    def __init__(self, config: Config, count: int) -> None:
        super().__init__(config)
        self.count = count
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        self.workers = [
            WorkerHandle(
                i, config.path, str(level), self._on_message, self._on_gone, self.instance_id
            )
            for i in range(count)
        ]
        self._sids = itertools.count(1)
        self._stripes: dict[int, Stripe] = {}
        self._out: dict[tuple[str, int], OutMessage] = {}
        self._last_msg_id: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # bytes of messages in flight, per peer
        self._outcomes: dict[str, OrderedDict[int, str | None]] = {}
        self._recent_failures: dict[str, deque[dict[str, Any]]] = {}
        self._changed: dict[str, asyncio.Event] = {}  # an outcome, the state, room
        self._unreachable: set[str] = set()
        self._receiver = StripeReceiver(
            self.inbox, self.inbound_segments, self.max_message_bytes, self.peers.__contains__
        )

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        for handle in self.workers:
            handle.spawn()
        try:
            await asyncio.wait_for(
                asyncio.gather(*(h.ready for h in self.workers if h.ready is not None)),
                STARTUP_TIMEOUT_S,
            )
        except TimeoutError:
            await self._stop_workers()
            raise GatewayError(
                f"{self.config.path}: workers not ready within {STARTUP_TIMEOUT_S:g} s",
                code="startup",
            ) from None
        except GatewayError:
            await self._stop_workers()
            raise
        for handle in self.workers:
            handle.started = True
        log.info("%d workers up: pids %s", self.count, [h.pid for h in self.workers])
        await self.start_local()

    async def _stop_workers(self) -> None:
        await asyncio.gather(*(h.stop() for h in self.workers))

    async def close(self) -> None:
        self._closing = True
        await self._stop_workers()
        for stripe in self._stripes.values():
            if stripe.fd is not None:
                os.close(stripe.fd)
        self._stripes.clear()
        self._receiver.close()
        await super().close()

    def apply_reload(self, plan: ReloadPlan) -> None:
        """Peers and paths live in the workers: each starts again with the new file."""
        self.config = plan.effective
        for name in plan.peers_removed:
            self.peers.pop(name, None)
        for peer_cfg in plan.peers_added:
            self.peers[peer_cfg.name] = self._new_driver(peer_cfg.name, time.monotonic())
        if plan.peers_removed or plan.peers_added or plan.paths_added or plan.paths_removed:
            for handle in self.workers:
                handle.fail("restarted for the new configuration")

    # --------------------------------------------------------- worker packets

    def _on_message(
        self, handle: WorkerHandle, kind: str, fields: dict[str, Any], fds: list[int]
    ) -> None:
        try:
            if kind == "done":
                self._confirmed(handle, fields["sid"])
            elif kind == "acked":
                self._acked(fields["sid"])
            elif kind == "failed":
                self._stripe_failed(handle, fields["sid"], fields["reason"], fields["code"])
            elif kind == "arrived":
                self._receiver.arrived(handle, fields)
            elif kind == "placed":
                self._receiver.placed(handle, fields["seq"])
            elif kind == "report":
                self._reported(handle, fields)
            else:
                raise ChannelError(f"a worker may not send {kind} packets")
        except ChannelError as exc:
            log.error("worker %d: %s; restarting it", handle.index, exc)
            handle.fail(f"bad packet: {exc}")

    def _on_gone(self, handle: WorkerHandle, reason: str) -> None:
        if self._closing:
            return
        held = sorted(handle.stripes)
        log.warning(
            "worker %d (pid %s) gone: %s; restarting it, %d stripes to send again",
            handle.index,
            handle.pid,
            reason,
            len(held),
        )
        handle.stripes.clear()
        handle.queued_bytes = 0
        handle.restarts += 1
        self._receiver.worker_gone(handle)
        if time.monotonic() - handle.started_at < RESTART_BACKOFF_S:
            asyncio.get_running_loop().call_later(RESTART_BACKOFF_S, self._respawn, handle, held)
        else:
            self._respawn(handle, held)

    def _respawn(self, handle: WorkerHandle, held: list[int]) -> None:
        if self._closing:
            return
        handle.spawn()
        for sid in held:
            stripe = self._stripes.get(sid)
            if stripe is not None:
                self._dispatch([stripe], exclude=handle.index)  # one that is up now

    # ----------------------------------------------------------------- sending

    def submit_now(self, submission: Submission) -> int | None:
        if submission.peer == self.site_name:
            return super().submit_now(submission)
        arrived_at = time.monotonic()
        self._peer_for(submission)
        self._check_reachable(submission.peer)
        if not self._has_room(submission):
            return None
        return self._send(submission, arrived_at)

    async def submit(self, submission: Submission) -> int:
        if submission.peer == self.site_name:
            return await super().submit(submission)
        arrived_at = time.monotonic()
        self._peer_for(submission)
        peer = submission.peer
        deadline_s = submission.deadline_s
        deadline_at = None if deadline_s is None else arrived_at + deadline_s
        while True:
            self._check_reachable(peer)
            if self._has_room(submission):
                break
            if not await self._wait_for_news(peer, deadline_at):
                raise DeadlineExceeded(
                    f"send {submission.tag!r} (step {submission.step}) to {peer}: deadline of "
                    f"{deadline_s:g} s passed while waiting for room ({self._pending[peer]} "
                    "bytes already queued for it); nothing was sent"
                )
            if peer not in self.peers:
                raise GatewayError(f"peer {peer!r} was removed", code="unknown_peer")
        return self._send(submission, arrived_at)

    def _has_room(self, submission: Submission) -> bool:
        pending = self._pending.get(submission.peer, 0)
        if pending == 0:
            return True
        size = len(memoryview(submission.payload).cast("B"))
        return pending + size <= self.config.limits.peer_inbox_bytes

    def _check_reachable(self, peer: str) -> None:
        if peer in self._unreachable:
            raise PeerUnreachable(
                f"peer {peer} is unreachable: silent for {self._silent_s(peer):.1f} s "
                f"(limits.peer_dead_s = {self.config.limits.peer_dead_s}); it fails until "
                "heard again"
            )

    def _event(self, peer: str) -> asyncio.Event:
        return self._changed.setdefault(peer, asyncio.Event())

    def _send(self, submission: Submission, arrived_at: float) -> int:
        peer = submission.peer
        meta = bytes(submission.meta)
        view = memoryview(submission.payload).cast("B")
        total = view.nbytes
        staged = stage_payload(submission, meta, view)  # raises GatewayError
        ranges = [(offset, length) for offset, length, _, _ in staged]
        msg_id = self._last_msg_id[peer] = self._last_msg_id.get(peer, 0) + 1
        deadline_s = submission.deadline_s
        message = OutMessage(
            peer,
            msg_id,
            submission.tag,
            submission.step,
            submission.critical,
            total,
            arrived_at,
            None if deadline_s is None else arrived_at + deadline_s,
            deadline_s,
            left=len(ranges),
            segment=submission.segment,
            payload=view if submission.segment is not None else None,
        )
        self._out[(peer, msg_id)] = message
        self._pending[peer] = self._pending.get(peer, 0) + total
        stripes = []
        for offset, length, fd, part_crc in staged:
            descriptor = StripeDescriptor(
                self.instance_id, msg_id, offset, total, submission.checksum & 0xFFFFFFFF
            )
            stripe_meta = descriptor.encode(meta)
            checksum = crc32_combine(zlib.crc32(stripe_meta), part_crc, length)
            stripe = Stripe(next(self._sids), message, offset, length, fd, stripe_meta, checksum)
            self._stripes[stripe.sid] = stripe
            stripes.append(stripe)
        self._dispatch(stripes)
        return msg_id

    def _dispatch(self, stripes: list[Stripe], exclude: int | None = None) -> None:
        """Hand ``stripes`` to workers: critical ones to worker 0, the rest spread over
        the bulk workers by the bytes they hold."""
        if not stripes:
            return
        if stripes[0].message.critical or self.count == 1:
            candidates = [0]
        else:
            candidates = [w for w in range(1, self.count) if w != exclude] or [
                w for w in range(1, self.count)
            ]
        # a worker just restarted has no connection yet: those that have one go first
        connected = [w for w in candidates if self._connected(w, stripes[0].message.peer)]
        candidates = connected or candidates
        queued = {h.index: h.queued_bytes for h in self.workers}
        chosen = assign_workers([s.length for s in stripes], queued, candidates)
        now = time.monotonic()
        for stripe, index in zip(stripes, chosen, strict=True):
            handle = self.workers[index]
            message = stripe.message
            stripe.worker = index
            handle.stripes.add(stripe.sid)
            handle.queued_bytes += stripe.length
            remaining_s = -1.0
            if message.deadline_at is not None and message.deadline_s is not None:
                remaining_s = max(0.001, message.deadline_at - now)
                if not stripe.sends and message.deadline_s - remaining_s < DEADLINE_SLACK_S:
                    # sent on at once: the deadline as the trainer gave it (its failure
                    # names it), not less the coordinator's few microseconds
                    remaining_s = message.deadline_s
            stripe.sends += 1
            fd, offset = stripe.source()
            handle.send(
                "send",
                {
                    "sid": stripe.sid,
                    "peer": message.peer,
                    "tag": message.tag,
                    "step": message.step,
                    "critical": message.critical,
                    "meta": stripe.meta,
                    "checksum": stripe.checksum,
                    "offset": offset,
                    "length": stripe.length,
                    "deadline_s": remaining_s,
                },
                [os.dup(fd)],
            )

    def _connected(self, index: int, peer: str) -> bool:
        report = self.workers[index].report
        return report is not None and any(
            row["peer"] == peer and row["state"] != "down" for row in report["rows"]
        )

    def _release(self, handle: WorkerHandle, sid: int) -> Stripe | None:
        stripe = self._stripes.get(sid)
        if stripe is None or stripe.worker != handle.index or sid not in handle.stripes:
            return None
        handle.stripes.discard(sid)
        handle.queued_bytes -= stripe.length
        return stripe

    def _acked(self, sid: int) -> None:
        """The peer has the stripe whole: its bytes no longer wait (backpressure counts
        what the peer does not have yet, as without workers)."""
        stripe = self._stripes.get(sid)
        if stripe is not None and not stripe.acked:
            stripe.acked = True
            self._pending[stripe.message.peer] -= stripe.length
            self._event(stripe.message.peer).set()

    def _confirmed(self, handle: WorkerHandle, sid: int) -> None:
        stripe = self._release(handle, sid)
        if stripe is None:
            return
        self._acked(sid)
        self._drop_stripe(stripe)
        message = stripe.message
        message.left -= 1
        if message.left == 0 and not message.finished:
            self._finish(message, None)

    def _stripe_failed(self, handle: WorkerHandle, sid: int, reason: str, code: str) -> None:
        stripe = self._release(handle, sid)
        if stripe is None:
            return
        message = stripe.message
        if message.finished:
            self._drop_stripe(stripe)
            return
        expired = message.deadline_at is not None and time.monotonic() >= message.deadline_at
        final = code in FINAL_CODES or message.peer in self._unreachable or expired
        stripe.attempts += 1
        # the first reason is the one that matters (later ones are about the retries)
        stripe.first_failure = stripe.first_failure or reason
        if not final and stripe.attempts < MAX_ATTEMPTS:
            log.info(
                "stripe of message %d to %s sent again: %s", message.msg_id, message.peer, reason
            )
            self._dispatch([stripe], exclude=handle.index)
            return
        self._finish(message, stripe.first_failure + self._count_hint(message.peer, handle))

    def _count_hint(self, peer: str, failed: WorkerHandle) -> str:
        """Where other workers reach ``peer`` and the one that failed does not, the likely
        cause: worker ``w`` dials and listens on the ports + ``w``, so a peer running
        fewer workers has none behind the others' ports."""
        reach = [h.index for h in self.workers if self._connected(h.index, peer)]
        if not reach or failed.index in reach:
            return ""
        which = ", ".join(map(str, reach))
        if len(reach) == 1:
            workers = f"worker {which} of {self.count} reaches"
        else:
            workers = f"workers {which} of {self.count} reach"
        return f" (only {workers} {peer}: does {peer} run the same [workers] count?)"

    def _drop_stripe(self, stripe: Stripe) -> None:
        if self._stripes.pop(stripe.sid, None) is not None:
            if stripe.fd is not None:
                os.close(stripe.fd)
            if not stripe.acked:
                stripe.acked = True
                self._pending[stripe.message.peer] -= stripe.length

    def _finish(self, message: OutMessage, failure: str | None) -> None:
        message.finished = True
        message.payload = None  # the trainer's segment: its own again once unmapped
        peer = message.peer
        self._out.pop((peer, message.msg_id), None)
        outcomes = self._outcomes.setdefault(peer, OrderedDict())
        outcomes[message.msg_id] = None
        if failure is None:
            self.metrics.message_delivered(
                peer, message.critical, time.monotonic() - message.started_at
            )
        else:
            text = (
                f"message {message.msg_id} (tag {message.tag!r}, step {message.step}) to "
                f"{peer} failed: {failure}"
            )
            outcomes[message.msg_id] = text
            log.warning("%s", text)
            self._recent_failures.setdefault(peer, deque(maxlen=RECENT_FAILURES)).append(
                {"msg_id": message.msg_id, "tag": message.tag, "step": message.step,
                 "reason": failure}
            )  # fmt: skip
            self.metrics.message_failed(peer)
            for stripe in [s for s in self._stripes.values() if s.message is message]:
                handle = self.workers[stripe.worker]
                if stripe.sid in handle.stripes:
                    handle.stripes.discard(stripe.sid)
                    handle.queued_bytes -= stripe.length
                self._drop_stripe(stripe)
        while len(outcomes) > MAX_OUTCOMES:
            outcomes.popitem(last=False)
        self._event(peer).set()

    async def wait_message(self, peer: str, msg_id: int, timeout_s: float | None) -> None:
        if peer == self.site_name and msg_id == 0:
            return
        if peer not in self.peers:
            raise GatewayError(f"unknown peer {peer!r}", code="unknown_peer")
        deadline_at = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            outcomes: Mapping[int, str | None] = self._outcomes.get(peer, {})
            if msg_id in outcomes:
                failure = outcomes[msg_id]
                if failure is None:
                    return
                raise MessageFailedError(failure)
            if (peer, msg_id) not in self._out:
                if not 0 < msg_id <= self._last_msg_id.get(peer, 0):
                    raise GatewayError(
                        f"no message {msg_id} was sent to {peer}", code="unknown_message"
                    )
                raise GatewayError(
                    f"the outcome of message {msg_id} to {peer} is no longer known "
                    f"(the last {MAX_OUTCOMES} are kept)",
                    code="unknown_message",
                )
            self._check_reachable(peer)
            if not await self._wait_for_news(peer, deadline_at):
                raise RecvTimeout(
                    f"message {msg_id} to {peer} is still in flight after {timeout_s:g} s",
                    code="timeout",
                )

    async def _wait_for_news(self, peer: str, deadline_at: float | None) -> bool:
        """Wait for news of ``peer`` (room, an outcome, its state); False once
        ``deadline_at`` has passed without any."""
        event = self._event(peer)
        event.clear()
        remaining_s = None if deadline_at is None else deadline_at - time.monotonic()
        if remaining_s is not None and remaining_s <= 0:
            return False
        try:
            await asyncio.wait_for(event.wait(), remaining_s)
        except TimeoutError:
            return False
        return True

    # --------------------------------------------------------------- receiving

    def _taken(self, delivery: Delivery) -> Delivery:
        """A trainer took ``delivery`` (``recv``, streaming or not): its completing
        stripe is confirmed to the worker that placed it."""
        self._receiver.taken(delivery)
        return self._with_segment(delivery)

    def _silent_s(self, peer: str) -> float:
        return silent_s(self.workers, peer)

    def _hopeless_recv(self, tag: str, source: str | None) -> PeerUnreachable | None:
        """As ``Gateway._hopeless_recv``, from the workers' reports."""
        if source is not None:
            if source not in self._unreachable:
                return None
            return PeerUnreachable(
                f"recv {tag!r} from {source}: peer {source} is unreachable "
                f"(silent for {self._silent_s(source):.1f} s)"
            )
        sources = self.inbox.mailbox.sources_of(tag) or frozenset(self.peers)
        if not sources or any(name not in self._unreachable for name in sources):
            return None
        silent = ", ".join(
            f"{name} silent for {self._silent_s(name):.1f} s" for name in sorted(sources)
        )
        return PeerUnreachable(
            f"recv {tag!r}: every peer that could send it is unreachable ({silent})"
        )

    # ------------------------------------------------------------ state, rows

    def _reported(self, handle: WorkerHandle, fields: dict[str, Any]) -> None:
        try:
            peers = fields["status"]["peers"]
            states = {name: str(info["state"]) for name, info in peers.items()}
            PathRow.from_dicts(fields["rows"])
        except (KeyError, TypeError, AttributeError, RemoteProtocolError) as exc:
            raise ChannelError(f"a report without rows or peer states: {exc!r}") from None
        handle.report = fields
        handle.report["states"] = states
        if handle.index == 0:  # every REPORT_INTERVAL_S: drop what will never complete
            self._receiver.drop_idle(time.monotonic(), self.config.limits.partial_message_idle_s)
        reports = [h.report for h in self.workers]
        for name in self.peers:
            unreachable = all(
                r is not None and r["states"].get(name) == "unreachable" for r in reports
            )
            if unreachable == (name in self._unreachable):
                continue
            if unreachable:
                log.warning("peer %s unreachable on every worker", name)
                self._unreachable.add(name)
                self.inbox.fail_waiters(self._hopeless_recv)
            else:
                self._unreachable.discard(name)
            self._event(name).set()

    def paths(self) -> list[PathRow]:
        return worker_rows(self.workers, self.config)

    def status(self, rows: list[PathRow] | None = None) -> GatewayStatus:
        if rows is None:
            rows = self.paths()
        return GatewayStatus(
            site=self.site_name,
            version=__version__,
            uptime_s=round(time.monotonic() - self.started_at, 3),
            peers={
                name: merged_peer(
                    name,
                    self.workers,
                    rows,
                    unreachable=name in self._unreachable,
                    in_flight=sum(1 for key in self._out if key[0] == name),
                    failures=list(self._recent_failures.get(name, ())),
                )
                for name in self.peers
            },
            local_messages=self.local_messages,
            inbox_queued=self.inbox.mailbox.queued_count(),
            inbox_waiting_recvs=self.inbox.mailbox.waiter_count(),
            workers=worker_maps(self.workers),
        )

    def status_counts(self) -> tuple[int, int, int, int, int]:
        rows = self.paths()
        up = {(r.peer, r.path) for r in rows if r.state != "down"}
        paths = sum(len(peer.paths) for peer in self.config.peers)
        peers_up = len({peer for peer, _ in up})
        return peers_up, len(self.peers), len(up), paths, len(self._out)

    def reset_path(self, peer: str, path: str) -> None:
        if peer not in self.peers or path not in {p.name for p in self.config.peer(peer).paths}:
            raise GatewayError(
                f"no path {path!r} to peer {peer!r} in {self.config.path}", code="unknown_path"
            )
        log.warning("%s/%s: connections reset by operator", peer, path)
        for handle in self.workers:
            handle.send("reset", {"peer": peer, "path": path})
