"""``wangate jobs``: who uses the gateway's links, one row per job.

Built from two ``status`` reads ``interval_s`` apart (the rates are their difference)
and the ``paths`` rows of the second (each job's share of each path: its bytes on that
path over every job's). Pure: the CLI does the reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _peer_sum(job: Mapping[str, Any], key: str) -> int:
    return sum(int(peer.get(key, 0)) for peer in job.get("peers", {}).values())


def job_rows(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    interval_s: float,
) -> list[dict[str, Any]]:
    """One map per job (``wangate jobs --json``), in the order the gateway lists them."""
    path_totals: dict[str, int] = {}
    for row in rows:
        name = f"{row['peer']}/{row['path']}"
        path_totals[name] = sum(int(j["bytes_sent"]) for j in row.get("jobs", {}).values())
    earlier = before.get("jobs", {})
    out = []
    for name, job in after.get("jobs", {}).items():
        then = earlier.get(name, {})
        sent = _peer_sum(job, "bytes_sent")
        received = _peer_sum(job, "bytes_received")
        rate_s = 8 / 1e6 / interval_s if interval_s > 0 else 0.0
        share = {}
        for row in rows:
            path = f"{row['peer']}/{row['path']}"
            mine = int(row.get("jobs", {}).get(name, {}).get("bytes_sent", 0))
            share[path] = round(mine / path_totals[path], 4) if path_totals[path] else 0.0
        out.append(
            {
                "job": name,
                "weight": job.get("weight"),
                "paths": job.get("paths"),
                "bytes_sent": sent,
                "bytes_received": received,
                "send_mbps": round((sent - _peer_sum(then, "bytes_sent")) * rate_s, 3),
                "recv_mbps": round((received - _peer_sum(then, "bytes_received")) * rate_s, 3),
                "path_share": share,
                "messages_in_flight": _peer_sum(job, "messages_in_flight"),
                "waiting_messages": _peer_sum(job, "waiting_messages"),
                "waiting_bytes": _peer_sum(job, "waiting_bytes"),
                "held_bytes": _peer_sum(job, "held_bytes"),
                "inbox_queued": int(job.get("inbox_queued", 0)),
                "recent_failures": list(job.get("recent_failures", [])),
            }
        )
    return out


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_jobs_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    header = (
        "JOB", "WEIGHT", "SENT", "RECEIVED", "SEND Mbit/s", "RECV Mbit/s",
        "IN FLIGHT", "WAITING", "HELD", "INBOX", "FAILURES", "PATH SHARE",
    )  # fmt: skip
    table = [header]
    for job in jobs:
        shares = ", ".join(
            f"{path} {100 * share:.0f}%" for path, share in job["path_share"].items() if share
        )
        table.append(
            (
                job["job"],
                f"{job['weight']:g}" if job["weight"] is not None else "-",
                _bytes(job["bytes_sent"]),
                _bytes(job["bytes_received"]),
                f"{job['send_mbps']:.1f}",
                f"{job['recv_mbps']:.1f}",
                str(job["messages_in_flight"]),
                f"{job['waiting_messages']} ({_bytes(job['waiting_bytes'])})",
                _bytes(job["held_bytes"]),
                str(job["inbox_queued"]),
                str(len(job["recent_failures"])),
                shares or "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in table]
    for job in jobs:
        for failure in job["recent_failures"][-3:]:
            lines.append(f"{job['job']}: {failure}")
    return "\n".join(line.rstrip() for line in lines)
