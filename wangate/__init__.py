"""wangate: a gradient transport gateway between training sites.

Trainers use ``Client`` / ``AsyncClient`` to hand numpy arrays to their site's gateway
and to receive the ones that arrive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

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

if TYPE_CHECKING:
    from wangate.client import AsyncClient, Client
    from wangate.collective import PartialResult
    from wangate.incoming import AsyncIncomingMessage, IncomingMessage

# The client (numpy, zstandard, msgpack) loads on first use, so that the daemon's core,
# the CLI's start-up and tools that only need the errors do not pay for it (PEP 562).
_LAZY = {
    "AsyncClient": "wangate.client",
    "Client": "wangate.client",
    "PartialResult": "wangate.collective",
    "IncomingMessage": "wangate.incoming",
    "AsyncIncomingMessage": "wangate.incoming",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wangate' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AccessDenied",
    "AsyncClient",
    "AsyncIncomingMessage",
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
    "IncomingMessage",
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
