"""What the service needs of whoever moves the messages: the seam below the service.

Two backends implement it: ``DriverBackend`` (wangate.gateway.drivers), which drives
every peer in this process, and ``Coordinator`` (wangate.workers.coordinator), which
hands stripes of each message to worker processes. The service (submit with
back-pressure, deadlines, outcomes, receive, status) is written once over this.
Every question names a peer the backend knows (``peer_names``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

from wangate.core.fairqueue import JobSendStats
from wangate.delivery.delivered import Delivery
from wangate.reload import ReloadPlan
from wangate.rows import PathRow, PeerStatus
from wangate.service import Submission


class Backend(Protocol):
    @property
    def peer_names(self) -> Collection[str]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def apply_reload(self, plan: ReloadPlan) -> None:
        """Peers and paths added, removed or changed take effect."""
        ...

    # ------------------------------------------------------------ sending

    def check_reachable(self, peer: str) -> None:
        """Raise ``PeerUnreachable`` (naming the peer and why) while it is."""
        ...

    def pending_bytes(self, peer: str) -> int:
        """Bytes of messages to ``peer`` that it does not hold yet."""
        ...

    def held_back(self, peer: str) -> bool:
        """Nothing more may queue for ``peer`` now (it went quiet)."""
        ...

    def send(self, submission: Submission, arrived_at: float) -> int:
        """Take the message; its id. Raises ``GatewayError`` for a bad request."""
        ...

    def message_state(self, peer: str, msg_id: int) -> str | None:
        """How far a message in flight is (``sending``, ``held``, ...); None once it
        ended or if it never existed."""
        ...

    def last_msg_id(self, peer: str) -> int: ...

    def taken(self, delivery: Delivery) -> None:
        """A trainer took ``delivery``: its credit goes back to its sender."""
        ...

    def reset_path(self, peer: str, path: str) -> None:
        """Close that configured path's connection now; it reconnects by itself."""
        ...

    # -------------------------------------------------------------- views

    def unreachable(self, peer: str) -> bool: ...

    def silent_s(self, peer: str) -> float: ...

    def messages_in_flight(self) -> int: ...

    def rows(self) -> list[PathRow]:
        """One row per configured path."""
        ...

    def peer_status(self, peer: str, rows: list[PathRow]) -> PeerStatus: ...

    def worker_maps(self) -> tuple[Mapping[str, Any], ...]:
        """One map per worker process (none without workers)."""
        ...

    def job_stats(self, peer: str) -> Mapping[str, JobSendStats]:
        """Per job, its sending to ``peer`` (bytes per path, held, waiting)."""
        ...
