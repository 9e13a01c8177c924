"""The coordinator: the daemon's backend (wangate.gateway.backend) when ``[workers]
count >= 2``, under the same ``Service`` as a gateway without workers.

It keeps what must be global below the service (peers known and their state, message
ids, bytes pending per peer, stripes and their outcomes, which it tells the
``OutcomeBook``, merged ``status`` and ``paths``) and does no per-datagram work:
messages are cut into stripes
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
from collections.abc import Collection, Mapping
from typing import Any

from wangate.checksum import crc32_combine
from wangate.config import Config
from wangate.core.fairqueue import JobSendStats
from wangate.core.outbox import deadline_left_s
from wangate.core.states import PathStateKind, PeerStateKind
from wangate.delivery.delivered import Delivery
from wangate.delivery.trainers import TrainerDelivery
from wangate.errors import ErrorCode, GatewayError, PeerUnreachable, RemoteProtocolError
from wangate.gateway.outcomes import OutcomeBook
from wangate.metrics import GatewayMetrics
from wangate.net.peer_driver import log_failures
from wangate.reload import ReloadPlan
from wangate.rows import PathRow, PeerStatus
from wangate.service import Submission
from wangate.workers.channel import ChannelError
from wangate.workers.merge import (
    merged_job_stats,
    merged_peer,
    silent_s,
    worker_maps,
    worker_rows,
)
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
RESTART_BACKOFF_S = 1.0  # a worker that exits within this of its start waits this long
# failures a new attempt cannot mend
# (one worker finding the peer unreachable is not final: another may reach it; the
# peer is unreachable when every worker finds it so, see _reported)
FINAL_CODES = frozenset(
    {ErrorCode.DEADLINE, ErrorCode.BAD_REQUEST, ErrorCode.UNKNOWN_PEER, ErrorCode.PEER_RESTARTED}
)


def _two_instances(peer: str) -> str:
    return f"peer {peer} restarted mid-message: its stripes reached two instances"


class Coordinator:
    """The backend (wangate.gateway.backend) of a gateway with worker processes."""

    def __init__(
        self,
        config: Config,
        count: int,
        delivery: TrainerDelivery,
        book: OutcomeBook,
        metrics: GatewayMetrics,
        instance_id: int,
    ) -> None:
        self.config = config
        self.count = count
        self.instance_id = instance_id
        self._book = book
        self._metrics = metrics
        self._peers = {peer.name for peer in config.peers}
        self._closing = False
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        self.workers = [
            WorkerHandle(i, config.path, str(level), self._on_message, self._on_gone, instance_id)
            for i in range(count)
        ]
        self._sids = itertools.count(1)
        self._stripes: dict[int, Stripe] = {}
        self._out: dict[tuple[str, int], OutMessage] = {}
        self._last_msg_id: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # bytes of messages in flight, per peer
        self._unreachable: set[str] = set()
        self._delivery = delivery
        self._receiver = StripeReceiver(
            delivery, config.limits.max_message_bytes, self._peers.__contains__
        )

    @property
    def peer_names(self) -> Collection[str]:
        return self._peers

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
                code=ErrorCode.STARTUP,
            ) from None
        except GatewayError:
            await self._stop_workers()
            raise
        for handle in self.workers:
            handle.started = True
        log.info("%d workers up: pids %s", self.count, [h.pid for h in self.workers])

    async def _stop_workers(self) -> None:
        await asyncio.gather(*(h.stop() for h in self.workers))

    async def close(self) -> None:
        self._closing = True
        await self._stop_workers()
        for stripe in self._stripes.values():
            if stripe.fd is not None:
                os.close(stripe.fd)
        self._stripes.clear()

    def apply_reload(self, plan: ReloadPlan) -> None:
        """Peers and paths live in the workers: each starts again with the new file."""
        self.config = plan.effective
        for name in plan.peers_removed:
            self._peers.discard(name)
            self._book.forget(name)
        self._peers.update(peer.name for peer in plan.peers_added)
        if plan.peers_removed or plan.peers_added or plan.paths_added or plan.paths_removed:
            for handle in self.workers:
                handle.fail("restarted for the new configuration")

    # --------------------------------------------------------- worker packets

    def _on_message(
        self, handle: WorkerHandle, kind: str, fields: dict[str, Any], fds: list[int]
    ) -> None:
        try:
            if kind == "done":
                self._confirmed(handle, fields["sid"], fields["holder"])
            elif kind == "acked":
                self._acked(fields["sid"])
            elif kind == "failed":
                self._stripe_failed(
                    handle, fields["sid"], fields["reason"], fields["code"], fields["holder"]
                )
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

    def check_reachable(self, peer: str) -> None:
        if peer in self._unreachable:
            raise PeerUnreachable(
                f"peer {peer} is unreachable: silent for {self.silent_s(peer):.1f} s "
                f"(limits.peer_dead_s = {self.config.limits.peer_dead_s}); it fails until "
                "heard again"
            )

    def pending_bytes(self, peer: str) -> int:
        return self._pending.get(peer, 0)

    def held_back(self, peer: str) -> bool:
        return False  # each worker holds back behind a quiet peer itself

    def message_state(self, peer: str, msg_id: int) -> str | None:
        return "in flight" if (peer, msg_id) in self._out else None

    def last_msg_id(self, peer: str) -> int:
        return self._last_msg_id.get(peer, 0)

    def send(self, submission: Submission, arrived_at: float) -> int:
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
            job=submission.job,
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
                if not stripe.sends:  # a first send: spent in the coordinator, not counted
                    spent_s = message.deadline_s - remaining_s
                    remaining_s = deadline_left_s(message.deadline_s, spent_s)
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
                    "job": message.job,
                },
                [os.dup(fd)],
            )

    def _connected(self, index: int, peer: str) -> bool:
        report = self.workers[index].report
        return report is not None and any(
            row["peer"] == peer and row["state"] != PathStateKind.DOWN for row in report["rows"]
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
            self._book.changed(stripe.message.peer)

    def _confirmed(self, handle: WorkerHandle, sid: int, holder: int) -> None:
        stripe = self._release(handle, sid)
        if stripe is None:
            return
        self._acked(sid)
        self._drop_stripe(stripe)
        message = stripe.message
        if not message.reached(holder) and not message.finished:
            self._finish(message, _two_instances(message.peer))
            return
        message.left -= 1
        if message.left == 0 and not message.finished:
            self._finish(message, None)

    def _stripe_failed(
        self, handle: WorkerHandle, sid: int, reason: str, code: str, holder: int
    ) -> None:
        stripe = self._release(handle, sid)
        if stripe is None:
            return
        message = stripe.message
        if message.finished:
            self._drop_stripe(stripe)
            return
        if not message.reached(holder):  # sent again, it might reach a second instance
            self._finish(message, _two_instances(message.peer))
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
        # where workers disagree on reaching the peer, say why that may be
        hint = "" if code in FINAL_CODES else self._count_hint(message.peer, handle)
        self._finish(message, stripe.first_failure + hint)

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
        if failure is None:
            self._metrics.message_delivered(
                peer, message.critical, time.monotonic() - message.started_at
            )
            self._book.taken(peer, message.msg_id)
            return
        for stripe in [s for s in self._stripes.values() if s.message is message]:
            handle = self.workers[stripe.worker]
            if stripe.sid in handle.stripes:
                handle.stripes.discard(stripe.sid)
                handle.queued_bytes -= stripe.length
            self._drop_stripe(stripe)
        log_failures(peer, [(message.msg_id, message.tag, message.step, failure)])
        self._metrics.message_failed(peer)
        self._book.failed(peer, message.msg_id, message.tag, message.step, failure)

    # --------------------------------------------------------------- receiving

    def taken(self, delivery: Delivery) -> None:
        """A trainer took ``delivery`` (``recv``, streaming or not): its completing
        stripe is confirmed to the worker that placed it."""
        self._receiver.taken(delivery)

    def unreachable(self, peer: str) -> bool:
        return peer in self._unreachable

    def silent_s(self, peer: str) -> float:
        return silent_s(self.workers, peer)

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
        for name in self._peers:
            unreachable = all(
                r is not None and r["states"].get(name) == PeerStateKind.UNREACHABLE
                for r in reports
            )
            if unreachable == (name in self._unreachable):
                continue
            if unreachable:
                log.warning("peer %s unreachable on every worker", name)
                self._unreachable.add(name)
                self._delivery.inbox.fail_waiters(self._delivery.hopeless)
            else:
                self._unreachable.discard(name)
            self._book.changed(name)

    def rows(self) -> list[PathRow]:
        return worker_rows(self.workers, self.config)

    def peer_status(self, peer: str, rows: list[PathRow]) -> PeerStatus:
        return merged_peer(
            peer,
            self.workers,
            rows,
            unreachable=peer in self._unreachable,
            in_flight=sum(1 for key in self._out if key[0] == peer),
            failures=self._book.recent_failures(peer),
        )

    def worker_maps(self) -> tuple[dict[str, Any], ...]:
        return worker_maps(self.workers)

    def job_stats(self, peer: str) -> Mapping[str, JobSendStats]:
        return merged_job_stats(self.workers, peer)

    def messages_in_flight(self) -> int:
        return len(self._out)

    def reset_path(self, peer: str, path: str) -> None:
        log.warning("%s/%s: connections reset by operator", peer, path)
        for handle in self.workers:
            handle.send("reset", {"peer": peer, "path": path})
