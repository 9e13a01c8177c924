"""Who may use the local API: a Unix socket peer's credentials against the allow lists.

The kernel records a connecting process's pid, uid and gid (``SO_PEERCRED``, socket(7)
and unix(7)); its supplementary groups come from ``/proc/PID/status`` (``Groups:``),
read only when the uid and primary gid alone do not admit it. The file mode of the
socket is the first gate; this check is the second, and the only one when the socket
is world-writable (``socket_mode = "0666"``).

``[site] allow_uids`` defaults to none and ``allow_gids`` to the socket file's group;
the daemon's own user and root are always admitted (they can reach it anyway).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from wangate.config.access import group_label, user_label

_UCRED = struct.Struct("3i")  # struct ucred: pid_t pid; uid_t uid; gid_t gid


@dataclass(frozen=True)
class PeerCredentials:
    pid: int  # 0 when the peer is in a pid namespace we cannot see
    uid: int
    gid: int
    groups: tuple[int, ...] = ()  # supplementary groups, when they were read


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """The pid, uid and gid the connecting process had when it called ``connect``."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return PeerCredentials(pid, uid, gid)


def supplementary_groups(pid: int, proc: str = "/proc") -> tuple[int, ...]:
    """The ``Groups:`` of ``/proc/PID/status``; none if the process is gone or unseen."""
    if pid <= 0:
        return ()
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Groups:"):
                    return tuple(int(field) for field in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


@dataclass(frozen=True)
class AccessPolicy:
    """The uids and gids admitted; ``description`` names them (resolved once, at start:
    name look-ups may block, so none happen per connection)."""

    uids: frozenset[int]
    gids: frozenset[int]
    description: str

    @classmethod
    def build(
        cls,
        allow_uids: Iterable[int] | None,
        allow_gids: Iterable[int] | None,
        *,
        socket_gid: int,
        own_uid: int | None = None,
    ) -> AccessPolicy:
        """The daemon's uid and root always; ``allow_gids`` None means the socket's group."""
        own = os.geteuid() if own_uid is None else own_uid
        uids = frozenset({0, own, *(allow_uids or ())})
        gids = frozenset((socket_gid,) if allow_gids is None else allow_gids)
        described = "uids " + ", ".join(user_label(uid) for uid in sorted(uids))
        if gids:
            described += " and members of gids " + ", ".join(group_label(g) for g in sorted(gids))
        return cls(uids, gids, described)

    def admits(self, peer: PeerCredentials) -> bool:
        return (
            peer.uid in self.uids or peer.gid in self.gids or not self.gids.isdisjoint(peer.groups)
        )

    def check(self, peer: PeerCredentials, proc: str = "/proc") -> PeerCredentials | None:
        """None if ``peer`` is admitted; else the peer with the groups that were checked."""
        if peer.uid in self.uids or peer.gid in self.gids:
            return None
        if self.gids:
            peer = PeerCredentials(
                peer.pid, peer.uid, peer.gid, supplementary_groups(peer.pid, proc)
            )
        return None if self.admits(peer) else peer

    def refusal(self, peer: PeerCredentials, socket_path: str) -> str:
        """What a refused client is told: who it is, who is admitted, what to change."""
        groups = ", ".join(str(g) for g in peer.groups) or "none"
        return (
            f"uid {peer.uid} (gid {peer.gid}, supplementary groups {groups}) may not use "
            f"the wangate gateway at {socket_path}: it admits {self.description}. Run as "
            "one of those, join one of those groups, or add the uid to [site] allow_uids "
            "(or a group to allow_gids) in the gateway's config"
        )


def connection_cap_refusal(socket_path: str, max_connections: int) -> str:
    return (
        f"the wangate gateway at {socket_path} already serves {max_connections} local "
        f"connections, its limit ([limits] max_local_connections): close idle clients "
        "or raise the limit"
    )
