"""Jobs as the sending session sees them: a weight, the paths a job may use, and how
much of a peer's window it may hold.

A job is a namespace (proto/wire.md, "Messages"): its name travels in every message
header, and two jobs never see each other's messages. Sharing between jobs is the
sender's: weighted fair queueing over messages (``wangate.core.fairqueue``) and a cap on
the bytes one job holds at a peer that no trainer there has taken yet, so a job whose
trainers stop reading fills only its own share of the peer's window.

Pure data: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

DEFAULT_JOB: Final = "default"
MAX_JOB_BYTES: Final = 64
# a job's name: what a config section name, a metric label and a file name all take
JOB_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def job_name_error(name: object) -> str | None:
    """Why ``name`` is not a job name, or None."""
    if not isinstance(name, str) or JOB_NAME.fullmatch(name) is None:
        return (
            f"job name {name!r} must be 1..{MAX_JOB_BYTES} characters of letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return None


@dataclass(frozen=True)
class JobPolicy:
    """What the sender applies to one job's messages to one peer."""

    weight: float = 1.0  # share of contended capacity, against the other jobs' weights
    paths: frozenset[str] | None = None  # the paths it may use; None: every path
    # bytes of its messages started to the peer and not yet taken by a trainer there;
    # None: no cap beyond the peer's window
    max_inflight_bytes: int | None = None


DEFAULT_POLICIES: Final[Mapping[str, JobPolicy]] = {DEFAULT_JOB: JobPolicy()}


def spread_paths(
    weights: Mapping[str, float], paths: list[str], allowed: Mapping[str, frozenset[str] | None]
) -> dict[str, frozenset[str]]:
    """Placement ``spread``: give each job a set of paths of its own, disjoint where
    there are enough paths, each job's count in proportion to its weight (at least one).

    Jobs are placed in order of weight (heaviest first, then name); each takes the
    paths it may use that are least taken so far, so with fewer paths than jobs the
    lightest jobs share the least loaded paths. A job that may use none of ``paths``
    gets the empty set (its messages then wait for a path it may use).
    """
    order = sorted(weights, key=lambda job: (-weights[job], job))
    total = sum(weights.values()) or 1.0
    load = dict.fromkeys(paths, 0.0)
    placed: dict[str, frozenset[str]] = {}
    for job in order:
        mine = [p for p in paths if allowed.get(job) is None or p in allowed[job]]  # type: ignore[operator]
        want = max(1, round(len(paths) * weights[job] / total))
        mine.sort(key=lambda p: (load[p], paths.index(p)))
        chosen = mine[:want]
        for path in chosen:
            load[path] += weights[job]
        placed[job] = frozenset(chosen)
    return placed
