"""One error hierarchy for the whole product.

Modelled on h11: a ``LocalProtocolError`` is our own (or our caller's) misuse, a
``RemoteProtocolError`` is a peer breaking the protocol, and the right response differs:
fix the call, versus drop or penalise the peer.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Every error code a gateway or client puts on an error (``GatewayError.code``, the
    local API's error replies; proto/localapi.md). ``closes_connection``: after a reply
    with this code the gateway closes the trainer's connection (the next frame cannot
    be found, or the connection was refused), so the client must reconnect.
    """

    # a frame the reader cannot step over: the connection closes
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    BAD_FLAGS = "bad_flags"
    HEADER_TOO_LARGE = "header_too_large"
    TOO_LARGE = "too_large"  # a payload over max_message_bytes: not worth skipping
    # the connection itself is refused
    ACCESS_DENIED = "access_denied"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    # one request fails; the connection goes on
    BAD_HEADER = "bad_header"
    BAD_REQUEST = "bad_request"
    UNKNOWN_OP = "unknown_op"
    OVER_BUDGET = "over_budget"
    UNKNOWN_PEER = "unknown_peer"
    UNKNOWN_PATH = "unknown_path"
    UNKNOWN_MESSAGE = "unknown_message"
    PATH_DOWN = "path_down"
    PEER_UNREACHABLE = "peer_unreachable"
    DEADLINE = "deadline"
    MESSAGE_FAILED = "message_failed"
    TIMEOUT = "timeout"
    INTERNAL = "internal"
    ERROR = "error"
    UNKNOWN_JOB = "unknown_job"  # a job the gateway's config does not declare
    JOB_DENIED = "job_denied"  # the job's allow lists do not admit the process
    COLLISION = "collision"  # a second trainer of the job entered the same collective
    BAD_SEGMENT = "bad_segment"  # a shared-memory segment that cannot be used as named
    CHECKSUM = "checksum"  # a segment's bytes (within the site) do not match the checksum
    # raised by the client or the daemon itself, never sent on the socket
    UNAVAILABLE = "unavailable"
    CONNECT_TIMEOUT = "connect_timeout"
    CLOSED = "closed"
    BAD_REPLY = "bad_reply"
    STARTUP = "startup"
    SOCKET_IN_USE = "socket_in_use"
    BAD_SOCKET_PATH = "bad_socket_path"
    SOCKET_ERROR = "socket_error"
    # a stripe's failure, from a worker to its coordinator (proto/workers.md)
    PEER_RESTARTED = "peer_restarted"

    @property
    def closes_connection(self) -> bool:
        return self in _CLOSING_CODES


_CLOSING_CODES = frozenset(
    {
        ErrorCode.BAD_MAGIC,
        ErrorCode.BAD_VERSION,
        ErrorCode.BAD_FLAGS,
        ErrorCode.HEADER_TOO_LARGE,
        ErrorCode.TOO_LARGE,
        ErrorCode.ACCESS_DENIED,
        ErrorCode.TOO_MANY_CONNECTIONS,
    }
)


class LinkError(enum.IntEnum):
    """Application error codes closing a QUIC connection between gateways (proto/wire.md).

    Each one closes that connection; ``unexpected`` ones are logged as warnings.
    """

    AUTHENTICATION_FAILED = 0x2A  # mirrors the TLS alert bad_certificate(42), RFC 8446 §6.2
    PROTOCOL = 0x102  # the peer broke the wire protocol
    DUPLICATE = 0x103  # another connection carries this path (both sites dialed it)
    SHUTDOWN = 0x104  # the gateway stops, or the peer/path left its configuration
    RESET = 0x105  # an operator reset the path (``wangate`` reset_path)

    @property
    def unexpected(self) -> bool:
        return self not in (LinkError.DUPLICATE, LinkError.SHUTDOWN)


class WangateError(Exception):
    """Base of every error wangate raises on purpose."""


class ConfigError(WangateError):
    """A configuration file is invalid; the message names the file and the key."""


class LocalProtocolError(WangateError):
    """We (or the trainer calling us) asked for something the protocol forbids."""


class RemoteProtocolError(WangateError):
    """A peer sent something malformed or forbidden."""


class AuthenticationError(WangateError):
    """A peer gateway failed site authentication."""


class CodecError(WangateError):
    """A tensor could not be encoded or a frame could not be decoded."""


class ChecksumError(RemoteProtocolError):
    """Bytes arrived whose checksum does not match what the sender declared."""


class FrameChecksumError(CodecError, ChecksumError):
    """A tensor frame's bytes do not match the CRC its sender put in it."""


class GatewayError(WangateError):
    """The local gateway refused or failed a request; ``code`` says which kind."""

    def __init__(self, message: str, code: str = ErrorCode.ERROR) -> None:
        super().__init__(message)
        self.code = code


class GatewayUnavailable(GatewayError):
    """The gateway's Unix socket cannot be reached."""


class RecvTimeout(GatewayError, TimeoutError):
    """No matching message arrived before the timeout."""


class PeerUnreachable(GatewayError):
    """A peer gateway has been silent past ``[limits] peer_dead_s``: sends to it and
    receives that only it could satisfy fail at once instead of waiting."""

    def __init__(self, message: str, code: str = ErrorCode.PEER_UNREACHABLE) -> None:
        super().__init__(message, code)


class DeadlineExceeded(GatewayError):
    """A send's deadline passed while it waited for room; nothing was sent."""

    def __init__(self, message: str, code: str = ErrorCode.DEADLINE) -> None:
        super().__init__(message, code)


class MessageFailed(GatewayError):
    """A message accepted earlier will not be delivered; the message names its id, tag,
    step and the reason (peer restarted with it in its inbox, rejected, deadline...)."""

    def __init__(self, message: str, code: str = ErrorCode.MESSAGE_FAILED) -> None:
        super().__init__(message, code)


def failure_text(peer: str, msg_id: int, tag: str, step: int, reason: str) -> str:
    """How a failed message is named, in ``MessageFailed``, ``status`` and the log."""
    return f"message {msg_id} (tag {tag!r}, step {step}) to {peer} failed: {reason}"


class AccessDenied(GatewayUnavailable):
    """The gateway refused this process's connection: its user and groups are not allowed
    (``[site] allow_uids`` / ``allow_gids``)."""


class TooManyConnections(GatewayUnavailable):
    """The gateway already serves ``[limits] max_local_connections`` local connections."""


class CollectiveError(WangateError):
    """A collective call (allreduce, broadcast, barrier) failed; the message says how."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A collective did not complete in time. ``missing`` names the sites that sent nothing
    for it, ``arrived`` counts the messages that did come, per site."""

    def __init__(
        self, message: str, missing: tuple[str, ...] = (), arrived: dict[str, int] | None = None
    ) -> None:
        super().__init__(message)
        self.missing = missing
        self.arrived = dict(arrived or {})


class CollectiveMismatch(CollectiveError):
    """Sites called the same collective with different tensors, roots or sites."""
