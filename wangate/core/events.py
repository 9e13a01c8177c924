"""Events a ``PeerSession`` hands to the daemon (pulled with ``next_event()``): every
event of the core is here."""

from __future__ import annotations

from dataclasses import dataclass

from wangate.core.message import MessageHeader
from wangate.core.states import PathStateKind, PeerStateKind


@dataclass(frozen=True)
class MessageReceived:
    """A whole message arrived from the peer and its checksum matched."""

    msg_id: int
    header: MessageHeader
    payload: memoryview
    body_bytes: int  # hand back with ``PeerSession.consumed`` once a trainer took it


@dataclass(frozen=True)
class MessageProgress:
    """A large message from the peer has its first ``ready_bytes`` in, contiguous, not
    yet verified: its header at the first report, then each time the prefix crosses a
    step (``Reassembly.progress_step``). Never per datagram. ``body`` is where it is
    being assembled; ``MessageReceived`` or ``MessageDropped`` follows for the id."""

    msg_id: int
    body: memoryview
    ready_bytes: int


@dataclass(frozen=True)
class MessageDelivered:
    """The peer acknowledged every byte of one of our messages."""

    msg_id: int
    body_bytes: int
    elapsed_s: float  # from submit to the receiver's confirmation
    critical: bool = False


@dataclass(frozen=True)
class SendFailed:
    """One of our messages cannot be delivered; the reason says why. (The trainer
    waiting on it is told with ``wangate.errors.MessageFailed``.)"""

    msg_id: int
    reason: str
    tag: str = ""
    step: int = 0
    # the peer restarted: its old instance may have had it (and handed it to a
    # trainer); a new attempt would reach an instance that knows nothing of it
    restarted: bool = False


@dataclass(frozen=True)
class MessageTaken:
    """A trainer at the peer took one of our messages from its inbox: delivered."""

    msg_id: int


@dataclass(frozen=True)
class PeerStateChanged:
    """The peer's liveness changed: up, degraded, unreachable or restarted."""

    state: PeerStateKind
    reason: str


@dataclass(frozen=True)
class MessageDropped:
    """A message from the peer was discarded (bad checksum, malformed, too large, expired)."""

    msg_id: int
    reason: str
    code: int = 0  # the REJECT_* code the sender is told (wangate.core.frames)


@dataclass(frozen=True)
class PathStateChanged:
    path: str
    state: PathStateKind
    reason: str


@dataclass(frozen=True)
class RouteChanged:
    """The critical route moved (``CriticalPathSelector.update``)."""

    previous: str | None
    current: str | None
    reason: str
    at: float


Event = (
    MessageReceived
    | MessageProgress
    | MessageDelivered
    | SendFailed
    | MessageTaken
    | MessageDropped
    | PeerStateChanged
    | PathStateChanged
    | RouteChanged
)
