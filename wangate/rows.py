"""What a gateway reports about itself: one ``PathRow`` per path and a ``GatewayStatus``.

Defined once here and read everywhere: the daemon builds them, the local API sends
their ``to_dict()`` (``wangate paths --json`` rows and the ``status`` map, keys in
proto/localapi.md), the CLI and the demo print them (``wangate.views``), metrics expose
them (``wangate.metrics``), collectives weigh sites by them. Plain data: no imports
beyond the standard library, the errors and the states (``wangate.core.states``, which
imports nothing else), so every layer may use it.

``from_dict`` reads what a gateway sent: the keys it needs must be there with the
right types (an error names the key), keys it does not know are ignored, so a newer
gateway may add some.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from wangate.core.states import PathStateKind, PeerStateKind
from wangate.errors import RemoteProtocolError

# every state in order, one metric label each
PATH_STATES = tuple(PathStateKind)
PEER_STATES = tuple(PeerStateKind)
PATH_ROLES = ("critical", "backup", "bulk")


@dataclass(frozen=True)
class PathRow:
    """One configured path to one peer, as ``wangate paths`` shows it.

    Measurements are None while the path has never been connected; the fields after
    ``peer_state`` are known only once it has been.
    """

    peer: str
    path: str
    local: str  # "IP:PORT" bound, or the configured bind address ("*": any) while down
    remote: str  # "IP:PORT", or "(peer dials)" for a path only the peer dials
    state: PathStateKind
    state_reason: str  # why the state is what it is ("ok" when up)
    srtt_ms: float | None  # smoothed RTT (RFC 9002 5.3)
    min_rtt_ms: float | None  # minimum RTT over the last 10 s
    jitter_ms: float | None  # interarrival jitter (RFC 3550 6.4.1)
    loss: float | None  # fraction of the last datagrams (up to 1000) lost
    loss_samples: int  # datagram outcomes behind ``loss``
    rate_mbps: float | None  # delivery rate: highest acknowledged rate over the last 10 s
    sent_bytes: int
    recv_bytes: int
    role: str  # for our sends: critical, backup or bulk
    peer_state: PeerStateKind
    rtt_p99_ms: float | None = None
    inflight_bytes: int | None = None
    acked_bytes: int | None = None
    lost_bytes: int | None = None
    spurious_losses: int | None = None  # declared lost, acknowledged later
    rto_ms: float | None = None  # current loss-detection timeout
    peer_role: str | None = None  # the peer's route for its critical sends: critical or bulk
    last_switch_s: float | None = None  # since the critical route last moved
    last_switch_reason: str | None = None
    # delivery rate while kept busy, over busy time: kept while idle (core/capacity.py)
    capacity_mbps: float | None = None
    worker: int | None = None  # the worker process that carries it ([workers] count >= 2)
    # per job: what it sent on this path ({"bytes_sent": n, "datagrams_sent": n})
    jobs: Mapping[str, Any] = field(default_factory=dict)
    # the connection's data plane (proto/engine.md): its packet counters and controller
    data_plane: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def not_connected(
        cls,
        peer: str,
        path: str,
        local: str,
        remote: str,
        peer_state: PeerStateKind = PeerStateKind.UP,
    ) -> PathRow:
        """A path that has never had a connection: nothing measured yet."""
        return cls.from_dict(
            {
                "peer": peer, "path": path, "local": local, "remote": remote,
                "state": PathStateKind.DOWN,
                "state_reason": "not connected", "srtt_ms": None, "min_rtt_ms": None,
                "jitter_ms": None, "loss": None, "loss_samples": 0, "rate_mbps": None,
                "sent_bytes": 0, "recv_bytes": 0, "role": "bulk", "peer_state": peer_state,
            }
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The ``paths`` row of the local API and ``wangate paths --json``."""
        row = dataclasses.asdict(self)
        if row["worker"] is None:
            del row["worker"]  # only with worker processes: one process reports as before
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> PathRow:
        return _from_dict(cls, row, "path row")

    @classmethod
    def from_dicts(cls, rows: Any) -> list[PathRow]:
        """The rows of a ``paths`` reply (``Client.paths()``)."""
        if not isinstance(rows, list | tuple):
            raise RemoteProtocolError(f"path rows must be a list, not {type(rows).__name__}")
        return [cls.from_dict(row) for row in rows]


@dataclass(frozen=True)
class PeerStatus:
    """One peer as ``status`` shows it (proto/delivery.md for the states)."""

    state: PeerStateKind
    state_reason: str
    silent_s: float  # since anything was heard from the peer
    messages_held: int  # done, but no trainer there took them yet
    paths_up: tuple[str, ...]  # paths not down, by name
    # the session's counters (messages_sent, bytes_received, fec_bytes, ...): flat in the map
    counters: Mapping[str, int | float] = field(default_factory=dict)
    # the last messages that failed: msg_id, tag, step, reason
    recent_failures: tuple[Mapping[str, Any], ...] = ()

    def counter(self, name: str) -> int | float:
        return self.counters.get(name, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "state_reason": self.state_reason,
            "silent_s": self.silent_s,
            "messages_held": self.messages_held,
            "paths_up": list(self.paths_up),
            **self.counters,
            "recent_failures": [dict(f) for f in self.recent_failures],
        }

    @classmethod
    def from_dict(cls, info: Mapping[str, Any]) -> PeerStatus:
        named = {f.name for f in dataclasses.fields(cls)} - {"counters"}
        counters = {
            k: v for k, v in info.items() if k not in named and _is_number(v) and isinstance(k, str)
        }
        base = {k: info[k] for k in named if k in info}
        base.setdefault("paths_up", ())
        base.setdefault("recent_failures", ())
        return _from_dict(cls, {**base, "counters": counters}, "peer status")


@dataclass(frozen=True)
class GatewayStatus:
    """The gateway as ``wangate status`` shows it."""

    site: str
    version: str
    uptime_s: float
    peers: Mapping[str, PeerStatus]
    local_messages: int  # delivered within the site
    inbox_queued: int  # messages waiting for a trainer's recv
    inbox_waiting_recvs: int  # recvs waiting for a message
    # the gateway's segments of inbound bodies: made, reused, live, lent, pooled, pooled_bytes
    segments: Mapping[str, int] = field(default_factory=dict)
    # with [workers] count >= 2, one map per worker process (proto/localapi.md)
    workers: tuple[Mapping[str, Any], ...] = ()
    # per job: its policy, and per peer its bytes and messages (proto/localapi.md)
    jobs: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        status = {
            "site": self.site,
            "version": self.version,
            "uptime_s": self.uptime_s,
            "peers": {name: peer.to_dict() for name, peer in self.peers.items()},
            "local_messages": self.local_messages,
            "inbox": {"queued": self.inbox_queued, "waiting_recvs": self.inbox_waiting_recvs},
            "segments": dict(self.segments),
        }
        if self.workers:
            status["workers"] = [dict(worker) for worker in self.workers]
        status["jobs"] = {name: dict(job) for name, job in self.jobs.items()}
        return status

    @classmethod
    def from_dict(cls, status: Mapping[str, Any]) -> GatewayStatus:
        peers = status.get("peers")
        inbox = status.get("inbox")
        if not isinstance(peers, Mapping) or not isinstance(inbox, Mapping):
            raise RemoteProtocolError("gateway status: 'peers' and 'inbox' must be maps")
        fields = {
            **{k: v for k, v in status.items() if k not in ("peers", "inbox")},
            "peers": {str(name): PeerStatus.from_dict(_map(info)) for name, info in peers.items()},
            "inbox_queued": inbox.get("queued"),
            "inbox_waiting_recvs": inbox.get("waiting_recvs"),
        }
        return _from_dict(cls, fields, "gateway status")


# ---------------------------------------------------------------- reading


_T = TypeVar("_T")

# What each annotation accepts, from what msgpack or JSON hands back.
_CHECKS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
}


_STATE_KINDS: dict[str, type[PathStateKind] | type[PeerStateKind]] = {
    "PathStateKind": PathStateKind,
    "PeerStateKind": PeerStateKind,
}


def _from_dict(cls: type[_T], row: Mapping[str, Any], what: str) -> _T:
    if not isinstance(row, Mapping):
        raise RemoteProtocolError(f"{what} must be a map, not {type(row).__name__}")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in row:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required:
                raise RemoteProtocolError(f"{what}: missing {f.name!r}")
            continue
        values[f.name] = _checked(f.name, str(f.type), row[f.name], what)
    return cls(**values)


def _checked(name: str, annotation: str, value: Any, what: str) -> Any:
    optional = annotation.endswith(" | None")
    base = annotation.removesuffix(" | None")
    if value is None and optional:
        return None
    kind = _STATE_KINDS.get(base)
    if kind is not None:
        allowed = tuple(state.value for state in kind)
        if value not in allowed:
            raise RemoteProtocolError(f"{what}: {name!r} is {value!r}, not one of {allowed}")
        return kind(value)
    if base.startswith("tuple"):
        if not isinstance(value, list | tuple):
            raise RemoteProtocolError(f"{what}: {name!r} must be a list")
        return tuple(value)
    if base.startswith("Mapping"):
        return _map(value, f"{what}: {name!r}")
    accepted = _CHECKS.get(base)
    if accepted is None or isinstance(value, bool) or not isinstance(value, accepted):
        raise RemoteProtocolError(f"{what}: {name!r} must be {annotation}, got {value!r}")
    return float(value) if isinstance(value, int | float) and base == "float" else value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _map(value: Any, what: str = "gateway status: a peer") -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise RemoteProtocolError(f"{what} must be a map")
    return dict(value)
