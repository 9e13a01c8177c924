"""One error hierarchy for the whole product.

Modelled on h11: a ``LocalProtocolError`` is our own (or our caller's) misuse, a
``RemoteProtocolError`` is a peer breaking the protocol, and the right response differs:
fix the call, versus drop or penalise the peer.
"""

from __future__ import annotations


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

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


class GatewayUnavailable(GatewayError):
    """The gateway's Unix socket cannot be reached."""


class RecvTimeout(GatewayError, TimeoutError):
    """No matching message arrived before the timeout."""


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
