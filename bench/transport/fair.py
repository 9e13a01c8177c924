"""Fairness: one TCP cubic flow and a wangate bulk transfer share one clean path.

    python -m bench suite fair           # scenario fair_tcp; needs root

For 30 s both flows run on the one path of ``fair_tcp``; each flow's goodput is taken
over the same window, start-up excluded. The TCP ends run inside the namespaces as
workers of this module (``python -m bench.transport.fair tcp-sink|tcp-source JSON``).
"""

from __future__ import annotations

import itertools
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from bench.common import RESULTS, fec_overhead, fmt, load_record, met
from bench.runner.gateways import start_gateways, stop_gateways
from bench.tree import THIS, Tree
from wangate.lab.lab import Lab
from wangate.lab.scenario import load_scenario

SCENARIO = "fair_tcp"
PAYLOAD_CHUNK = 256 * 1024
FAIR_DURATION_S = 30.0
FAIR_WINDOW_S = (5.0, 30.0)  # both flows measured over the same span, start-up excluded


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


def run(tree: Tree = THIS) -> dict[str, Any]:
    """One run with the gateways of ``tree`` (results go to ``results/fair_tcp/run.json``
    whichever it is)."""
    import wangate

    scenario = load_scenario(SCENARIO)
    path = scenario.paths[0]
    out = RESULTS / SCENARIO
    rng = np.random.default_rng(scenario.seed)
    chunk = rng.integers(0, 256, 1 << 20, dtype=np.uint8)  # 1 MiB, incompressible
    wg_done: list[tuple[float, int]] = []
    errors: list[str] = []
    with Lab(scenario) as lab:
        gateways, _ = start_gateways(lab, lab.write_gateway_configs(), out / "logs", tree=tree)
        sink = lab.run_in(
            "sh",
            [
                sys.executable,
                "-m",
                "bench.transport.fair",
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
                "bench.transport.fair",
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
        stop_gateways(gateways)
    start, end = t0 + FAIR_WINDOW_S[0], t0 + FAIR_WINDOW_S[1]
    tcp_bytes = _bytes_in(got.get("samples", []), start, end)
    wg_cumulative, total = [], 0
    for t, n in wg_done:
        total += n
        wg_cumulative.append([t, total])
    wg_bytes = _bytes_in([[t0, 0], *wg_cumulative], start, end)
    span = end - start
    record = {
        "scenario": SCENARIO,
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


def rows() -> list[str]:
    """The table of the last run on disk."""
    lines = ["| scenario | metric | measured | aim | met? |", "|---|---|---|---|---|"]
    fair = load_record(SCENARIO)
    if fair is None:
        lines.append(f"| {SCENARIO} | not run | | | |")
    else:
        rate = fair["link_rate_mbps"]
        tcp, wg = fair["tcp"]["goodput_mbps"], fair["wangate"]["goodput_mbps"]
        lines.append(
            f"| {SCENARIO} | TCP cubic share of the link beside wangate "
            f"(t={fair['window_s'][0]:g}..{fair['window_s'][1]:g} s) | {tcp:.1f} Mbit/s = "
            f"**{tcp / rate:.2f}**; wangate {wg:.1f} Mbit/s = {wg / rate:.2f}; sum "
            f"{(tcp + wg) / rate:.2f} | >= 0.33 | {met(tcp / rate >= 1 / 3)} |"
        )
        tcp_s = fair["per_second_mbps"]["tcp"][int(fair["window_s"][0]) : int(fair["window_s"][1])]
        wg_s = fair["per_second_mbps"]["wangate"][
            int(fair["window_s"][0]) : int(fair["window_s"][1])
        ]
        lines.append(
            f"| {SCENARIO} | per second in the window: TCP min..max; wangate min..max | "
            f"{min(tcp_s):.1f}..{max(tcp_s):.1f}; {min(wg_s):.1f}..{max(wg_s):.1f} "
            f"Mbit/s (FEC overhead {fmt(fec_overhead(fair)['overhead'], '.3f')}) | | |"
        )
        if fair["errors"]:
            lines.append(f"| {SCENARIO} | errors | {'; '.join(fair['errors'])} | | |")
    return lines


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1], sys.argv[2]))
