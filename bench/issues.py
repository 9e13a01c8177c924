"""Benchmarks for issues 4 (loss), 5 (path intelligence) and 6 (codecs) in the WAN lab.

    python -m bench.issues 4|5|6|all [--report-only]

Scenario runs go through the runner (``python -m bench run ...``, one at a time) and
their metrics are read back from ``results/<scenario>/run.json``. Measurements the
runner cannot make are driven here with the Lab API (and issue 5's lab floor by
``bench.critical_floor``):

- ``i4_fair``: one TCP cubic flow and a wangate bulk transfer share one clean path for
  30 s; each flow's goodput over the same window;
- ``i6_codecs``: one 64 MiB Student-t float32 gradient per codec over three paths; the
  bytes the paths sent (gateway ``sent_bytes`` deltas and the emulator's IP bytes) and
  the time from ``send`` to the receiver's ``recv`` returning.

Issue 4 also repeats i4_loss01, i4_loss1 and i4_three without baselines into
``results/i4_repeat/``. ``--report-only`` skips every run and prints the tables from the
results on disk. Tables go to stdout and to ``results/issue<N>.md``.

Workers started inside the namespaces (``python -m bench.issues worker tcp-sink|tcp-source
JSON``) are part of this module.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
PAYLOAD_CHUNK = 256 * 1024
COOLDOWN_S = 2.0  # the critical selector's cooldown after a switch (README)

ISSUE4_RUNS = ("i4_loss01", "i4_loss1", "i4_loss5", "i4_burst1")
ISSUE4_MULTI = ("i4_three",)
ISSUE5_RUNS = ("i5_critical", "i5_degrade", "i5_jitter", "i5_blackhole", "i5_nobulk")
CODECS = ("none", "fp16", "bf16", "int8", "int4", "topk:0.01", "split:0.01/int8", "int8+zstd")
LOSS_AIMS = {
    "i4_loss01": 0.85,
    "i4_loss1": 0.75,
    "i4_loss5": 0.50,
    "i4_burst1": 0.65,
    "i4_three": 0.80,
}
CODEC_REPEATS = 2  # each codec's gradient is sent this many times (rounds of all codecs)
FAIR_DURATION_S = 30.0
FAIR_WINDOW_S = (5.0, 30.0)  # both flows measured over the same span, start-up excluded


# -- workers inside the namespaces ---------------------------------------------------------
def _tcp_sink(spec: dict[str, Any]) -> dict[str, Any]:
    """Accept one connection and count its bytes; samples ``[monotonic_s, total_bytes]``."""
    host, port = spec["bind"]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(json.dumps({"ready": True}), flush=True)
    conn, _ = listener.accept()
    conn.settimeout(0.2)
    total, samples, next_sample = 0, [[time.monotonic(), 0]], time.monotonic() + 0.25
    while not stop.is_set():
        try:
            data = conn.recv(PAYLOAD_CHUNK)
        except TimeoutError:
            data = None  # nothing this time; check the stop flag
        if data == b"":
            break
        if data:
            total += len(data)
        now = time.monotonic()
        if now >= next_sample:
            samples.append([now, total])
            next_sample = now + 0.25
    samples.append([time.monotonic(), total])
    return {"samples": samples, "total_bytes": total}


def _tcp_source(spec: dict[str, Any]) -> dict[str, Any]:
    """Send zeros with congestion control ``cc`` for ``duration_s``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, spec["cc"].encode())
    sock.bind((spec["bind"], 0))
    sock.connect(tuple(spec["to"]))
    zeros = memoryview(bytes(PAYLOAD_CHUNK))
    started = time.monotonic()
    sent = 0
    sock.settimeout(0.2)
    while time.monotonic() - started < spec["duration_s"]:
        try:
            sent += sock.send(zeros)
        except TimeoutError:
            continue
    sock.close()
    used = spec["cc"]
    return {"started": started, "sent_bytes": sent, "cc": used}


def worker_main(kind: str, spec_json: str) -> int:
    spec = json.loads(spec_json)
    result = _tcp_sink(spec) if kind == "tcp-sink" else _tcp_source(spec)
    print(json.dumps(result), flush=True)
    return 0


# -- lab helpers ---------------------------------------------------------------------------
class _Gateways:
    """The sites' gateways in a lab, started the way the runner starts them."""

    def __init__(self, lab: Any, logs_dir: Path) -> None:
        import wangate
        from wangate.errors import WangateError

        self.lab = lab
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        logs_dir.mkdir(parents=True, exist_ok=True)
        self.logs = {}
        for site, config in lab.write_gateway_configs().items():
            self.logs[site] = logs_dir / f"gateway-{site}.log"
            with self.logs[site].open("wb") as log:
                self.processes[site] = lab.run_in(
                    site,
                    [sys.executable, "-m", "wangate", "run", "-c", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ, PYTHONUNBUFFERED="1"),
                )
        deadline = time.monotonic() + 20.0
        for site in self.processes:
            expected = len(lab.site_addresses(site))
            while True:
                try:
                    with wangate.Client(lab.gateway_socket(site)) as gw:
                        if sum(1 for r in gw.paths() if r["state"] != "down") == expected:
                            break
                except (WangateError, OSError):
                    pass
                if time.monotonic() > deadline or self.processes[site].poll() is not None:
                    raise RuntimeError(f"gateway {site}: paths not up; see {self.logs[site]}")
                time.sleep(0.1)

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _sent_bytes(gw: Any, peer: str) -> dict[str, int]:
    return {r["path"]: int(r["sent_bytes"] or 0) for r in gw.paths() if r["peer"] == peer}


def _link_bytes(lab: Any, direction: str = "a_to_b") -> dict[str, int]:
    return {name: int(s[direction]["delivered_bytes"]) for name, s in lab.link_stats().items()}


def _pushed_bytes(lab: Any, direction: str = "a_to_b") -> dict[str, int]:
    return {name: int(s[direction]["pushed_bytes"]) for name, s in lab.link_stats().items()}


# -- issue 4: a TCP cubic flow beside wangate ----------------------------------------------
def run_fair() -> dict[str, Any]:
    import wangate
    from bench.lab.lab import Lab
    from bench.lab.scenario import load_scenario

    scenario = load_scenario("i4_fair")
    path = scenario.paths[0]
    out = RESULTS / "i4_fair"
    rng = np.random.default_rng(scenario.seed)
    chunk = rng.integers(0, 256, 1 << 20, dtype=np.uint8)  # 1 MiB, incompressible
    wg_done: list[tuple[float, int]] = []
    errors: list[str] = []
    with Lab(scenario) as lab:
        gateways = _Gateways(lab, out / "logs")
        sink = lab.run_in(
            "sh",
            [
                sys.executable,
                "-m",
                "bench.issues",
                "worker",
                "tcp-sink",
                json.dumps({"bind": [path.address_of("sh"), 9300]}),
            ],
            stdout=subprocess.PIPE,
        )
        assert sink.stdout is not None
        sink.stdout.readline()
        stop_at = [0.0]
        max_ahead = 32  # messages handed over, not yet received: ~5 s at 50 Mbit/s, never idle

        def wangate_receiver() -> None:
            try:
                with wangate.Client(lab.gateway_socket("sh")) as gw:
                    while True:
                        left = stop_at[0] + 5.0 - time.monotonic()
                        if left <= 0:
                            return
                        try:  # any step: whichever message is complete first
                            array = gw.recv("fair", source="bj", timeout=left)
                        except wangate.WangateError:
                            return
                        wg_done.append((time.monotonic(), int(array.nbytes)))
            except Exception as exc:
                errors.append(f"receiver: {exc!r}")

        def wangate_sender() -> None:
            try:
                with wangate.Client(lab.gateway_socket("bj")) as gw:
                    step = 0
                    while time.monotonic() < stop_at[0]:
                        if step - len(wg_done) >= max_ahead:
                            time.sleep(0.005)
                            continue
                        gw.send("sh", "fair", chunk, step=step)
                        step += 1
            except Exception as exc:
                errors.append(f"sender: {exc!r}")

        t0 = lab.start_timeline()
        stop_at[0] = t0 + FAIR_DURATION_S
        source = lab.run_in(
            "bj",
            [
                sys.executable,
                "-m",
                "bench.issues",
                "worker",
                "tcp-source",
                json.dumps(
                    {
                        "bind": path.address_of("bj"),
                        "to": [path.address_of("sh"), 9300],
                        "cc": "cubic",
                        "duration_s": FAIR_DURATION_S,
                    }
                ),
            ],
            stdout=subprocess.PIPE,
        )
        threads = [
            threading.Thread(target=wangate_receiver),
            threading.Thread(target=wangate_sender),
        ]
        for thread in threads:
            thread.start()
        sent = json.loads(source.communicate(timeout=FAIR_DURATION_S + 30)[0] or b"{}")
        sink.send_signal(signal.SIGTERM)
        got = json.loads(sink.communicate(timeout=10)[0] or b"{}")
        for thread in threads:
            thread.join(timeout=30)
        link = lab.link_stats()
        status = {}
        for site in ("bj", "sh"):
            with wangate.Client(lab.gateway_socket(site)) as gw:
                status[site] = gw.status()
        gateways.stop()
    start, end = t0 + FAIR_WINDOW_S[0], t0 + FAIR_WINDOW_S[1]
    tcp_bytes = _bytes_in(got.get("samples", []), start, end)
    wg_cumulative, total = [], 0
    for t, n in wg_done:
        total += n
        wg_cumulative.append([t, total])
    wg_bytes = _bytes_in([[t0, 0], *wg_cumulative], start, end)
    span = end - start
    record = {
        "scenario": "i4_fair",
        "window_s": list(FAIR_WINDOW_S),
        "link_rate_mbps": path.a_to_b.rate_mbps,
        "tcp": {
            "cc": sent.get("cc"),
            "goodput_mbps": tcp_bytes * 8 / span / 1e6,
            "total_bytes": got.get("total_bytes"),
        },
        "wangate": {"goodput_mbps": wg_bytes * 8 / span / 1e6, "messages": len(wg_done)},
        "errors": errors,
        "link_stats": link,
        "gateway_status": status,
        "per_second_mbps": {
            "tcp": [
                _bytes_in(got.get("samples", []), t0 + k, t0 + k + 1) * 8 / 1e6
                for k in range(int(FAIR_DURATION_S))
            ],
            "wangate": [
                _bytes_in([[t0, 0], *wg_cumulative], t0 + k, t0 + k + 1) * 8 / 1e6
                for k in range(int(FAIR_DURATION_S))
            ],
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(record, indent=1))
    return record


def _bytes_in(samples: list[list[float]], start: float, end: float) -> float:
    """Bytes of a cumulative counter ``[[t, total], ...]`` inside ``[start, end]`` (linear)."""

    def at(t: float) -> float:
        if not samples or t <= samples[0][0]:
            return float(samples[0][1]) if samples else 0.0
        for (t_a, c_a), (t_b, c_b) in itertools.pairwise(samples):
            if t_a <= t <= t_b:
                return c_a + (c_b - c_a) * ((t - t_a) / (t_b - t_a) if t_b > t_a else 1.0)
        return float(samples[-1][1])

    return at(end) - at(start)


# -- issue 6: codecs -----------------------------------------------------------------------
def _send_codec(
    lab: Any, tx: Any, rx: Any, gradient: np.ndarray, tag: str, step: int, codec: str
) -> dict[str, Any]:
    """One gradient with one codec: bytes the paths sent and the time to the receiver."""
    sent_before, link_before = _sent_bytes(tx, "sh"), _link_bytes(lab)
    pushed_before = _pushed_bytes(lab)
    called = time.monotonic()
    tx.send("sh", tag, gradient, step=step, codec=codec)
    accepted = time.monotonic()
    decoded = rx.recv(tag, source="bj", step=step, timeout=120)
    delivered = time.monotonic()
    time.sleep(0.5)  # late acks and repair for this message settle
    sent_after, link_after = _sent_bytes(tx, "sh"), _link_bytes(lab)
    pushed_after = _pushed_bytes(lab)
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


def run_codecs() -> dict[str, Any]:
    import wangate
    from bench.lab.lab import Lab
    from bench.lab.scenario import load_scenario

    scenario = load_scenario("i6_codecs")
    out = RESULTS / "i6_codecs"
    rng = np.random.default_rng(scenario.seed)
    gradient = (rng.standard_t(3, size=(4096, 4096)) * 1e-3).astype(np.float32)  # 64 MiB
    rows: list[dict[str, Any]] = []
    with Lab(scenario) as lab:
        gateways = _Gateways(lab, out / "logs")
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
                        _send_codec(lab, tx, rx, gradient, f"grad.{number}", repeat + 1, codec)
                    )
                    print(
                        f"  {codec:16s} {rows[-1]['gateway_sent_bytes'] / 1e6:8.2f} MB "
                        f"{rows[-1]['time_s']:6.2f} s",
                        flush=True,
                    )
            status = {"bj": tx.status(), "sh": rx.status()}
        gateways.stop()
    record = {
        "scenario": "i6_codecs",
        "rows": rows,
        "gateway_status": status,
        "repeats": CODEC_REPEATS,
        "input": "4096x4096 float32, Student-t(3) x 1e-3, seed 31",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(record, indent=1))
    return record


# -- reading the runner's results ----------------------------------------------------------
def _load(name: str) -> dict[str, Any] | None:
    file = RESULTS / name / "run.json"
    return json.loads(file.read_text()) if file.exists() else None


def _fec(record: dict[str, Any], src: str = "bj", dst: str = "sh") -> dict[str, Any]:
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


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _fmt(value: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def _met(ok: bool | None) -> str:
    return "?" if ok is None else ("yes" if ok else "**no**")


def issue4_rows(fair: dict[str, Any] | None) -> list[str]:
    lines = ["| scenario | metric | measured | aim | met? |", "|---|---|---|---|---|"]
    for name in (*ISSUE4_RUNS, *ISSUE4_MULTI):
        record = _load(name)
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
        aim = LOSS_AIMS[name]
        ratio = goodput / rate
        lines.append(
            f"| {name} | wangate goodput / link rate ({rate:g} Mbit/s) | "
            f"{goodput:.1f} Mbit/s = **{ratio:.3f}** ({done}; intact "
            f"{wg['intact']}/{wg['messages']}) | >= {aim:.2f} | "
            f"{_met(wg['complete'] and ratio >= aim)} |"
        )
        repeat = _load(f"i4_repeat/{name}")
        if repeat is not None and repeat["wangate"]["complete"]:
            again = total * 8 / repeat["wangate"]["time_s"] / 1e6
            lines.append(
                f"| {name} | the same, second run (results/i4_repeat/{name}, no "
                f"baselines) | {again:.1f} Mbit/s = **{again / rate:.3f}**; FEC "
                f"overhead {_fmt(_fec(repeat)['overhead'], '.3f')} | >= {aim:.2f} | "
                f"{_met(again / rate >= aim)} |"
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
        fec = _fec(record)
        lines.append(
            f"| {name} | FEC overhead (fec+repair)/source | "
            f"{_fmt(fec['overhead'], '.3f')} (fec {fec['fec_bytes'] / 1e6:.1f} MB, "
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
    if fair is None:
        lines.append("| i4_fair | not run | | | |")
    else:
        rate = fair["link_rate_mbps"]
        tcp, wg = fair["tcp"]["goodput_mbps"], fair["wangate"]["goodput_mbps"]
        lines.append(
            f"| i4_fair | TCP cubic share of the link beside wangate "
            f"(t={fair['window_s'][0]:g}..{fair['window_s'][1]:g} s) | {tcp:.1f} Mbit/s = "
            f"**{tcp / rate:.2f}**; wangate {wg:.1f} Mbit/s = {wg / rate:.2f}; sum "
            f"{(tcp + wg) / rate:.2f} | >= 0.33 | {_met(tcp / rate >= 1 / 3)} |"
        )
        tcp_s = fair["per_second_mbps"]["tcp"][int(fair["window_s"][0]) : int(fair["window_s"][1])]
        wg_s = fair["per_second_mbps"]["wangate"][
            int(fair["window_s"][0]) : int(fair["window_s"][1])
        ]
        lines.append(
            f"| i4_fair | per second in the window: TCP min..max; wangate min..max | "
            f"{min(tcp_s):.1f}..{max(tcp_s):.1f}; {min(wg_s):.1f}..{max(wg_s):.1f} "
            f"Mbit/s (FEC overhead {_fmt(_fec(fair)['overhead'], '.3f')}) | | |"
        )
        if fair["errors"]:
            lines.append(f"| i4_fair | errors | {'; '.join(fair['errors'])} | | |")
    return lines


def _critical(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in record["messages"] if m["critical"]]


def _routes(record: dict[str, Any], src: str = "bj") -> list[dict[str, Any]]:
    return [c for c in record["route_changes"] if c["source"] == "log" and c["site"] == src]


def _aim_ms(record: dict[str, Any], scenario_name: str) -> tuple[float, str]:
    from bench.lab.scenario import load_scenario

    scenario = load_scenario(scenario_name)
    best = min(scenario.paths, key=lambda p: p.a_to_b.delay_ms)
    aim = best.a_to_b.delay_ms + 2 * best.a_to_b.jitter_ms + 10
    return aim, f"{best.a_to_b.delay_ms:g} + 2x{best.a_to_b.jitter_ms:g} + 10"


def _route_text(change: dict[str, Any] | None) -> str:
    if change is None:
        return "never"
    return f"{change['previous']} -> {change['current']}: {change['reason']}"


def _floor_rows(name: str, p50: float | None, p99: float | None) -> list[str]:
    file = RESULTS / "critical_floor" / f"{name}.json"
    if not file.exists():
        return []
    floor = json.loads(file.read_text())
    times = floor["times_s"]
    if not times:
        return []
    floor_p50, floor_p99 = _p(times, 0.5), _p(times, 0.99)
    rows = [
        f"| {name} | lab floor: the message as {floor['datagrams']} raw UDP datagrams of "
        f"{floor['datagram_bytes']} B on path {floor['path']}, no gateway, the timeline "
        f"playing; first send -> last arrival p50 / p99 / max (ms), {floor['complete']} of "
        f"{floor['messages']} complete | {_fmt(_ms(floor_p50), '.1f')} / "
        f"{_fmt(_ms(floor_p99), '.1f')} / {_fmt(_ms(max(times)), '.1f')} | | |"
    ]
    if floor_p50 and floor_p99 and p50 is not None and p99 is not None:
        rows.append(
            f"| {name} | critical p50 / p99 over the floor's | "
            f"{p50 / floor_p50:.2f} / {p99 / floor_p99:.2f} | | |"
        )
    return rows


def issue5_rows() -> list[str]:
    lines = ["| scenario | metric | measured | aim | met? |", "|---|---|---|---|---|"]
    for name in ISSUE5_RUNS:
        record = _load(name)
        if record is None:
            lines.append(f"| {name} | not run | | | |")
            continue
        crit = _critical(record)
        delays = [m["send_to_deliver_s"] for m in crit if m["send_to_deliver_s"] is not None]
        lost = [m for m in record["messages"] if not m["intact"]]
        aim, aim_text = _aim_ms(record, name)
        p99 = _p(delays, 0.99)
        wg = record["wangate"]
        p50, worst = _p(delays, 0.5), max(delays) if delays else None
        lines.append(
            f"| {name} | critical send->deliver p50 / p99 / max (ms), {len(delays)} of "
            f"{len(crit)} delivered | {_fmt(_ms(p50), '.0f')} / "
            f"**{_fmt(_ms(p99), '.0f')}** / "
            f"{_fmt(_ms(worst), '.0f')} | p99 <= {aim:.0f} ({aim_text}) | "
            f"{_met(p99 is not None and p99 * 1e3 <= aim)} |"
        )
        lines.extend(_floor_rows(name, p50, p99))
        lines.append(
            f"| {name} | messages lost or corrupt (of {wg['messages']}); bulk delivered "
            f"by | {len(lost)}; workload done at {_fmt(wg['time_s'], '.1f', ' s')} | 0 | "
            f"{_met(not lost)} |"
        )
        routes = _routes(record)
        events = [e["at_s"] for e in record["timeline"]]
        if "degrade" in name or "blackhole" in name:
            at, hit = events[0], record["timeline"][0]["path"]
            before = [c for c in routes if c["t_s"] < at]
            on = before[-1]["current"] if before else None
            lines.append(
                f"| {name} | critical route when path {hit} changes at t={at:g} s | "
                f"{on} ({_route_text(before[-1]) if before else 'no route'}) | {hit} | "
                f"{_met(on == hit)} |"
            )
            moved = [c for c in routes if c["t_s"] >= at and c["previous"] == hit]
            first = moved[0] if moved and on == hit else None
            reaction = first["t_s"] - at if first else None
            lines.append(
                f"| {name} | critical route leaves {hit} after the t={at:g} s event "
                f"| {_fmt(reaction, '.2f', ' s')} "
                f"({_route_text(first)}) "
                f"| < 1 s | {_met(reaction is not None and reaction < 1.0)} |"
            )
            late = [m for m in crit if m["call_s"] is not None and m["call_s"] >= at]
            worst = max(late, key=lambda m: m["send_to_deliver_s"] or 1e9) if late else None
            if worst:
                lines.append(
                    f"| {name} | longest critical delay after the event | "
                    f"{_fmt(_ms(worst['send_to_deliver_s']), '.0f', ' ms')} "
                    f"(sent at {worst['call_s']:.2f} s) | | |"
                )
        if "jitter" in name:
            # the route matters while critical traffic flows; moves after it (bulk alone,
            # e.g. a loss burst when bulk speeds up again) are listed on their own
            end = max((m["delivered_s"] or 0 for m in crit), default=0.0)
            inside = [c for c in routes if 0 <= c["t_s"] <= end]
            after = [c for c in routes if c["t_s"] > end]
            windows = max(1, math.ceil(end / COOLDOWN_S))
            worst_window = max(
                (
                    sum(1 for c in inside if t <= c["t_s"] < t + COOLDOWN_S)
                    for t in [c["t_s"] for c in inside]
                ),
                default=0,
            )
            lines.append(
                f"| {name} | critical route switches bj->sh while critical traffic "
                f"flowed ({end:.1f} s) | "
                f"{len(inside)} = {len(inside) / windows:.2f} per {COOLDOWN_S:g} s; "
                "at most "
                f"**{worst_window}** in any {COOLDOWN_S:g} s window | <= 1 per cooldown | "
                f"{_met(worst_window <= 1)} |"
            )
            gaps = [b["t_s"] - a["t_s"] for a, b in itertools.pairwise(inside)]
            listed = "; ".join(f"{c['t_s']:.2f} s {_route_text(c)}" for c in inside[:8])
            lines.append(
                f"| {name} | shortest gap between switches; the switches | "
                f"{_fmt(min(gaps) if gaps else None, '.2f', ' s')}; {listed or 'none'}"
                f"{' ...' if len(inside) > 8 else ''} | >= {COOLDOWN_S:g} s | "
                f"{_met(not gaps or min(gaps) >= COOLDOWN_S)} |"
            )
            if after:
                listed = "; ".join(f"{c['t_s']:.2f} s {_route_text(c)}" for c in after[:4])
                lines.append(
                    f"| {name} | route changes after critical traffic ended | "
                    f"{len(after)}: {listed} | | |"
                )
        lines.append(
            f"| {name} | plot | `results/{name}/latency.png` (route changes marked), "
            f"`paths.png`, `goodput.png` | | |"
        )
    return lines


def issue6_rows(codecs: dict[str, Any] | None) -> list[str]:
    if codecs is None:
        return ["i6_codecs not run"]
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


def _run_runner(names: tuple[str, ...], extra: list[str]) -> None:
    for name in names:
        command = [sys.executable, "-m", "bench", "run", *extra, name]
        print("$", " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=ROOT, check=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker_main(argv[1], argv[2])
    parser = argparse.ArgumentParser(
        prog="python -m bench.issues",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("issue", choices=("4", "5", "6", "all"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    issues = ("4", "5", "6") if args.issue == "all" else (args.issue,)
    for issue in issues:
        if issue == "4":
            if not args.report_only:
                _run_runner(ISSUE4_RUNS, ["--baseline", "tcp-cubic", "--baseline", "tcp-bbr"])
                _run_runner(ISSUE4_MULTI, ["--baseline", "tcp-bbr"])
                _run_runner(
                    (*ISSUE4_RUNS[:2], *ISSUE4_MULTI),
                    ["--no-baselines", "--no-plots", "--results", str(RESULTS / "i4_repeat")],
                )
                run_fair()
            fair = _load("i4_fair")
            lines = issue4_rows(fair)
        elif issue == "5":
            if not args.report_only:
                _run_runner(ISSUE5_RUNS, ["--no-baselines"])
                from bench.critical_floor import measure

                for name in ISSUE5_RUNS:
                    measure(name)
            lines = issue5_rows()
        else:
            codecs = None if args.report_only else run_codecs()
            lines = issue6_rows(codecs or _load("i6_codecs"))
        text = "\n".join([f"## Issue {issue}", "", *lines, ""])
        (RESULTS / f"issue{issue}.md").write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
