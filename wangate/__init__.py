"""wangate: a gradient transport gateway between training sites.

Trainers use ``Client`` / ``AsyncClient`` to hand numpy arrays to their site's gateway
and to receive the ones that arrive.
"""

from __future__ import annotations

__version__ = "0.1.0"

from wangate.client import AsyncClient, Client
from wangate.collective import PartialResult
from wangate.errors import (
    AccessDenied,
    AuthenticationError,
    ChecksumError,
    CodecError,
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    ConfigError,
    DeadlineExceeded,
    FrameChecksumError,
    GatewayError,
    GatewayUnavailable,
    LocalProtocolError,
    MessageFailed,
    PeerUnreachable,
    RecvTimeout,
    RemoteProtocolError,
    TooManyConnections,
    WangateError,
)

__all__ = [
    "AccessDenied",
    "AsyncClient",
    "AuthenticationError",
    "ChecksumError",
    "Client",
    "CodecError",
    "CollectiveError",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "ConfigError",
    "DeadlineExceeded",
    "FrameChecksumError",
    "GatewayError",
    "GatewayUnavailable",
    "LocalProtocolError",
    "MessageFailed",
    "PartialResult",
    "PeerUnreachable",
    "RecvTimeout",
    "RemoteProtocolError",
    "TooManyConnections",
    "WangateError",
    "__version__",
]
