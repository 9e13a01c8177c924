"""Measure the emulator itself with a UDP blaster: accuracy, sustained rate, CPU use."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from wangate.lab.lab import Lab
from wangate.lab.scenario import Scenario, parse_scenario

SINK_PORT = 9000


def two_site_scenario(paths: list[dict[str, Any]], seed: int = 1) -> Scenario:
    return parse_scenario(
        {
            "name": "selftest",
            "seed": seed,
            "sites": [{"name": "bj"}, {"name": "sh"}],
            "links": [{"sites": ["bj", "sh"], "paths": paths}],
        },
        "selftest",
    )


@dataclass(frozen=True)
class BlastResult:
    path: str
    sent: dict[str, Any]
    received: dict[str, Any]

    @property
    def loss(self) -> float:
        sent = int(self.sent["sent"])
        return 1.0 - int(self.received["unique"]) / sent if sent else 0.0


def blast(
    lab: Lab, flows: list[tuple[str, float, int, float]], size: int = 1200, idle_s: float = 1.0
) -> list[BlastResult]:
    """Run one sender per (path, rate_mbps, count, duration_s) at once, bj → sh.

    A sink waits for its first packet as long as its sender may take to start (seconds on
    a loaded machine; on a blackholed path only ``idle_s``), then stops ``idle_s`` after
    the last one.
    """
    sinks, senders = [], []
    for path_name, _rate, _count, _duration in flows:
        path = lab.scenario.path(path_name)
        sink = lab.run_in(
            path.site_b,
            [
                sys.executable,
                "-m",
                "wangate.lab.blaster",
                "sink",
                "--bind",
                f"{path.address_b}:{SINK_PORT}",
                "--idle-s",
                str(idle_s),
                "--first-s",
                str(idle_s if path.a_to_b.blackhole else 60.0),
            ],
            stdout=subprocess.PIPE,
        )
        assert sink.stdout is not None
        sink.stdout.readline()  # {"ready": true}
        sinks.append(sink)
    for path_name, rate, count, duration in flows:
        path = lab.scenario.path(path_name)
        argv = [
            sys.executable,
            "-m",
            "wangate.lab.blaster",
            "send",
            "--bind",
            path.address_a,
            "--to",
            f"{path.address_b}:{SINK_PORT}",
            "--rate-mbps",
            str(rate),
            "--size",
            str(size),
        ]
        argv += ["--count", str(count)] if count else ["--duration-s", str(duration)]
        senders.append(lab.run_in(path.site_a, argv, stdout=subprocess.PIPE))
    results = []
    for (path_name, *_), sender, sink in zip(flows, senders, sinks, strict=True):
        sent = json.loads(sender.communicate(timeout=120)[0])
        received = json.loads(sink.communicate(timeout=120)[0])
        if (
            sent["sent"]
            and not received["received"]
            and not lab.scenario.path(path_name).a_to_b.blackhole
        ):
            raise AssertionError(f"path {path_name}: {sent['sent']} packets sent, none received")
        results.append(BlastResult(path_name, sent, received))
    return results


def measure_accuracy(run_id: str | None = None) -> dict[str, Any]:
    """delay 20 ms, 20 Mbit/s, 2 % loss on path a; path b blackholed."""
    scenario = two_site_scenario(
        [
            {"name": "a", "delay_ms": 20.0, "rate_mbps": 20.0, "loss": 0.02},
            {"name": "b", "delay_ms": 5.0, "blackhole": True},
        ]
    )
    with Lab(scenario, run_id=run_id) as lab:
        lab.start_timeline()
        # Below the rate: no queueing, so delay = 20 ms + one serialisation (0.49 ms).
        paced = blast(lab, [("a", 15.0, 6000, 0.0), ("b", 5.0, 500, 0.0)])
        # Above the rate: the bottleneck sets the received rate.
        saturated = blast(lab, [("a", 30.0, 0, 1.5)])[0]
    return {
        "configured": {"delay_ms": 20.0, "rate_mbps": 20.0, "loss": 0.02},
        "sent_packets": paced[0].sent["sent"],
        "delay_median_ms": paced[0].received["delay_median_ms"],
        "delay_p95_ms": paced[0].received["delay_p95_ms"],
        "loss": paced[0].loss,
        # random loss is applied after the bottleneck, so goodput = rate x (1 - loss)
        "saturated_received_mbps": saturated.received["received_mbps"],
        "saturated_loss": saturated.loss,
        "blackhole_sent": paced[1].sent["sent"],
        "blackhole_received": paced[1].received["received"],
        "forwarder_stats": lab.final_stats,
    }


def measure_throughput(
    path_count: int,
    rate_mbps: float,
    duration_s: float = 3.0,
    run_id: str | None = None,
    offered_mbps: float = 0.0,
) -> dict[str, Any]:
    """Drive ``path_count`` paths at ``offered_mbps`` each (default 1.05 x their rate)."""
    scenario = two_site_scenario(
        [{"name": f"p{i}", "delay_ms": 10.0, "rate_mbps": rate_mbps} for i in range(path_count)]
    )
    send_rate = offered_mbps or rate_mbps * 1.05
    with Lab(scenario, run_id=run_id) as lab:
        lab.start_timeline()
        before = lab.link_stats()
        started = time.monotonic()
        results = blast(
            lab, [(f"p{i}", send_rate, 0, duration_s) for i in range(path_count)], size=1400
        )
        wall = time.monotonic() - started
        after = lab.link_stats()
    cpu = {name: after[name]["cpu_s"] - before[name]["cpu_s"] for name in after}
    return {
        "paths": path_count,
        "rate_mbps": rate_mbps,
        "send_mbps": send_rate,
        "received_mbps": [r.received.get("received_mbps", 0.0) for r in results],
        "sent_mbps": [r.sent["sent_mbps"] for r in results],
        "loss": [r.loss for r in results],
        "forwarder_cpu_percent": [100.0 * c / wall for c in cpu.values()],
        "wall_s": wall,
    }


def run_selftest(run_id: str | None = None) -> str:
    accuracy = measure_accuracy(run_id)
    lines = [
        "## Emulator accuracy (delay 20 ms, 20 Mbit/s, loss 2 %)",
        "",
        "| measure | configured | measured |",
        "|---|---|---|",
        f"| one-way delay median (15 Mbit/s offered) | 20 ms + 0.49 ms serialisation | "
        f"{accuracy['delay_median_ms']:.2f} ms (p95 {accuracy['delay_p95_ms']:.2f}) |",
        f"| loss over {accuracy['sent_packets']} packets | 2.00 % | "
        f"{100 * accuracy['loss']:.2f} % |",
        f"| received rate (30 Mbit/s offered) | 20 x 0.98 = 19.6 Mbit/s | "
        f"{accuracy['saturated_received_mbps']:.2f} Mbit/s |",
        f"| blackhole: received of {accuracy['blackhole_sent']} | 0 | "
        f"{accuracy['blackhole_received']} |",
        "",
        "## Sustained rate and forwarder CPU (1400-byte datagrams, offered 1.05 x rate)",
        "",
        "| paths | rate/path | offered/path | received/path | loss | forwarder CPU/path |",
        "|---|---|---|---|---|---|",
    ]
    for path_count, rate, offered in (
        (1, 50.0, 0.0),
        (1, 100.0, 0.0),
        (3, 50.0, 0.0),
        (3, 100.0, 0.0),
        (1, 0.0, 600.0),
    ):
        result = measure_throughput(path_count, rate, run_id=run_id, offered_mbps=offered)
        received = ", ".join(f"{v:.1f}" for v in result["received_mbps"])
        offered_text = ", ".join(f"{v:.1f}" for v in result["sent_mbps"])
        loss = ", ".join(f"{100 * v:.1f} %" for v in result["loss"])
        cpu_text = ", ".join(f"{v:.0f} %" for v in result["forwarder_cpu_percent"])
        label = f"{rate:.0f} Mbit/s" if rate else "unlimited"
        lines.append(
            f"| {path_count} | {label} | {offered_text} | {received} | {loss} | {cpu_text} |"
        )
    return "\n".join(lines)
