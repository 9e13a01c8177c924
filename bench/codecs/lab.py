"""Codecs in the lab: one 64 MiB Student-t float32 gradient per codec over three paths.

    python -m bench suite codecs         # the links of multipath_clean3; needs root

For each codec the bytes the paths sent (gateway ``sent_bytes`` deltas and the
emulator's IP bytes) and the time from ``send`` to the receiver's ``recv`` returning.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from bench.common import (
    RESULTS,
    link_bytes,
    load_record,
    pushed_bytes,
    sent_bytes,
)
from bench.runner.gateways import start_gateways, stop_gateways

SCENARIO = "multipath_clean3"  # only its links: the gradients are the workload
RESULT_NAME = "codecs_lab"
GRADIENT_SEED = 31  # the gradient of the RESULTS.md table (error columns match it exactly)
CODECS = ("none", "fp16", "bf16", "int8", "int4", "topk:0.01", "split:0.01/int8", "int8+zstd")
CODEC_REPEATS = 2  # each codec's gradient is sent this many times (rounds of all codecs)


def send_codec(
    lab: Any, tx: Any, rx: Any, gradient: np.ndarray, tag: str, step: int, codec: str
) -> dict[str, Any]:
    """One gradient with one codec: bytes the paths sent and the time to the receiver."""
    sent_before, link_before = sent_bytes(tx, "sh"), link_bytes(lab)
    pushed_before = pushed_bytes(lab)
    called = time.monotonic()
    tx.send("sh", tag, gradient, step=step, codec=codec)
    accepted = time.monotonic()
    decoded = rx.recv(tag, source="bj", step=step, timeout=120)
    delivered = time.monotonic()
    time.sleep(0.5)  # late acks and repair for this message settle
    sent_after, link_after = sent_bytes(tx, "sh"), link_bytes(lab)
    pushed_after = pushed_bytes(lab)
    error = float(np.max(np.abs(decoded.astype(np.float32) - gradient)) / np.max(np.abs(gradient)))
    return {
        "codec": codec,
        "step": step,
        "input_bytes": gradient.nbytes,
        "gateway_sent_bytes": sum(sent_after[p] - sent_before.get(p, 0) for p in sent_after),
        "per_path_sent_bytes": {p: sent_after[p] - sent_before.get(p, 0) for p in sent_after},
        "link_ip_bytes_pushed": sum(pushed_after[p] - pushed_before[p] for p in pushed_after),
        "link_ip_bytes_delivered": sum(link_after[p] - link_before[p] for p in link_after),
        "send_call_s": accepted - called,
        "time_s": delivered - called,
        "max_abs_err_over_max_abs": error,
    }


def run() -> dict[str, Any]:
    import wangate
    from wangate.lab.lab import Lab
    from wangate.lab.scenario import load_scenario

    scenario = load_scenario(SCENARIO)
    out = RESULTS / RESULT_NAME
    rng = np.random.default_rng(GRADIENT_SEED)
    gradient = (rng.standard_t(3, size=(4096, 4096)) * 1e-3).astype(np.float32)  # 64 MiB
    rows: list[dict[str, Any]] = []
    with Lab(scenario) as lab:
        gateways, _ = start_gateways(lab, lab.write_gateway_configs(), out / "logs")
        with (
            wangate.Client(lab.gateway_socket("bj")) as tx,
            wangate.Client(lab.gateway_socket("sh")) as rx,
        ):
            # one warm-up message so every path's controller has left start-up
            tx.send("sh", "warmup", gradient[:512], step=0, codec="none")
            rx.recv("warmup", source="bj", step=0, timeout=30)
            time.sleep(0.5)
            for repeat in range(CODEC_REPEATS):
                for number, codec in enumerate(CODECS):
                    rows.append(
                        send_codec(lab, tx, rx, gradient, f"grad.{number}", repeat + 1, codec)
                    )
                    print(
                        f"  {codec:16s} {rows[-1]['gateway_sent_bytes'] / 1e6:8.2f} MB "
                        f"{rows[-1]['time_s']:6.2f} s",
                        flush=True,
                    )
            status = {"bj": tx.status(), "sh": rx.status()}
        stop_gateways(gateways)
    record = {
        "scenario": SCENARIO,
        "rows": rows,
        "gateway_status": status,
        "repeats": CODEC_REPEATS,
        "input": f"4096x4096 float32, Student-t(3) x 1e-3, seed {GRADIENT_SEED}",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(record, indent=1))
    return record


def rows(codecs: dict[str, Any] | None = None) -> list[str]:
    """The table of ``codecs`` (a run's record), or of the last run on disk."""
    codecs = codecs or load_record(RESULT_NAME)
    if codecs is None:
        return [f"{RESULT_NAME} not run"]
    lines = [
        "| codec | gateway sent bytes (sum of path sent_bytes deltas; each send) | "
        "least ratio to 64 MiB | emulator IP bytes bj->sh (least) | time send->recv (each "
        "send) | send() call (most) | Mbit/s of input (median time) | "
        "max abs err / max abs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_codec: dict[str, list[dict[str, Any]]] = {}
    for row in codecs["rows"]:
        by_codec.setdefault(row["codec"], []).append(row)
    for codec, rows in by_codec.items():
        row = rows[0]
        times = sorted(r["time_s"] for r in rows)
        median = times[len(times) // 2] if len(times) % 2 else sum(times) / len(times)
        sent = sorted(r["gateway_sent_bytes"] for r in rows)
        lines.append(
            f"| {codec} | {' / '.join(f'{b / 1e6:.2f}' for b in sent)} MB | "
            f"{sent[0] / row['input_bytes']:.4f} | "
            f"{min(r['link_ip_bytes_pushed'] for r in rows) / 1e6:.2f} MB | "
            f"{' / '.join(f'{t:.2f}' for t in times)} s | "
            f"{max(r['send_call_s'] for r in rows):.2f} s | "
            f"{row['input_bytes'] * 8 / median / 1e6:.0f} | "
            f"{row['max_abs_err_over_max_abs']:.2e} |"
        )
    return lines
