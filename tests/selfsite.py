"""A gateway service for one site on its own, for the local API tests: no daemon, no peers.

Messages addressed to the site's own name go straight into the site's inbox (the same
path the daemon uses for intra-site delivery); any other peer is unknown here.
"""

from __future__ import annotations

import time
from itertools import count
from typing import Any

from wangate import __version__
from wangate.delivery.delivered import Delivery
from wangate.delivery.inbox import Inbox
from wangate.delivery.streams import IncomingStream
from wangate.errors import GatewayError
from wangate.gateway.service import local_delivery
from wangate.rows import GatewayStatus, PathRow
from wangate.service import Submission


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
    ) -> None:
        self._site_name = site_name
        self.inbox = inbox
        self._client_settings = client_settings
        self._message_ids = count(1)
        self._started_at_s = time.monotonic() if started_at_s is None else started_at_s
        self.submitted = 0
        self.received = 0

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
        self, tag: str, source: str | None, step: int | None, timeout_s: float | None
    ) -> Delivery:
        delivery = await self.inbox.receive(tag, source, step, timeout_s)
        self.received += 1
        return delivery

    async def receive_stream(
        self, tag: str, source: str | None, step: int | None, timeout_s: float | None
    ) -> Delivery | IncomingStream:
        return await self.receive(tag, source, step, timeout_s)  # within a site: whole

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

    def client_settings(self) -> dict[str, Any]:
        return self._client_settings

    def reset_path(self, peer: str, path: str) -> None:
        raise GatewayError(
            f"no path {path!r} to {peer!r}: this gateway has no peers", code="unknown_path"
        )
