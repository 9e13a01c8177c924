"""Configuration reload (SIGHUP): what changes live, what waits for a restart.

``plan_reload`` compares the running configuration with a newly loaded, already
validated one. Peers and paths are added and removed live; a path whose settings
changed is removed and added again (it reconnects). Compression applies to trainers
that connect from then on. Jobs (``[jobs]``) are added, changed and removed live: the
gateway recomputes every job's policy from the new section (``Config.job_policies``).
Every other setting is fixed at start-up (bound sockets, TLS contexts, per-peer
sessions): a change to it is reported and the running value is kept until the daemon
restarts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from wangate.config import Config, JobsConfig, PathConfig, PeerConfig, load_config
from wangate.errors import ConfigError

log = logging.getLogger("wangate.reload")

# Config sections that are fixed while the daemon runs.
RESTART_SECTIONS = ("site", "tls", "limits", "metrics", "fec", "critical")


@dataclass(frozen=True)
class ReloadPlan:
    """What applying ``effective`` changes on a running gateway."""

    effective: Config  # the new peers and compression, the running values of the rest
    peers_added: tuple[PeerConfig, ...] = ()
    peers_removed: tuple[str, ...] = ()
    paths_added: tuple[tuple[str, PathConfig], ...] = ()  # (peer, path) for existing peers
    paths_removed: tuple[tuple[str, str], ...] = ()  # (peer, path name)
    restart_needed: tuple[str, ...] = ()  # keys like "site.listen" whose change waits
    jobs_added: tuple[str, ...] = ()
    jobs_removed: tuple[str, ...] = ()
    jobs_changed: tuple[str, ...] = ()  # declared in both, with different settings
    placement_changed: bool = False  # [jobs] placement: every job's paths may move

    @property
    def changes(self) -> list[str]:
        """One phrase per live change, for the log."""
        return (
            [f"peer {p.name} added" for p in self.peers_added]
            + [f"peer {name} removed" for name in self.peers_removed]
            + [f"path {peer}/{p.name} added" for peer, p in self.paths_added]
            + [f"path {peer}/{name} removed" for peer, name in self.paths_removed]
            + [f"job {name} added" for name in self.jobs_added]
            + [f"job {name} removed" for name in self.jobs_removed]
            + [f"job {name} changed" for name in self.jobs_changed]
            + (
                [f"job placement now {self.effective.jobs.placement}"]
                if self.placement_changed
                else []
            )
        )


def _changed_keys(section: str, old: Any, new: Any) -> list[str]:
    return [
        f"{section}.{field.name}"
        for field in dataclasses.fields(old)
        if getattr(old, field.name) != getattr(new, field.name)
    ]


def jobs_changed(
    old: JobsConfig, new: JobsConfig
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The jobs of ``new`` that ``old`` lacks, those of ``old`` that ``new`` lacks, and
    those in both whose settings differ, each in file order."""
    added = tuple(job.name for job in new.jobs if old.job(job.name) is None)
    removed = tuple(job.name for job in old.jobs if new.job(job.name) is None)
    changed = tuple(job.name for job in new.jobs if old.job(job.name) not in (None, job))
    return added, removed, changed


def plan_reload(running: Config, new: Config) -> ReloadPlan:
    """The live changes from ``running`` to ``new`` and the keys that need a restart."""
    restart_needed: list[str] = []
    for section in RESTART_SECTIONS:
        restart_needed += _changed_keys(section, getattr(running, section), getattr(new, section))
    effective = dataclasses.replace(
        new, **{section: getattr(running, section) for section in RESTART_SECTIONS}
    )
    old_peers = {p.name: p for p in running.peers}
    new_peers = {p.name: p for p in new.peers}
    paths_added: list[tuple[str, PathConfig]] = []
    paths_removed: list[tuple[str, str]] = []
    for name, peer in new_peers.items():
        old = old_peers.get(name)
        if old is None:
            continue
        old_paths = {p.name: p for p in old.paths}
        new_paths = {p.name: p for p in peer.paths}
        for path_name, path in old_paths.items():
            if new_paths.get(path_name) != path:
                paths_removed.append((name, path_name))
        for path_name, path in new_paths.items():
            if old_paths.get(path_name) != path:
                paths_added.append((name, path))
    jobs_added, jobs_removed, jobs_modified = jobs_changed(running.jobs, new.jobs)
    return ReloadPlan(
        effective=effective,
        peers_added=tuple(p for name, p in new_peers.items() if name not in old_peers),
        peers_removed=tuple(name for name in old_peers if name not in new_peers),
        paths_added=tuple(paths_added),
        paths_removed=tuple(paths_removed),
        restart_needed=tuple(restart_needed),
        jobs_added=jobs_added,
        jobs_removed=jobs_removed,
        jobs_changed=jobs_modified,
        placement_changed=running.jobs.placement != new.jobs.placement,
    )


class Reloadable(Protocol):
    """What the reloader needs of a gateway (``wangate.daemon.Gateway``)."""

    config: Config

    def apply_reload(self, plan: ReloadPlan) -> None: ...

    def status_counts(self) -> tuple[int, int, int, int, int]:
        """Peers up, peers, paths up, paths, messages in flight."""
        ...


class Reloader:
    """Reloads a gateway's configuration file and words its state for ``STATUS=``."""

    def __init__(
        self,
        gateway: Reloadable,
        config_path: Path,
        load: Callable[[Path], Config] = load_config,
    ) -> None:
        self.gateway = gateway
        self.config_path = config_path
        self._load = load
        self.restart_needed: tuple[str, ...] = ()
        self.last_error: str | None = None

    def reload(self) -> ReloadPlan | None:
        """Load, validate and apply the file; on any error keep running what runs."""
        try:
            new = self._load(self.config_path)
        except ConfigError as exc:
            self.last_error = str(exc)
            log.error("reload failed, still running the previous configuration: %s", exc)
            return None
        plan = plan_reload(self.gateway.config, new)
        self.gateway.apply_reload(plan)
        self.last_error = None
        self.restart_needed = plan.restart_needed
        log.warning(
            "configuration %s reloaded: %s",
            self.config_path,
            "; ".join(plan.changes) or "no peer, path or job changed",
        )
        if plan.restart_needed:
            log.warning(
                "changes to %s take effect only after a restart (running values kept)",
                ", ".join(plan.restart_needed),
            )
        return plan

    def status_line(self) -> str:
        """One line for systemd's ``STATUS=`` (shown by ``systemctl status``)."""
        peers_up, peers, paths_up, paths, in_flight = self.gateway.status_counts()
        line = (
            f"peers up {peers_up}/{peers}, paths up {paths_up}/{paths}, "
            f"{in_flight} messages in flight"
        )
        if self.restart_needed:
            line += f"; restart needed for {', '.join(self.restart_needed)}"
        if self.last_error is not None:
            line += f"; reload failed: {self.last_error}"
        return line.replace("\n", " ")
