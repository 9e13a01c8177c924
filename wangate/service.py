"""What the local API asks of a gateway: the seam between the Unix socket and the daemon.

The local API server (``wangate.localapi``) speaks to trainers and calls a
``GatewayService``; the daemon implements it. Payload buffers are handed over, not
copied: a submitted ``bytearray`` belongs to the gateway from then on.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from wangate.core.buffer import Buffer
from wangate.core.message import message_checksum
from wangate.errors import GatewayError
from wangate.rows import GatewayStatus, PathRow

if TYPE_CHECKING:  # for the annotation only: the daemon side needs no streams here
    from wangate.localapi.streams import IncomingStream


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


@dataclass(frozen=True)
class Delivery:
    """A message that arrived, verified, waiting for a trainer's ``recv``."""

    source: str
    tag: str
    step: int
    critical: bool
    meta: bytes
    payload: Buffer
    checksum: int
    msg_id: int = 0  # the sending gateway's id for it; 0 for messages within the site
    body_bytes: int = 0  # the message body the session counted (header too): credit to release
    # the sealed shared-memory segment that holds the body (the payload ends it), now
    # the delivery's: handed to a trainer that takes segments, else closed
    segment_fd: int | None = None


def local_delivery(
    site: str,
    submission: Submission,
    allocate: Callable[[int, int | None], bytearray | memoryview] = (
        lambda size, start: bytearray(size)
    ),
    free: Callable[[bytearray | memoryview], None] = lambda body: None,
) -> Delivery:
    """A submission addressed to the gateway's own site, as the delivery it becomes.

    A payload in the sender's shared memory is copied first (no other client may read
    the sender's segment, and the sender could still change it) into ``allocate(size,
    0)`` (the daemon gives a segment of its own: shared memory, no private copy), then
    its checksum is checked, as a receiving gateway does for a peer's message: the
    receiving client relies on that (proto/localapi.md). Raises ``GatewayError``
    (``checksum``) if it fails. An in-band payload is the gateway's own copy already.
    """
    payload = submission.payload
    view = memoryview(payload)
    if isinstance(view.obj, mmap.mmap):
        copy = allocate(view.nbytes, 0)
        memoryview(copy)[:] = view
        payload = copy
        actual = message_checksum(submission.meta, payload)
        if actual != submission.checksum:
            free(copy)
            raise GatewayError(
                f"send {submission.tag!r} (step {submission.step}) to {site}: the payload's "
                f"checksum is {actual:08x}, the request declares {submission.checksum:08x}",
                code="checksum",
            )
    return Delivery(
        source=site,
        tag=submission.tag,
        step=submission.step,
        critical=submission.critical,
        meta=submission.meta,
        payload=payload,
        checksum=submission.checksum,
    )


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

    async def receive(
        self, tag: str, source: str | None, step: int | None, timeout_s: float | None
    ) -> Delivery:
        """Wait for a message matching tag (and source/step when given); oldest first.

        Raises ``RecvTimeout`` when ``timeout_s`` passes first.
        """
        ...

    async def receive_stream(
        self, tag: str, source: str | None, step: int | None, timeout_s: float | None
    ) -> Delivery | IncomingStream:
        """``receive``, or a large message still arriving whose header is in (its
        segment's descriptor and progress with it; ``wangate.localapi.streams``)."""
        ...

    async def wait_message(self, peer: str, msg_id: int, timeout_s: float | None) -> None:
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

    def client_settings(self) -> dict[str, Any]:
        """What a client needs on connect: compression policy, size limits."""
        ...

    def reset_path(self, peer: str, path: str) -> None:
        """Close that path's connection now; it reconnects by itself.

        Raises ``GatewayError`` (code ``unknown_path``) for a path not configured.
        """
        ...
