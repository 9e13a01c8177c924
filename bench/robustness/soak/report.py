"""The soak's table: one column per run, a row per count (markdown)."""

from __future__ import annotations

from typing import Any

from bench.common import met
from bench.robustness.soak.checker import rss_flat
from bench.robustness.soak.schedule import KINDS


def _faults(record: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for fault in record["faults"]:
        if not fault.get("error"):
            counts[fault["kind"]] = counts.get(fault["kind"], 0) + 1
    return ", ".join(f"{k} {counts[k]}" for k in KINDS if k in counts) or "none"


def _rss(record: dict[str, Any], site: str) -> str:
    value = record["rss"].get(site)
    if value is None:
        return "-"
    text = f"{value['start_mib']:.1f} -> {value['end_mib']:.1f}"
    if value["restarted"]:
        text += f" (restarted {value['restarted']}x)"
    return text if rss_flat(value["start_mib"], value["end_mib"]) else f"**{text}**"


def column_name(record: dict[str, Any]) -> str:
    opts = record["options"]
    workers = f", {opts['workers']} workers" if opts["workers"] > 1 else ""
    return f"{record['tree']}, seed {opts['seed']}{workers}"


def table(records: list[dict[str, Any]]) -> str:
    verdicts = [r["verdict"] for r in records]
    reasons = sorted({k for v in verdicts for k in v["failed_by_reason"]})
    taken_failed = sorted({k for v in verdicts for k in v["taken_failed_by_reason"]})
    sites = sorted({s for r in records for s in r["rss"]}, key=["bj", "sh", "sg"].index)
    rows: list[tuple[str, list[str]]] = [
        ("faults injected", [_faults(r) for r in records]),
        ("messages sent (accepted)", [f"{v['sent']} ({v['accepted']})" for v in verdicts]),
        (
            "taken intact, exactly once",
            [f"{v['taken_intact']} ({v['bytes_taken'] / (1 << 20):.0f} MiB)" for v in verdicts],
        ),
        ("- confirmed to the sender", [str(v["classes"]["intact"]) for v in verdicts]),
        (
            "- the sender's gateway lost first",
            [str(v["classes"]["intact_sender_lost"]) for v in verdicts],
        ),
    ]
    for reason in taken_failed:
        rows.append(
            (
                f"- reported failed: {reason}",
                [str(v["taken_failed_by_reason"].get(reason, 0)) for v in verdicts],
            )
        )
    rows.append(
        ("failed at the sender, with a reason", [str(v["classes"]["failed"]) for v in verdicts])
    )
    for reason in reasons:
        rows.append((f"- {reason}", [str(v["failed_by_reason"].get(reason, 0)) for v in verdicts]))
    bad = [
        ("duplicates", ("duplicate",)),
        ("corrupt", ("corrupt",)),
        ("lost, unaccounted for", ("unaccounted", "phantom")),
        ("taken and reported failed otherwise", ("taken_and_failed",)),
    ]
    for label, classes in bad:
        rows.append((label, [_bad(sum(v["classes"][c] for c in classes)) for v in verdicts]))
    recv_errors = [sum(r.get("recv_errors", {}).values()) for r in records]
    if any(recv_errors):
        rows.append(("receive errors (not timeouts)", [str(n) for n in recv_errors]))
    for site in sites:
        rows.append((f"RSS {site} after warm-up -> end, MiB", [_rss(r, site) for r in records]))
    rows.append(("invariants hold", [met(r["ok"]) for r in records]))
    head = "| | " + " | ".join(column_name(r) for r in records) + " |\n"
    head += "|---" * (len(records) + 1) + "|\n"
    return head + "\n".join(f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows)


def _bad(count: int) -> str:
    return str(count) if count == 0 else f"**{count}**"


def violations_text(record: dict[str, Any], limit: int = 20) -> str:
    lines = []
    for v in record["violations"][:limit]:
        where = f"{v.get('flow', v.get('site', ''))} step {v['step']}" if "step" in v else ""
        lines.append(f"- {v['class']} {where}: {_short(v)}")
    if len(record["violations"]) > limit:
        lines.append(f"- ... {len(record['violations']) - limit} more (run.json)")
    return "\n".join(lines)


def _short(v: dict[str, Any]) -> str:
    keys = ("size", "msg_id", "outcome", "reason", "detail", "start_mib", "end_mib")
    text = ", ".join(f"{k}={v[k]}" for k in keys if v.get(k) not in (None, ""))
    takes = v.get("takes")
    if takes:
        text += f", takes={[(t['intact'], t['detail']) for t in takes]}"
    return text
