"""Where a client finds its gateway, and how long connecting to it may take."""

from __future__ import annotations

import os

DEFAULT_SOCKET = "/run/wangate/wangate.sock"
SOCKET_ENV = "WANGATE_SOCKET"
# Bounds connecting and the hello exchange (not later calls): a gateway that accepts
# and never answers must not hang the trainer.
CONNECT_TIMEOUT_S = 30.0
NO_BOUND_S = 1e9  # a timeout this long (or infinite) is no timeout: time_t limits


def socket_path(path: str | os.PathLike[str] | None) -> str:
    return os.fspath(path) if path is not None else os.environ.get(SOCKET_ENV, DEFAULT_SOCKET)


def checked_timeout(timeout: float | None) -> float | None:
    """``timeout`` if positive; infinity (or decades) means no bound (None)."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")
    return None if timeout is not None and timeout >= NO_BOUND_S else timeout
