"""What the subjects share: where results live, reading the runner's records, the
counters of a lab run, and the number formats of the tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def sent_bytes(gw: Any, peer: str) -> dict[str, int]:
    return {r["path"]: int(r["sent_bytes"] or 0) for r in gw.paths() if r["peer"] == peer}


def link_bytes(lab: Any, direction: str = "a_to_b") -> dict[str, int]:
    return {name: int(s[direction]["delivered_bytes"]) for name, s in lab.link_stats().items()}


def pushed_bytes(lab: Any, direction: str = "a_to_b") -> dict[str, int]:
    return {name: int(s[direction]["pushed_bytes"]) for name, s in lab.link_stats().items()}


def load_record(name: str) -> dict[str, Any] | None:
    file = RESULTS / name / "run.json"
    return json.loads(file.read_text()) if file.exists() else None


def fec_overhead(record: dict[str, Any], src: str = "bj", dst: str = "sh") -> dict[str, Any]:
    status = record.get("gateway_status") or record["wangate"].get("gateway_status", {})
    peer = status.get(src, {}).get("peers", {}).get(dst, {})
    rx = status.get(dst, {}).get("peers", {}).get(src, {})
    source = peer.get("source_bytes") or 0
    fec, repair = peer.get("fec_bytes") or 0, peer.get("repair_bytes") or 0
    return {
        "source_bytes": source,
        "fec_bytes": fec,
        "repair_bytes": repair,
        "overhead": (fec + repair) / source if source else None,
        "fec_repair_per_block": peer.get("fec_repair_per_block"),
        "blocks_decoded": rx.get("blocks_decoded"),
    }


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def fmt(value: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def met(ok: bool | None) -> str:
    return "?" if ok is None else ("yes" if ok else "**no**")
