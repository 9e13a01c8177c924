"""``paths`` and ``status`` of a gateway with workers: its workers' reports, merged.

Each worker reports its rows and status every 0.1 s (proto/workers.md). A path has one
row per worker (the ``worker`` key); a peer's counters are the sums over the workers;
its state is ``restarted`` if any worker saw that, else ``up`` if any worker has it up,
else ``degraded`` (``unreachable`` only when every worker finds it so: the coordinator
decides that, from the same reports).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from wangate.config import Config
from wangate.core.fairqueue import JobSendStats
from wangate.core.states import PathStateKind as Path
from wangate.core.states import PeerStateKind as Peer
from wangate.rows import PathRow, PeerStatus
from wangate.workers.pool import WorkerHandle


def worker_rows(workers: Sequence[WorkerHandle], config: Config) -> list[PathRow]:
    rows: list[PathRow] = []
    for handle in workers:
        if handle.report is not None:
            rows += [
                dataclasses.replace(PathRow.from_dict(row), worker=handle.index)
                for row in handle.report["rows"]
            ]
            continue
        for peer in config.peers:  # not reported yet (starting)
            for path in peer.paths:
                row = PathRow.not_connected(peer.name, path.name, path.local or "*", "")
                rows.append(dataclasses.replace(row, worker=handle.index))
    return rows


def peer_infos(workers: Sequence[WorkerHandle], name: str) -> list[Mapping[str, Any]]:
    """What each worker that has reported says of peer ``name``."""
    return [
        h.report["status"]["peers"][name]
        for h in workers
        if h.report is not None and name in h.report["status"]["peers"]
    ]


def silent_s(workers: Sequence[WorkerHandle], name: str) -> float:
    return min((float(i["silent_s"]) for i in peer_infos(workers, name)), default=0.0)


def merged_peer(
    name: str,
    workers: Sequence[WorkerHandle],
    rows: Sequence[PathRow],
    *,
    unreachable: bool,
    in_flight: int,
    failures: Sequence[Mapping[str, Any]],
) -> PeerStatus:
    infos = peer_infos(workers, name)
    counters: dict[str, Any] = {}
    for info in infos:
        for key, value in PeerStatus.from_dict(info).counters.items():
            counters[key] = counters.get(key, 0) + value
    counters["messages_in_flight"] = in_flight  # messages, not stripes
    by_state = {str(info["state"]): info for info in reversed(infos)}
    if unreachable:
        state, reason = Peer.UNREACHABLE, by_state[Peer.UNREACHABLE]["state_reason"]
    elif not infos:
        state, reason = Peer.DEGRADED, "workers starting"
    else:
        order = (Peer.RESTARTED, Peer.UP, Peer.DEGRADED, Peer.UNREACHABLE)
        state = next(s for s in order if s in by_state)
        reason = by_state[state]["state_reason"]
        state = Peer.DEGRADED if state == Peer.UNREACHABLE else state
    return PeerStatus.from_dict(
        {
            **counters,
            "messages_held": sum(int(info["messages_held"]) for info in infos),
            "state": state,
            "state_reason": reason,
            "silent_s": min((float(i["silent_s"]) for i in infos), default=0.0),
            "paths_up": sorted({r.path for r in rows if r.peer == name and r.state != Path.DOWN}),
            "recent_failures": list(failures),
        }
    )


def worker_maps(workers: Sequence[WorkerHandle]) -> tuple[dict[str, Any], ...]:
    """The ``workers`` list of ``status`` (proto/localapi.md)."""
    return tuple(
        {
            "index": h.index,
            "pid": h.pid or 0,
            "role": "critical" if h.index == 0 else "bulk",
            "cpu_s": round(h.cpu_s, 3),
            "queued_bytes": h.queued_bytes,
            "stripes": len(h.stripes),
            "restarts": h.restarts,
        }
        for h in workers
    )


def merged_job_stats(workers: Sequence[WorkerHandle], peer: str) -> dict[str, JobSendStats]:
    """Per job, its sending to ``peer`` summed over the workers' reports: bytes per path
    from their rows, messages and bytes from their status."""
    sent: dict[str, dict[str, int]] = {}
    datagrams: dict[str, dict[str, int]] = {}
    counts: dict[str, dict[str, int]] = {}
    keys = ("messages_in_flight", "held_bytes", "waiting_bytes", "waiting_messages")
    for handle in workers:
        report = handle.report
        if report is None:
            continue
        for row in report["rows"]:
            if row["peer"] != peer:
                continue
            for job, counted in row.get("jobs", {}).items():
                by_path = sent.setdefault(job, {})
                by_path[row["path"]] = by_path.get(row["path"], 0) + counted["bytes_sent"]
                by_path = datagrams.setdefault(job, {})
                by_path[row["path"]] = by_path.get(row["path"], 0) + counted["datagrams_sent"]
        for job, info in report["status"].get("jobs", {}).items():
            mine = info["peers"].get(peer, {})
            total = counts.setdefault(job, dict.fromkeys(keys, 0))
            for key in keys:
                total[key] += int(mine.get(key, 0))
    return {
        job: JobSendStats(
            bytes_sent_by_path=sent.get(job, {}),
            datagrams_sent_by_path=datagrams.get(job, {}),
            **counts.get(job, {}),
        )
        for job in sent.keys() | counts.keys()
    }
