"""wangate: a gradient transport gateway between training sites.

Trainers use ``Client`` / ``AsyncClient`` to hand numpy arrays to their site's gateway
and to receive the ones that arrive.
"""

from __future__ import annotations

__version__ = "0.1.0"

from wangate.client import AsyncClient, Client
from wangate.collective import PartialResult
from wangate.errors import (
    AuthenticationError,
    ChecksumError,
    CodecError,
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    ConfigError,
    FrameChecksumError,
    GatewayError,
    GatewayUnavailable,
    LocalProtocolError,
    RecvTimeout,
    RemoteProtocolError,
    WangateError,
)

__all__ = [
    "AsyncClient",
    "AuthenticationError",
    "ChecksumError",
    "Client",
    "CodecError",
    "CollectiveError",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "ConfigError",
    "FrameChecksumError",
    "GatewayError",
    "GatewayUnavailable",
    "LocalProtocolError",
    "PartialResult",
    "RecvTimeout",
    "RemoteProtocolError",
    "WangateError",
    "__version__",
]
