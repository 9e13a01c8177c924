"""What the local API asks of a gateway: the seam between the Unix socket and the daemon.

The local API server (``wangate.localapi``) speaks to trainers and calls a
``GatewayService``; the daemon implements it. Payload buffers are handed over, not
copied: a submitted ``bytearray`` belongs to the gateway from then on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from wangate.core.buffer import Buffer
from wangate.core.jobs import DEFAULT_JOB
from wangate.delivery.delivered import Delivery
from wangate.delivery.streams import IncomingStream
from wangate.rows import GatewayStatus, PathRow


@dataclass(frozen=True)
class Submission:
    """A message a trainer hands over for delivery to ``peer``."""

    peer: str
    tag: str
    step: int
    critical: bool
    meta: bytes  # tensor description from wangate.codec (dtype, shape, codec); opaque here
    payload: Buffer  # the tensor bytes as encoded by the client
    checksum: int  # CRC-32 of meta followed by payload, computed by the sending client
    deadline_s: float | None = None  # give the message up if not confirmed by then
    # (descriptor, offset of the payload in it) when the payload is a trainer's
    # shared-memory segment: open while the payload lives; dup it, never close it
    segment: tuple[int, int] | None = None
    job: str = DEFAULT_JOB  # the trainer connection's job: its namespace and its share


@dataclass(frozen=True)
class Claimant:
    """One trainer connection: its number in this gateway, and its process id."""

    connection: int
    pid: int


class GatewayService(Protocol):
    """Implemented by the daemon; called by the local API server."""

    @property
    def site_name(self) -> str: ...

    async def submit(self, submission: Submission) -> int:
        """Accept a message for sending; returns its message id once accepted.

        Raises ``GatewayError`` (unknown peer, over budget, too large) without
        affecting anyone else's messages.
        """
        ...

    def submit_now(self, submission: Submission) -> int | None:
        """``submit`` when it need not wait: the message id, or None to ``submit`` later."""
        ...

    def join(self, job: str, uid: int, gids: tuple[int, ...]) -> str:
        """Admit a trainer process to ``job``; returns it. Raises ``GatewayError``
        (``unknown_job``, ``job_denied``) naming the job and why not."""
        ...

    def claim(self, job: str, call: str, step: int, by: Claimant) -> None:
        """``by`` enters collective ``call`` at ``step`` in ``job``; raises
        ``GatewayError`` (``collision``) while another connection is in it."""
        ...

    def left(self, connection: int) -> None:
        """A trainer connection closed: what it held at the gateway ends."""
        ...

    async def receive(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        job: str = DEFAULT_JOB,
        returns_to: int | None = None,
    ) -> Delivery:
        """Wait for a message of ``job`` matching tag (and source/step when given);
        oldest first. With ``returns_to`` (a connection), a delivery in a segment says
        the ``segment_id`` by which that connection returns it.

        Raises ``RecvTimeout`` when ``timeout_s`` passes first.
        """
        ...

    def returned(self, connection: int, segment_ids: Sequence[int]) -> None:
        """``connection``'s client let go of these segments (``receive``'s ids)."""
        ...

    async def receive_stream(
        self,
        tag: str,
        source: str | None,
        step: int | None,
        timeout_s: float | None,
        job: str = DEFAULT_JOB,
    ) -> Delivery | IncomingStream:
        """``receive``, or a large message still arriving whose header is in (its
        segment's descriptor and progress with it; ``wangate.delivery.streams``)."""
        ...

    async def wait_message(
        self, peer: str, msg_id: int, timeout_s: float | None, job: str = DEFAULT_JOB
    ) -> None:
        """Return once a trainer at ``peer`` took message ``msg_id`` (proto/delivery.md).

        Raises ``MessageFailed`` (id, tag, step, reason) if it will never be,
        ``PeerUnreachable`` while the peer is, ``RecvTimeout`` when ``timeout_s`` passes.
        """
        ...

    def paths(self) -> list[PathRow]:
        """One row per configured path (``wangate paths``)."""
        ...

    def status(self) -> GatewayStatus:
        """Site name, version, uptime, peers and their state, message counters."""
        ...

    def client_settings(self, job: str = DEFAULT_JOB) -> dict[str, Any]:
        """What a client of ``job`` needs on connect: compression policy, size limits,
        the sites its collectives span."""
        ...

    def reset_path(self, peer: str, path: str) -> None:
        """Close that path's connection now; it reconnects by itself.

        Raises ``GatewayError`` (code ``unknown_path``) for a path not configured.
        """
        ...
