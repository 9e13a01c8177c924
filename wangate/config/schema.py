"""What a validated configuration holds: frozen dataclasses, one per TOML section, and
the bounds the parser checks values against."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wangate.core.jobs import DEFAULT_JOB, JobPolicy, spread_paths
from wangate.errors import ConfigError

# RFC 9000 section 14: QUIC needs UDP payloads of 1200 bytes; with IPv6 (40) and UDP (8)
# headers that is an MTU of 1248, so the IPv6 minimum link MTU of 1280 is the floor.
MIN_MTU = 1280
MAX_MTU = 65535
MAX_WORKERS = 64
MAX_JOB_WEIGHT = 1000.0
PLACEMENTS = ("share", "spread")
_IPV4_UDP_OVERHEAD = 20 + 8
_IPV6_UDP_OVERHEAD = 40 + 8


@dataclass(frozen=True)
class PathConfig:
    name: str
    local: str | None  # bind IP for this path (dial side); None = wildcard
    remote: tuple[str, int] | None  # None = we do not dial this path; the peer dials us
    mtu: int = 1500  # datagram size follows it

    @property
    def max_datagram_size(self) -> int:
        """Largest UDP payload for this path: the MTU less IP and UDP headers.

        The family comes from ``remote``, else ``local``; unknown means IPv6 (the larger).
        """
        address = self.remote[0] if self.remote is not None else self.local
        if address is not None and ipaddress.ip_address(address).version == 4:
            return self.mtu - _IPV4_UDP_OVERHEAD
        return self.mtu - _IPV6_UDP_OVERHEAD


@dataclass(frozen=True)
class PeerConfig:
    name: str
    paths: tuple[PathConfig, ...]

    def path(self, name: str) -> PathConfig:
        for path in self.paths:
            if path.name == name:
                return path
        known = ", ".join(p.name for p in self.paths)
        raise ConfigError(f"peer {self.name!r} has no path named {name!r} (it has: {known})")


@dataclass(frozen=True)
class SiteConfig:
    name: str
    socket: Path
    listen: tuple[tuple[str, int], ...]
    socket_mode: int = 0o660
    # local API access (wangate.localapi.access): None = the default, which for
    # allow_gids is the socket file's group; the daemon's user and root always pass
    allow_uids: tuple[int, ...] | None = None
    allow_gids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TlsConfig:
    ca: Path
    cert: Path
    key: Path
    # a private key that group or others may read is refused unless this is set
    allow_readable_key: bool = False


@dataclass(frozen=True)
class LimitsConfig:
    max_message_bytes: int = 4 << 30
    client_budget_bytes: int = 8 << 30  # bytes one trainer connection may have in the daemon
    peer_inbox_bytes: int = 8 << 30  # delivered-but-unclaimed bytes per source peer
    # a partial message from a peer that sends nothing more for it this long is dropped
    partial_message_idle_s: int = 60
    # silent this long, a peer is unreachable: sends to it and recvs only it could
    # satisfy fail at once (proto/delivery.md)
    peer_dead_s: int = 5

    max_local_connections: int = 1024  # trainer connections at once; more are refused


@dataclass(frozen=True)
class CompressionConfig:
    default: str = "none"
    min_lossy_bytes: int = 65536
    tags: tuple[tuple[str, str], ...] = ()  # (glob, spec) in file order


@dataclass(frozen=True)
class MetricsConfig:
    listen: tuple[str, int] | None = None


@dataclass(frozen=True)
class FecConfig:
    """[fec]: forward error correction of shard data (wangate.core.coding)."""

    enabled: bool = True
    # source symbols per block: the repair symbols that keep residual block loss under
    # 1e-3 cost 3 % at 0.1 % loss and 6 % at 1 % with k=64, against 6 % and 12.5 % with
    # k=16 (measured in the lab: bench/RESULTS.md, "Block size")
    k: int = 64
    min_repair: int = 0  # repair symbols per block, at least (even on a clean path)
    max_repair: int = 16  # ...and at most, however lossy the paths
    critical_min_repair: int = 2  # at least this many per block of a critical message


@dataclass(frozen=True)
class CriticalConfig:
    """[critical]: protecting critical messages from bulk (wangate.core.governor)."""

    # while critical traffic flows, bulk is slowed when the gateways' own delay (common to
    # every path) exceeds this. 0 (the default) never slows bulk: when critical and bulk
    # gradients belong to the same step, slowing bulk makes the step slower.
    host_delay_target_ms: int = 0


@dataclass(frozen=True)
class WorkersConfig:
    """[workers]: worker processes (wangate.workers). None: chosen by the host."""

    count: int | None = None

    def resolved(self, cpu_count: int | None, paths: int) -> int:
        """The number of workers: as configured, else one per path plus the critical
        worker, within the cores less one for the coordinator; 1 (no workers: one
        process, as before) on a host of fewer than 4 cores, where the processes would
        only compete for them."""
        if self.count is not None:
            return self.count
        cores = cpu_count or 1
        if cores < 4:
            return 1
        return max(1, min(cores - 1, paths + 1, MAX_WORKERS))


@dataclass(frozen=True)
class CollectiveConfig:
    """[collective]: how allreduce shares the tensor between sites (proto/collective.md)."""

    # site name -> relative share; empty: shares follow measured capacity or are equal
    weights: tuple[tuple[str, float], ...] = ()
    chunk_bytes: int = 1 << 20  # pipelining unit; every site must use the same
    # the bound that picks direct exchange over reduce-scatter/all-gather (Plan.direct)
    rate_mbps: float = 100.0
    delay_ms: float = 30.0


@dataclass(frozen=True)
class JobConfig:
    """[jobs.NAME]: one training job, a namespace with a share of the WAN
    (wangate.core.jobs). None: no restriction (every path, every site, whoever may use
    the socket, no cap of its own beyond the default rule of ``JobsConfig.inflight_cap``)."""

    name: str
    weight: float = 1.0  # share of contended WAN capacity, against the other jobs'
    paths: tuple[str, ...] | None = None  # path names as in [[peers.paths]]
    sites: tuple[str, ...] | None = None  # the sites its collectives span
    allow_uids: tuple[int, ...] | None = None  # who may join it (besides root and the daemon)
    allow_gids: tuple[int, ...] | None = None
    max_inflight_bytes: int | None = None  # per peer: its bytes there no trainer took yet


@dataclass(frozen=True)
class JobsConfig:
    """[jobs]: the jobs sharing this gateway and how their paths are placed. The job
    ``default`` is always there (first), declared or not."""

    placement: str = "share"  # "share": every job its allowed paths; "spread": PLACEMENTS
    jobs: tuple[JobConfig, ...] = (JobConfig(DEFAULT_JOB),)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(job.name for job in self.jobs)

    def job(self, name: str) -> JobConfig | None:
        for job in self.jobs:
            if job.name == name:
                return job
        return None

    def inflight_cap(self, job: JobConfig, peer_inbox_bytes: int) -> int | None:
        """The bytes of ``job``'s messages a peer may hold untaken: the job's own
        ``max_inflight_bytes``; else, when more than one job is configured, half of
        ``[limits] peer_inbox_bytes`` (so a job whose trainers stop reading leaves the
        others at least half of every peer's window); else (only ``default``) None, no
        cap beyond the window. The one place this rule lives."""
        if job.max_inflight_bytes is not None:
            return job.max_inflight_bytes
        if len(self.jobs) > 1:
            return max(1, peer_inbox_bytes // 2)
        return None

    def policies(self, peer_path_names: list[str], peer_inbox_bytes: int) -> dict[str, JobPolicy]:
        """Each job's sending policy towards a peer whose paths are ``peer_path_names``.

        Placement ``share``: a job may use its ``paths`` that the peer has (every path
        when it names none). ``spread``: each job but ``default`` gets paths of its own in
        proportion to its weight, among those it may use
        (``wangate.core.jobs.spread_paths``); ``default``, where clients that name no job
        go, shares as under ``share``, so it takes no path from a job while idle.
        """
        placed: dict[str, frozenset[str] | None] = {
            job.name: None
            if job.paths is None
            else frozenset(p for p in peer_path_names if p in job.paths)
            for job in self.jobs
        }
        spread = [job for job in self.jobs if job.name != DEFAULT_JOB]
        if self.placement == "spread" and spread:
            weights = {job.name: job.weight for job in spread}
            allowed = {
                job.name: None if job.paths is None else frozenset(job.paths) for job in spread
            }
            placed.update(spread_paths(weights, list(peer_path_names), allowed))
        return {
            job.name: JobPolicy(
                job.weight, placed[job.name], self.inflight_cap(job, peer_inbox_bytes)
            )
            for job in self.jobs
        }


@dataclass(frozen=True)
class Config:
    path: Path
    site: SiteConfig
    tls: TlsConfig
    peers: tuple[PeerConfig, ...]
    limits: LimitsConfig
    compression: CompressionConfig
    metrics: MetricsConfig
    fec: FecConfig = FecConfig()
    critical: CriticalConfig = CriticalConfig()
    workers: WorkersConfig = WorkersConfig()
    collective: CollectiveConfig = CollectiveConfig()
    jobs: JobsConfig = JobsConfig()

    def job(self, name: str) -> JobConfig | None:
        """The job ``name``, or None (``wangate.config.jobs.unknown_job_error`` words it)."""
        return self.jobs.job(name)

    def job_policies(self, peer_path_names: list[str]) -> dict[str, JobPolicy]:
        """Each job's policy towards a peer with these paths (``JobsConfig.policies``)."""
        return self.jobs.policies(peer_path_names, self.limits.peer_inbox_bytes)

    def collective_settings(self) -> dict[str, Any]:
        """What a trainer's client needs for collectives (sent in the hello reply)."""
        return {
            "peers": sorted(p.name for p in self.peers),
            "weights": dict(self.collective.weights),
            "chunk_bytes": self.collective.chunk_bytes,
            "rate_mbps": self.collective.rate_mbps,
            "delay_ms": self.collective.delay_ms,
        }

    def peer(self, name: str) -> PeerConfig:
        for peer in self.peers:
            if peer.name == name:
                return peer
        known = ", ".join(p.name for p in self.peers) or "none"
        raise ConfigError(f"{self.path}: no peer named {name!r} (configured peers: {known})")
