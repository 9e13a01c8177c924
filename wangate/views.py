"""Text views of a gateway's rows: the ``wangate paths`` table and ``wangate status``.

Used by the CLI and the demo alike (``wangate.rows`` defines what they show).
"""

from __future__ import annotations

from collections.abc import Sequence

from wangate.rows import GatewayStatus, PathRow

PATHS_HEADERS = (
    "PEER", "PATH", "LOCAL -> REMOTE", "STATE", "SRTT/MIN ms", "JITTER ms",
    "LOSS (n)", "RATE Mb/s", "SENT", "RECV", "ROLE", "SWITCHED", "NOTE",
)  # fmt: skip


def fmt_num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def fmt_bytes(value: float) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _switched(row: PathRow) -> str:
    """When the critical route last moved (shown on the path that holds it)."""
    ago = row.last_switch_s
    if row.role != "critical" or ago is None:
        return "-"
    return f"{ago:.0f}s ago" if ago >= 1 else f"{ago * 1000:.0f}ms ago"


def paths_table_cells(row: PathRow) -> list[str]:
    loss = "-" if row.loss is None else f"{row.loss * 100:.2f}% ({row.loss_samples})"
    return [
        row.peer,
        row.path if row.worker is None else f"{row.path}/w{row.worker}",  # one per worker
        f"{row.local} -> {row.remote}",
        row.state,
        f"{fmt_num(row.srtt_ms, '.2f')}/{fmt_num(row.min_rtt_ms, '.2f')}",
        fmt_num(row.jitter_ms, ".2f"),
        loss,
        fmt_num(row.rate_mbps, ".1f"),
        fmt_bytes(row.sent_bytes),
        fmt_bytes(row.recv_bytes),
        row.role,
        _switched(row),
        row.state_reason if row.state != "up" else "",
    ]


def format_paths_table(rows: Sequence[PathRow]) -> str:
    table = [list(PATHS_HEADERS), *(paths_table_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(PATHS_HEADERS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    )


def format_status(status: GatewayStatus) -> str:
    lines = [f"site {status.site}  version {status.version}  up {status.uptime_s:.0f} s"]
    for name, peer in status.peers.items():
        up = ", ".join(peer.paths_up) or "none"
        lines.append(
            f"  peer {name}: {peer.state} ({peer.state_reason}); "
            f"paths up: {up}; sent {peer.counter('messages_sent')} messages "
            f"({fmt_bytes(peer.counter('bytes_sent'))}), received "
            f"{peer.counter('messages_received')} "
            f"({fmt_bytes(peer.counter('bytes_received'))})"
        )
        for failure in peer.recent_failures:
            lines.append(
                f"    failed: message {failure['msg_id']} (tag {failure['tag']!r}, "
                f"step {failure['step']}): {failure['reason']}"
            )
    segments = status.segments
    if segments:
        lines.append(
            f"  inbound segments: made {segments['made']}, reused {segments['reused']}; "
            f"lent {segments['lent']}, pooled {segments['pooled']} "
            f"({fmt_bytes(segments['pooled_bytes'])})"
        )
    for worker in status.workers:
        lines.append(
            f"  worker {worker['index']} ({worker['role']}, pid {worker['pid']}): "
            f"{float(worker['cpu_s']):.1f} CPU s, {fmt_bytes(worker['queued_bytes'])} queued, "
            f"{worker['restarts']} restarts"
        )
    return "\n".join(lines)
