"""Loss: 64 MiB over one lossy path (random loss, bursts) and over three paths, one lossy.

    python -m bench suite loss           # needs root

Each scenario runs through the runner (``python -m bench run``) with TCP baselines;
``loss_01``, ``loss_1`` and ``loss_3paths`` run a second time without baselines into
``results/loss_repeat/``. The table reads the records on disk: wangate's goodput as a
share of the link rate against its aim, against each baseline, the FEC overhead, the
emulator's drop counters and the gateways' CPU.
"""

from __future__ import annotations

from bench.suite.common import fec_overhead, fmt, load_record, met

SINGLE_PATH = ("loss_01", "loss_1", "loss_5", "loss_burst")
MULTI_PATH = ("loss_3paths",)
REPEATED = ("loss_01", "loss_1", "loss_3paths")
REPEAT_DIR = "loss_repeat"
# 128 MiB against TCP BBR, with the loss budget in each record (bench.loss_long compares
# two gateways alternately and tabulates them)
LONG = ("loss_long_01", "loss_long_1", "loss_long_2", "loss_long_5", "loss_long_burst",
        "loss_long_3paths")  # fmt: skip
AIMS = {  # wangate goodput / link rate
    "loss_01": 0.85,
    "loss_1": 0.75,
    "loss_5": 0.50,
    "loss_burst": 0.65,
    "loss_3paths": 0.80,
}


def rows() -> list[str]:
    """The table of the last runs on disk."""
    lines = ["| scenario | metric | measured | aim | met? |", "|---|---|---|---|---|"]
    for name in (*SINGLE_PATH, *MULTI_PATH):
        record = load_record(name)
        if record is None:
            lines.append(f"| {name} | not run | | | |")
            continue
        wg = record["wangate"]
        total = record["total_bytes"]
        rate = sum(p["nominal"]["rate_mbps"] for d in record["paths"].values() for p in d.values())
        if wg["complete"]:
            goodput = total * 8 / wg["time_s"] / 1e6
            done = f"{wg['time_s']:.2f} s"
        else:
            goodput = wg["delivered_bytes"] * 8 / wg["timeout_s"] / 1e6
            done = (
                f"not done: {wg['delivered_bytes'] / 2**20:.0f} of {total / 2**20:.0f} MiB "
                f"in {wg['timeout_s']:.0f} s"
            )
        aim = AIMS[name]
        ratio = goodput / rate
        lines.append(
            f"| {name} | wangate goodput / link rate ({rate:g} Mbit/s) | "
            f"{goodput:.1f} Mbit/s = **{ratio:.3f}** ({done}; intact "
            f"{wg['intact']}/{wg['messages']}) | >= {aim:.2f} | "
            f"{met(wg['complete'] and ratio >= aim)} |"
        )
        repeat = load_record(f"{REPEAT_DIR}/{name}")
        if repeat is not None and repeat["wangate"]["complete"]:
            again = total * 8 / repeat["wangate"]["time_s"] / 1e6
            lines.append(
                f"| {name} | the same, second run (results/{REPEAT_DIR}/{name}, no "
                f"baselines) | {again:.1f} Mbit/s = **{again / rate:.3f}**; FEC "
                f"overhead {fmt(fec_overhead(repeat)['overhead'], '.3f')} | >= {aim:.2f} | "
                f"{met(again / rate >= aim)} |"
            )
        for base in (record.get("baselines") or {}).get("baselines", []):
            timeout = record["baselines"]["timeout_s"]
            if base["time_s"] is not None:
                b_goodput = total * 8 / base["time_s"] / 1e6
                b_note = f"{base['time_s']:.2f} s, {b_goodput:.1f} Mbit/s"
                rel = f"{goodput / b_goodput:.2f}"
            else:
                b_goodput = base["delivered_bytes"] * 8 / timeout / 1e6
                b_note = (
                    f"capped at {timeout:.0f} s: {base['delivered_bytes'] / 2**20:.0f} of "
                    f"{total / 2**20:.0f} MiB done, <= {b_goodput:.1f} Mbit/s"
                )
                rel = f">= {goodput / b_goodput:.1f}" if b_goodput else "inf (0 bytes done)"
            lines.append(f"| {name} | wangate / {base['name']} goodput | {rel} ({b_note}) | | |")
        fec = fec_overhead(record)
        lines.append(
            f"| {name} | FEC overhead (fec+repair)/source | "
            f"{fmt(fec['overhead'], '.3f')} (fec {fec['fec_bytes'] / 1e6:.1f} MB, "
            f"repair {fec['repair_bytes'] / 1e6:.2f} MB, "
            f"source {fec['source_bytes'] / 1e6:.1f} MB, "
            f"{fec['fec_repair_per_block']} repair/block at the end, "
            f"{fec['blocks_decoded']} blocks decoded) | | |"
        )
        links = record["link_stats"]["wangate_run"]
        drops = {
            k: sum(p["a_to_b"][k] for p in links.values())
            for k in ("pushed_packets", "dropped_queue", "dropped_loss", "dropped_burst")
        }
        cpu = record["wangate"].get("gateway_cpu", {})
        lines.append(
            f"| {name} | emulator bj->sh: packets, queue drops, random/burst loss drops; "
            f"gateway CPU | {drops['pushed_packets']}, {drops['dropped_queue']}, "
            f"{drops['dropped_loss']}/{drops['dropped_burst']}; "
            + ", ".join(f"{s} {c['cpu_s']:.1f} s ({c['core_share']:.0%})" for s, c in cpu.items())
            + " | | |"
        )
    return lines
