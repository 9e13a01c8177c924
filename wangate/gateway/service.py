"""The gateway's service to its trainers, written once over a backend.

``Service`` implements ``GatewayService`` (wangate.service), which the local API
calls: submit with back-pressure and deadlines, wait for a message's outcome,
receive (whole or streamed), the receives that can never be satisfied, delivery
within the site, status and rows. It keeps no per-datagram state and does no I/O:
the ``Backend`` moves the messages (in this process, or through worker processes),
``TrainerDelivery`` holds what arrived for the trainers, and ``OutcomeBook`` what
became of what was sent.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from wangate import __version__
from wangate.config import Config, JobConfig
from wangate.config.jobs import job_admission_error, unknown_job_error
from wangate.core.jobs import DEFAULT_JOB
from wangate.core.message import message_checksum
from wangate.core.states import PathStateKind
from wangate.delivery.delivered import Delivery
from wangate.delivery.streams import IncomingStream
from wangate.delivery.trainers import TrainerDelivery
from wangate.errors import (
    DeadlineExceeded,
    ErrorCode,
    GatewayError,
    MessageFailed,
    PeerUnreachable,
    RecvTimeout,
)
from wangate.gateway.backend import Backend
from wangate.gateway.claims import CollectiveClaims
from wangate.gateway.outcomes import MAX_OUTCOMES, OutcomeBook
from wangate.rows import GatewayStatus, PathRow
from wangate.service import Claimant, Submission


class Service:
    def __init__(
        self,
        config: Config,
        backend: Backend,
        delivery: TrainerDelivery,
        book: OutcomeBook,
    ) -> None:
        self.config = config  # replaced on reload
        self.site_name = config.site.name
        self.backend = backend
        self.delivery = delivery
        self.book = book
        self.started_at = time.monotonic()
        self.local_messages = 0
        self.claims = CollectiveClaims()
        delivery.hopeless = self._hopeless_recv

    # --------------------------------------------------------------- jobs

    def join(self, job: str, uid: int, gids: tuple[int, ...]) -> str:
        """Admit a trainer process (``uid``, ``gids``) to ``job``; raises
        ``GatewayError`` naming the job and why not (``unknown_job``, ``job_denied``)."""
        refused = job_admission_error(self._declared(job), uid, gids, os.getuid())
        if refused is not None:
            raise GatewayError(refused, code=ErrorCode.JOB_DENIED)
        return job

    def claim(self, job: str, call: str, step: int, by: Claimant) -> None:
        self.claims.claim(job, call, step, by)

    def left(self, connection: int) -> None:
        self.claims.release(connection)
        self.delivery.segments.forget(connection)

    def returned(self, connection: int, segment_ids: Sequence[int]) -> None:
        self.delivery.returned(connection, segment_ids)

    def _declared(self, job: str) -> JobConfig:
        """``job`` as the config declares it; a job removed by a reload takes no new
        messages (``unknown_job``)."""
        declared = self.config.jobs.job(job)
        if declared is None:
            raise GatewayError(unknown_job_error(job, self.config), code=ErrorCode.UNKNOWN_JOB)
        return declared

    # ------------------------------------------------------------ sending

    def submit_now(self, submission: Submission) -> int | None:
        arrived_at = time.monotonic()
        self._declared(submission.job)
        if submission.peer == self.site_name:
            delivery = self._local_delivery(submission)
            if not self.delivery.inbox.try_deliver(delivery):
                self.delivery.forget(delivery)
                return None
            self.local_messages += 1
            return 0
        peer = self._known(submission.peer)
        self.backend.check_reachable(peer)
        if not self._has_room(submission):
            return None
        return self._sent(submission, self.backend.send(submission, arrived_at))

    async def submit(self, submission: Submission) -> int:
        arrived_at = time.monotonic()  # a deadline counts from here, backpressure included
        self._declared(submission.job)
        if submission.peer == self.site_name:
            delivery = self._local_delivery(submission)
            try:
                await self.delivery.inbox.deliver(delivery)
            except BaseException:  # the client went away while the inbox was full
                self.delivery.forget(delivery)
                raise
            self.local_messages += 1
            return 0
        peer = self._known(submission.peer)
        deadline_s = submission.deadline_s
        deadline_at = None if deadline_s is None else arrived_at + deadline_s
        while True:
            self.backend.check_reachable(peer)  # never wait for room behind a dead peer
            if self._has_room(submission):
                break
            if not await self.book.wait_changed(peer, deadline_at):
                raise DeadlineExceeded(
                    f"send {submission.tag!r} (step {submission.step}) to {peer}: "
                    f"deadline of {deadline_s:g} s passed while waiting for room "
                    f"({self.backend.pending_bytes(peer)} bytes already queued for it); "
                    "nothing was sent"
                )
            if peer not in self.backend.peer_names:
                raise GatewayError(f"peer {peer!r} was removed", code=ErrorCode.UNKNOWN_PEER)
        return self._sent(submission, self.backend.send(submission, arrived_at))

    def _sent(self, submission: Submission, msg_id: int) -> int:
        self.book.sent(submission.peer, msg_id, submission.job)
        return msg_id

    def _known(self, peer: str) -> str:
        if peer not in self.backend.peer_names:
            known = ", ".join(sorted(self.backend.peer_names)) or "none"
            raise GatewayError(
                f"unknown peer {peer!r}: this gateway ({self.site_name}) knows "
                f"{known}; check [[peers]] in {self.config.path}",
                code=ErrorCode.UNKNOWN_PEER,
            )
        return peer

    def _has_room(self, submission: Submission) -> bool:
        """At most one inbox window of unsent bytes waits per peer and job, so a job
        whose trainers stop reading holds up only its own sends; nothing more waits
        behind a peer the backend holds back."""
        peer = submission.peer
        pending = self.backend.pending_bytes(peer)
        if pending == 0:
            return True
        if self.backend.held_back(peer):
            return False
        size = len(memoryview(submission.payload).cast("B"))
        window = self.config.limits.peer_inbox_bytes
        if pending + size <= window:
            return True
        # under pressure only: this job's own bytes not yet taken at the peer
        stats = self.backend.job_stats(peer).get(submission.job)
        mine = 0 if stats is None else stats.waiting_bytes + stats.held_bytes
        return mine == 0 or mine + size <= window

    def _local_delivery(self, submission: Submission) -> Delivery:
        """Within the site, a payload from a segment is copied into a segment of the
        gateway's own (shared memory the receiving trainer maps): no private copy."""
        segments = self.delivery.segments
        return local_delivery(self.site_name, submission, segments.allocate, segments.free)

    async def wait_message(
        self, peer: str, msg_id: int, timeout_s: float | None, job: str = DEFAULT_JOB
    ) -> None:
        if peer == self.site_name and msg_id == 0:
            return  # within the site: delivered into the inbox at once
        if peer not in self.backend.peer_names:
            raise GatewayError(f"unknown peer {peer!r}", code=ErrorCode.UNKNOWN_PEER)
        if self.book.job_of(peer, msg_id) != job:  # another job's message: not ours to see
            raise GatewayError(
                f"no message {msg_id} was sent to {peer} in job {job!r}",
                code=ErrorCode.UNKNOWN_MESSAGE,
            )
        deadline_at = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            ended, failure = self.book.outcome(peer, msg_id)
            if ended:
                if failure is None:
                    return
                raise MessageFailed(failure)
            state = self.backend.message_state(peer, msg_id)
            if state is None:
                if not 0 < msg_id <= self.backend.last_msg_id(peer):
                    raise GatewayError(
                        f"no message {msg_id} was sent to {peer}", code=ErrorCode.UNKNOWN_MESSAGE
                    )
                raise GatewayError(
                    f"the outcome of message {msg_id} to {peer} is no longer known "
                    f"(the last {MAX_OUTCOMES} are kept)",
                    code=ErrorCode.UNKNOWN_MESSAGE,
                )
            self.backend.check_reachable(peer)
            if not await self.book.wait_changed(peer, deadline_at):
                raise RecvTimeout(
                    f"message {msg_id} to {peer} is still {state} after {timeout_s:g} s",
                    code=ErrorCode.TIMEOUT,
                )
            if peer not in self.backend.peer_names:
                raise GatewayError(f"peer {peer!r} was removed", code=ErrorCode.UNKNOWN_PEER)

    # ---------------------------------------------------------- receiving

    async def receive(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        job: str = DEFAULT_JOB,
        returns_to: int | None = None,
    ) -> Delivery:
        got = await self.delivery.receive(tag, source, step, timeout_s, job)
        return self._taken(got, returns_to)

    async def receive_stream(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        job: str = DEFAULT_JOB,
    ) -> Delivery | IncomingStream:
        got = await self.delivery.receive_stream(tag, source, step, timeout_s, job)
        return self._taken(got) if isinstance(got, Delivery) else got

    def _taken(self, delivery: Delivery, returns_to: int | None = None) -> Delivery:
        """A trainer has ``delivery``: its sender gets the credit back, and one that was
        assembled in a segment carries its sealed descriptor from here (lent to the
        ``returns_to`` connection, which returns it for reuse)."""
        self.backend.taken(delivery)
        payload = memoryview(delivery.payload)
        segments = self.delivery.segments
        if returns_to is None:
            fd, segment_id = segments.claim(payload), 0
        else:
            fd, segment_id = segments.lend(payload, returns_to, delivery.job)
        if fd is None:
            return delivery
        return dataclasses.replace(delivery, segment_fd=fd, segment_id=segment_id)

    def _hopeless_recv(self, tag: str, source: str | None, job: str) -> PeerUnreachable | None:
        """Why a recv can never be satisfied, or None (proto/delivery.md, "Receives").

        With a source: that peer is unreachable. Without: every source that has sent
        this tag here is an unreachable peer (every peer, if none has sent it yet).
        """
        backend = self.backend
        peers = backend.peer_names
        if source is not None:
            if source not in peers or not backend.unreachable(source):
                return None
            return PeerUnreachable(
                f"recv {tag!r} from {source}: peer {source} is unreachable "
                f"(silent for {backend.silent_s(source):.1f} s)"
            )
        sources = sorted(self.delivery.inbox.mailbox.sources_of(tag, job) or peers)
        if not sources or any(n not in peers or not backend.unreachable(n) for n in sources):
            return None
        silent = ", ".join(f"{name} silent for {backend.silent_s(name):.1f} s" for name in sources)
        return PeerUnreachable(
            f"recv {tag!r}: every peer that could send it is unreachable ({silent})"
        )

    # -------------------------------------------------------------- views

    def paths(self) -> list[PathRow]:
        return self.backend.rows()

    def status(self, rows: list[PathRow] | None = None) -> GatewayStatus:
        if rows is None:
            rows = self.paths()
        mailbox = self.delivery.inbox.mailbox
        return GatewayStatus(
            site=self.site_name,
            version=__version__,
            uptime_s=round(time.monotonic() - self.started_at, 3),
            peers={name: self.backend.peer_status(name, rows) for name in self.backend.peer_names},
            local_messages=self.local_messages,
            inbox_queued=mailbox.queued_count(),
            inbox_waiting_recvs=mailbox.waiter_count(),
            segments=self.delivery.segments.counts(),
            workers=self.backend.worker_maps(),
            jobs=self._jobs_status(),
        )

    def _jobs_status(self) -> dict[str, Any]:
        """Per job: its policy, and per peer what it sent and received, what is in
        flight, held at the peer and waiting (``status()["jobs"]``)."""
        received = self.delivery.bytes_received
        queued = self.delivery.inbox.mailbox.job_counts()
        stats = {peer: self.backend.job_stats(peer) for peer in self.backend.peer_names}
        jobs: dict[str, Any] = {}
        for job in self.config.jobs.jobs:
            peers = {}
            for peer in sorted(self.backend.peer_names):
                mine = stats[peer].get(job.name)
                peers[peer] = {
                    "bytes_sent": 0 if mine is None else sum(mine.bytes_sent_by_path.values()),
                    "bytes_received": received.get((peer, job.name), 0),
                    "messages_in_flight": 0 if mine is None else mine.messages_in_flight,
                    "held_bytes": 0 if mine is None else mine.held_bytes,
                    "waiting_bytes": 0 if mine is None else mine.waiting_bytes,
                    "waiting_messages": 0 if mine is None else mine.waiting_messages,
                }
            inbox_queued, inbox_bytes = queued.get(job.name, (0, 0))
            jobs[job.name] = {
                "weight": job.weight,
                "paths": None if job.paths is None else list(job.paths),
                "sites": None if job.sites is None else list(job.sites),
                "peers": peers,
                "inbox_queued": inbox_queued,
                "inbox_bytes": inbox_bytes,
                "claims": self.claims.count(job.name),
                "recent_failures": self.book.recent_failures_of(job.name),
            }
        return jobs

    def rows_and_status(self) -> tuple[list[PathRow], GatewayStatus]:
        rows = self.paths()  # a scrape reads both: build the rows once
        return rows, self.status(rows)

    def status_counts(self) -> tuple[int, int, int, int, int]:
        """Peers up, peers, paths up, paths, messages in flight (for ``STATUS=``)."""
        up = {(row.peer, row.path) for row in self.paths() if row.state != PathStateKind.DOWN}
        paths = sum(len(peer.paths) for peer in self.config.peers)
        peers_up = len({peer for peer, _ in up})
        in_flight = self.backend.messages_in_flight()
        return peers_up, len(self.backend.peer_names), len(up), paths, in_flight

    def reset_path(self, peer: str, path: str) -> None:
        if peer not in self.backend.peer_names or path not in {
            p.name for p in self.config.peer(peer).paths
        }:
            raise GatewayError(
                f"no path {path!r} to peer {peer!r} in {self.config.path}",
                code=ErrorCode.UNKNOWN_PATH,
            )
        self.backend.reset_path(peer, path)

    def client_settings(self, job: str = DEFAULT_JOB) -> dict[str, Any]:
        compression = self.config.compression
        collective = self.config.collective_settings()
        declared = self.config.jobs.job(job)
        if declared is not None and declared.sites is not None:
            # the job's collectives span its sites only
            sites = set(declared.sites)
            collective["peers"] = [p for p in collective["peers"] if p in sites]
            collective["weights"] = {s: w for s, w in collective["weights"].items() if s in sites}
        return {
            "compression": {
                "default": compression.default,
                "tags": [list(t) for t in compression.tags],
                "min_lossy_bytes": compression.min_lossy_bytes,
            },
            "max_message_bytes": self.config.limits.max_message_bytes,
            "collective": collective,
            "segments": {
                "min_bytes": self.delivery.segments.min_bytes,
                "pool_bytes": self.config.limits.client_budget_bytes,
                "returns": True,  # a recv may ask to return its segment (``returns``)
            },
        }


def local_delivery(
    site: str,
    submission: Submission,
    allocate: Callable[[int, int | None, str | None], bytearray | memoryview] = (
        lambda size, start, job: bytearray(size)
    ),
    free: Callable[[bytearray | memoryview], None] = lambda body: None,
) -> Delivery:
    """A submission addressed to the gateway's own site, as the delivery it becomes.

    A payload in the sender's shared memory is copied first (no other client may read
    the sender's segment, and the sender could still change it) into ``allocate(size,
    0, job)`` (the daemon gives a segment of its own: shared memory, no private copy), then
    its checksum is checked, as a receiving gateway does for a peer's message: the
    receiving client relies on that (proto/localapi.md). Raises ``GatewayError``
    (``checksum``) if it fails. An in-band payload is the gateway's own copy already.
    """
    payload = submission.payload
    view = memoryview(payload)
    if isinstance(view.obj, mmap.mmap):
        copy = allocate(view.nbytes, 0, submission.job)
        memoryview(copy)[:] = view
        payload = copy
        actual = message_checksum(submission.meta, payload)
        if actual != submission.checksum:
            free(copy)
            raise GatewayError(
                f"send {submission.tag!r} (step {submission.step}) to {site}: the payload's "
                f"checksum is {actual:08x}, the request declares {submission.checksum:08x}",
                code=ErrorCode.CHECKSUM,
            )
    return Delivery(
        source=site,
        tag=submission.tag,
        step=submission.step,
        critical=submission.critical,
        meta=submission.meta,
        payload=payload,
        checksum=submission.checksum,
        job=submission.job,
    )
