"""A gateway service for one site on its own, for the local API tests: no daemon, no peers.

Messages addressed to the site's own name go straight into the site's inbox (the same
path the daemon uses for intra-site delivery); any other peer is unknown here. Jobs are
as the daemon has them: declared ones only (``default`` unless told others), admitted by
their allow lists, with claims per job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

from wangate import __version__
from wangate.config.jobs import job_admission_error, unknown_job_error
from wangate.config.schema import JobConfig, JobsConfig
from wangate.core.jobs import DEFAULT_JOB
from wangate.delivery.delivered import Delivery
from wangate.delivery.inbox import Inbox
from wangate.delivery.streams import IncomingStream
from wangate.errors import ErrorCode, GatewayError
from wangate.gateway.claims import CollectiveClaims
from wangate.gateway.service import local_delivery
from wangate.rows import GatewayStatus, PathRow
from wangate.service import Claimant, Submission


@dataclass(frozen=True)
class _JobsOnly:
    """What ``unknown_job_error`` reads of a config."""

    path: Path
    jobs: JobsConfig


def default_client_settings(max_message_bytes: int) -> dict[str, Any]:
    return {
        "compression": {"default": "none", "tags": [], "min_lossy_bytes": 0},
        "max_message_bytes": max_message_bytes,
        "collective": {"peers": [], "weights": {}},
    }


class SelfSiteService:
    """``GatewayService`` delivering only to its own site."""

    def __init__(
        self,
        site_name: str,
        inbox: Inbox,
        client_settings: dict[str, Any],
        *,
        started_at_s: float | None = None,
        jobs: Iterable[JobConfig] = (),
    ) -> None:
        # as a config has them: default first, declared or not
        declared = {DEFAULT_JOB: JobConfig(DEFAULT_JOB), **{job.name: job for job in jobs}}
        self.jobs = _JobsOnly(Path("wangate.toml"), JobsConfig(jobs=tuple(declared.values())))
        self.claims = CollectiveClaims()
        self.joined: list[tuple[str, int]] = []  # (job, uid) of every admitted join
        self._site_name = site_name
        self.inbox = inbox
        self._client_settings = client_settings
        self._message_ids = count(1)
        self._started_at_s = time.monotonic() if started_at_s is None else started_at_s
        self.submitted = 0
        self.received = 0
        self.returned_ids: list[tuple[int, int]] = []  # (connection, segment id) returned

    @property
    def site_name(self) -> str:
        return self._site_name

    def _check_peer(self, submission: Submission) -> None:
        if submission.peer != self._site_name:
            raise GatewayError(
                f"unknown peer {submission.peer!r}: this gateway ({self._site_name!r}) "
                "has no path to it; check [[peers]] in the config",
                code="unknown_peer",
            )

    def join(self, job: str, uid: int, gids: tuple[int, ...]) -> str:
        declared = self.jobs.jobs.job(job)
        if declared is None:
            message = unknown_job_error(job, self.jobs)  # type: ignore[arg-type]
            raise GatewayError(message, code=ErrorCode.UNKNOWN_JOB)
        refused = job_admission_error(declared, uid, gids, os.getuid())
        if refused is not None:
            raise GatewayError(refused, code=ErrorCode.JOB_DENIED)
        self.joined.append((job, uid))
        return job

    def claim(self, job: str, call: str, step: int, by: Claimant) -> None:
        self.claims.claim(job, call, step, by)

    def left(self, connection: int) -> None:
        self.claims.release(connection)

    def returned(self, connection: int, segment_ids: Sequence[int]) -> None:
        self.returned_ids.extend((connection, segment_id) for segment_id in segment_ids)

    def submit_now(self, submission: Submission) -> int | None:
        self._check_peer(submission)
        if not self.inbox.try_deliver(local_delivery(self._site_name, submission)):
            return None
        self.submitted += 1
        return next(self._message_ids)

    async def submit(self, submission: Submission) -> int:
        self._check_peer(submission)
        message_id = next(self._message_ids)
        await self.inbox.deliver(local_delivery(self._site_name, submission))
        self.submitted += 1
        return message_id

    async def receive(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        job: str = DEFAULT_JOB,
        returns_to: int | None = None,  # delivers no segments: none to lend
    ) -> Delivery:
        delivery = await self.inbox.receive(tag, source, step, timeout_s, job=job)
        self.received += 1
        return delivery

    async def receive_stream(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        job: str = DEFAULT_JOB,
    ) -> Delivery | IncomingStream:
        return await self.receive(tag, source, step, timeout_s, job)  # within a site: whole

    def paths(self) -> list[PathRow]:
        return []

    def status(self) -> GatewayStatus:
        return GatewayStatus(
            site=self._site_name,
            version=__version__,
            uptime_s=round(time.monotonic() - self._started_at_s, 3),
            peers={},
            local_messages=self.submitted,
            inbox_queued=self.inbox.mailbox.queued_count(),
            inbox_waiting_recvs=self.inbox.mailbox.waiter_count(),
        )

    def client_settings(self, job: str = DEFAULT_JOB) -> dict[str, Any]:
        return self._client_settings

    def reset_path(self, peer: str, path: str) -> None:
        raise GatewayError(
            f"no path {path!r} to {peer!r}: this gateway has no peers", code="unknown_path"
        )
