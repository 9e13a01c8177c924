"""The states of a path and of a peer, and which changes between them are allowed.

Each machine's transitions are in one table, as ``LinkState``'s are
(``wangate.net.link``), and each state is changed in one method that checks it
(``PathRecord.move``, ``PeerLiveness.move``). The values are the strings ``paths``,
``status``, the metrics and the client show, and a member compares equal to its string.
"""

from __future__ import annotations

import enum
from typing import Final, TypeVar

from wangate.errors import LocalProtocolError


class PathStateKind(enum.StrEnum):
    """A path's health (``wangate paths``; ``PathEstimator.state`` judges it)."""

    UP = "up"
    DEGRADED = "degraded"  # slow or lossy, still used
    DOWN = "down"  # closed, or silent past its timeout: carries nothing


class PeerStateKind(enum.StrEnum):
    """Whether the peer gateway is there (proto/delivery.md, "Peer liveness")."""

    UP = "up"
    DEGRADED = "degraded"  # quiet a while, not connected yet, or not all paths up
    UNREACHABLE = "unreachable"  # silent past peer_dead_s: its messages failed
    RESTARTED = "restarted"  # a new instance of the peer, for peer_dead_s


# A path that is down comes back only through a connection or a word heard on it, as
# up; it is judged again after that.
PATH_TRANSITIONS: Final[dict[PathStateKind, frozenset[PathStateKind]]] = {
    PathStateKind.UP: frozenset({PathStateKind.DEGRADED, PathStateKind.DOWN}),
    PathStateKind.DEGRADED: frozenset({PathStateKind.UP, PathStateKind.DOWN}),
    PathStateKind.DOWN: frozenset({PathStateKind.UP}),
}

# The peer's state follows from its silence, its restarts and its paths, which change
# in any order: each state may follow any other.
PEER_TRANSITIONS: Final[dict[PeerStateKind, frozenset[PeerStateKind]]] = {
    state: frozenset(set(PeerStateKind) - {state}) for state in PeerStateKind
}


_S = TypeVar("_S", PathStateKind, PeerStateKind)


def check_transition(table: dict[_S, frozenset[_S]], old: _S, new: _S, what: str) -> bool:
    """Whether ``old`` -> ``new`` changes anything; raises if the table forbids it."""
    if new == old:
        return False
    if new not in table[old]:
        raise LocalProtocolError(f"{what}: {old} -> {new} is not allowed")
    return True
