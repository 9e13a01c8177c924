"""``[jobs]``: the training jobs that share this gateway, each a namespace with a share
of the WAN (``wangate.core.jobs``), and who may join each.

```toml
[jobs]
placement = "share"          # or "spread"
[jobs.llama-run3]
weight = 3
paths = ["fiber-a"]
sites = ["bj", "sh"]
allow_gids = ["team-a"]
allow_uids = ["alice"]
max_inflight_bytes = 4294967296
```

The job ``default`` always exists; declaring it sets its weight and the rest.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from wangate.config.access import gid_of, group_label, ids, uid_of, user_label
from wangate.config.reader import Reader, toml_key, type_name
from wangate.config.schema import (
    MAX_JOB_WEIGHT,
    PLACEMENTS,
    Config,
    JobConfig,
    JobsConfig,
    PeerConfig,
    SiteConfig,
)
from wangate.core.jobs import DEFAULT_JOB, job_name_error

JOB_KEYS = {"weight", "paths", "sites", "allow_uids", "allow_gids", "max_inflight_bytes"}


def jobs_config(
    reader: Reader, value: object, site: SiteConfig, peers: tuple[PeerConfig, ...]
) -> JobsConfig:
    """The ``[jobs]`` table: ``placement`` and one sub-table per job."""
    if not isinstance(value, dict):
        raise reader.error("jobs", f"expected a table, got {type_name(value)}")
    placement = "share"
    jobs: list[JobConfig] = []
    for name, item in value.items():
        if name == "placement":
            placement = reader.string(item, "jobs.placement")
            if placement not in PLACEMENTS:
                raise reader.error(
                    "jobs.placement", f"{placement!r} is not a placement (share or spread)"
                )
            continue
        jobs.append(_job(reader, name, item, site, peers))
    if not any(job.name == DEFAULT_JOB for job in jobs):
        jobs.append(JobConfig(DEFAULT_JOB))
    jobs.sort(key=lambda job: job.name != DEFAULT_JOB)  # default first, then file order
    return JobsConfig(placement, tuple(jobs))


def _job(
    reader: Reader, name: str, value: object, site: SiteConfig, peers: tuple[PeerConfig, ...]
) -> JobConfig:
    key = f"jobs.{toml_key(name)}"
    problem = job_name_error(name)
    if problem is not None:
        raise reader.error(key, problem)
    if not isinstance(value, dict):
        raise reader.error(
            key, f"expected a table (a job, [{key}]) or the key placement, got {type_name(value)}"
        )
    table = reader.table(value, key, set(), JOB_KEYS)
    weight = 1.0
    if "weight" in table:
        weight = _weight(reader, table["weight"], f"{key}.weight")
    path_names = {path.name for peer in peers for path in peer.paths}
    paths = _names(reader, table.get("paths"), f"{key}.paths", path_names, "a path of any peer")
    site_names = {site.name, *(peer.name for peer in peers)}
    what = "this site or one of its [[peers]]"
    sites = _names(reader, table.get("sites"), f"{key}.sites", site_names, what)
    if paths is not None:
        _check_reach(reader, key, paths, sites, peers)
    cap = None
    if "max_inflight_bytes" in table:
        cap = reader.integer(table["max_inflight_bytes"], f"{key}.max_inflight_bytes", 1)
    return JobConfig(
        name=name,
        weight=weight,
        paths=paths,
        sites=sites,
        allow_uids=ids(reader, table.get("allow_uids"), f"{key}.allow_uids", uid_of),
        allow_gids=ids(reader, table.get("allow_gids"), f"{key}.allow_gids", gid_of),
        max_inflight_bytes=cap,
    )


def _weight(reader: Reader, value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise reader.error(key, f"expected a number, got {type_name(value)} {value!r}")
    if not (math.isfinite(value) and 0 < value <= MAX_JOB_WEIGHT):
        raise reader.error(key, f"{value!r} is out of range (> 0 and <= {MAX_JOB_WEIGHT:g})")
    return float(value)


def _names(
    reader: Reader, value: object, key: str, known: set[str], what: str
) -> tuple[str, ...] | None:
    if value is None:
        return None
    found: list[str] = []
    items = reader.array(value, key)
    if not items:
        raise reader.error(key, "an empty list allows nothing; leave the key out to allow all")
    for index, item in enumerate(items):
        item_key = f"{key}[{index}]"
        name = reader.string(item, item_key)
        if name not in known:
            choices = ", ".join(sorted(known)) or "none"
            raise reader.error(item_key, f"{name!r} is not {what} (configured: {choices})")
        if name in found:
            raise reader.error(item_key, f"{name!r} is listed twice")
        found.append(name)
    return tuple(found)


def _check_reach(
    reader: Reader,
    key: str,
    paths: tuple[str, ...],
    sites: tuple[str, ...] | None,
    peers: tuple[PeerConfig, ...],
) -> None:
    """Every peer the job spans has a path the job may use: else its messages there
    would wait for ever."""
    for peer in peers:
        if sites is not None and peer.name not in sites:
            continue
        own = [path.name for path in peer.paths]
        if not set(own) & set(paths):
            spans = f"{key}.sites names it" if sites is not None else f"{key}.sites is not set"
            raise reader.error(
                f"{key}.paths",
                f"peer {peer.name!r} has none of these paths (it has: {', '.join(own)}), "
                f"and the job spans it ({spans}): its messages there could never be sent",
            )


# -- who may join a job --------------------------------------------------------------


def job_admission_error(
    job: JobConfig, uid: int, gids: Collection[int], daemon_uid: int
) -> str | None:
    """Why a process running as ``uid`` with groups ``gids`` (its primary and its
    supplementary groups, as ``wangate.localapi.access`` reads them) may not join
    ``job``; None if it may.

    As for the socket, root and the daemon's own user are always admitted; a job that
    sets neither ``allow_uids`` nor ``allow_gids`` admits whoever may use the socket.
    Names are looked up only to word a refusal.
    """
    if job.allow_uids is None and job.allow_gids is None:
        return None
    if uid in (0, daemon_uid) or uid in (job.allow_uids or ()):
        return None
    if not set(job.allow_gids or ()).isdisjoint(gids):
        return None
    admitted = []
    if job.allow_gids:
        admitted.append("groups " + ", ".join(group_label(g) for g in job.allow_gids))
    if job.allow_uids:
        admitted.append("users " + ", ".join(user_label(u) for u in job.allow_uids))
    whom = " and ".join(admitted) or "only root and the daemon's user"
    groups = ", ".join(str(g) for g in sorted(set(gids))) or "none"
    return f"job {job.name!r} admits {whom}; this process runs as uid {uid} gids {groups}"


def unknown_job_error(name: str, config: Config) -> str:
    """What a trainer naming a job the config does not declare is told."""
    return f"no job {name!r} in {config.path} (jobs: {', '.join(config.jobs.names)})"
