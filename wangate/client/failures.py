"""The errors a client raises: for a gateway it cannot reach or lost, and for a reply
that says a request failed."""

from __future__ import annotations

import errno
from typing import Any

from wangate.errors import (
    AccessDenied,
    DeadlineExceeded,
    ErrorCode,
    GatewayError,
    GatewayUnavailable,
    MessageFailed,
    PeerUnreachable,
    RecvTimeout,
    TooManyConnections,
)
from wangate.localapi.replies import ErrorReply

_REASONS = {
    errno.ENOENT: "no such file (is `wangate run` running?)",
    errno.ECONNREFUSED: "nothing is listening on it (is `wangate run` running?)",
    errno.EACCES: "permission denied (the socket is mode 0660: run as the gateway's "
    "user or add this user to its group)",
    errno.ENOTSOCK: "not a socket",
}


def unavailable(path: str, exc: OSError) -> GatewayUnavailable:
    reason = _REASONS.get(exc.errno or 0, exc.strerror or str(exc))
    return GatewayUnavailable(
        f"cannot reach wangate at {path}: {reason}", code=ErrorCode.UNAVAILABLE
    )


def timed_out(path: str, stage: str, timeout_s: float) -> GatewayUnavailable:
    if stage == "connect":
        what = (
            f"connecting to wangate at {path} timed out after {timeout_s:g} s "
            "(its backlog is full: the daemon is not accepting connections)"
        )
    else:
        what = (
            f"wangate at {path} did not answer hello within {timeout_s:g} s "
            "(the daemon is stuck or overloaded, or something else listens there)"
        )
    return GatewayUnavailable(what, code=ErrorCode.CONNECT_TIMEOUT)


def lost(path: str, why: object) -> GatewayUnavailable:
    return GatewayUnavailable(
        f"lost the connection to wangate at {path}: {why} (did the daemon stop?)",
        code=ErrorCode.UNAVAILABLE,
    )


def closed() -> GatewayUnavailable:
    return GatewayUnavailable("this wangate client is closed", code=ErrorCode.CLOSED)


def malformed(what: object) -> GatewayError:
    return GatewayError(f"malformed reply from the gateway: {what}", code=ErrorCode.BAD_REPLY)


# Replies the gateway sends instead of answering hello, just before it closes.
_REFUSALS: dict[str, type[GatewayUnavailable]] = {
    ErrorCode.ACCESS_DENIED: AccessDenied,
    ErrorCode.TOO_MANY_CONNECTIONS: TooManyConnections,
}
_ERRORS: dict[str, type[GatewayError]] = {
    ErrorCode.PEER_UNREACHABLE: PeerUnreachable,
    ErrorCode.DEADLINE: DeadlineExceeded,
    ErrorCode.MESSAGE_FAILED: MessageFailed,
}


def failure(reply: ErrorReply) -> GatewayError:
    """The exception a failure reply raises; a refusal as its own kind."""
    code, message = reply.code, reply.message
    refusal = _REFUSALS.get(code)
    if refusal is not None:
        return refusal(f"{message} [{code}]", code=code)
    if code == ErrorCode.TIMEOUT:
        return RecvTimeout(message, code=code)
    kind = _ERRORS.get(code)
    if kind is not None:
        return kind(message)
    return GatewayError(f"{message} [{code}]", code=code)


def failure_of(header: dict[str, Any]) -> GatewayError:
    """``failure`` for a reply still as its map (a stream's end, ``wangate.incoming``)."""
    return failure(ErrorReply(header["id"], header["code"], header["error"]))
