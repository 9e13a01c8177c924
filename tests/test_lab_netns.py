"""The emulator on real namespaces and TUN devices, measured with a UDP blaster.

Tolerances: one-way delay median within 3 ms of delay + one serialisation time,
received rate within 10 % of rate x (1 - loss), loss within 1 percentage point over
6000 packets; a blackhole delivers nothing.
"""

from __future__ import annotations

import dataclasses
import secrets
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from wangate.lab import netns
from wangate.lab.lab import Lab, cleanup
from wangate.lab.scenario import TimelineEvent
from wangate.lab.selftest import blast, measure_accuracy, two_site_scenario

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]
_problem = netns.environment_problem()
if _problem:
    pytestmark.append(pytest.mark.skip(reason=_problem))


def _run_id() -> str:
    """Fresh per test, so concurrent runs of this file never collide."""
    return "t" + secrets.token_hex(2)


def _namespaces_of(run_id: str) -> list[str]:
    return [n for n in netns.list_namespaces() if n.startswith(f"wglab-{run_id}-")]


def test_measured_link_matches_configuration() -> None:
    run_id = _run_id()
    result = measure_accuracy(run_id=run_id)
    serialisation_ms = (1200 + 28) * 8 / 20e6 * 1000
    assert abs(result["delay_median_ms"] - (20.0 + serialisation_ms)) < 3.0
    assert result["sent_packets"] == 6000
    # the emulator's own loss decisions over every packet that reached it (both blasts):
    # what the model is configured for, whatever the machine's load
    a = result["forwarder_stats"]["a"]["a_to_b"]
    model_loss = a["dropped_loss"] / (a["pushed_packets"] - a["dropped_queue"])
    assert abs(model_loss - 0.02) < 0.005, a
    # end to end a busy host can drop more at its own sockets, not (beyond sampling) less
    assert model_loss - 0.01 < result["loss"] < 0.10
    assert abs(result["saturated_received_mbps"] - 20.0 * 0.98) < 0.1 * 19.6
    assert result["blackhole_sent"] == 500
    assert result["blackhole_received"] == 0
    assert result["forwarder_stats"]["b"]["a_to_b"]["dropped_blackhole"] == 500
    assert _namespaces_of(run_id) == []


def test_addresses_bind_their_own_path_and_cleanup_leaves_nothing() -> None:
    scenario = two_site_scenario([{"name": "a", "delay_ms": 1.0}, {"name": "b", "delay_ms": 1.0}])
    run_id = _run_id()
    with Lab(scenario, run_id=run_id) as lab:
        assert [(a.path, a.local, a.remote) for a in lab.site_addresses("bj")] == [
            ("a", "10.77.1.1", "10.77.1.2"),
            ("b", "10.77.2.1", "10.77.2.2"),
        ]
        route = lab.run_in(
            "bj",
            ["ip", "-o", "route", "get", "10.77.2.2", "from", "10.77.2.1"],
            stdout=subprocess.PIPE,
        )
        assert f"dev wl{run_id}p2a" in route.communicate(timeout=10)[0].decode()
        assert sorted(_namespaces_of(run_id)) == [f"wglab-{run_id}-bj", f"wglab-{run_id}-sh"]
        # the gateway hook: a command per site, run in its namespace, given its config
        hooks = lab.start_gateways("cat {config}", port=7000, stdout=subprocess.PIPE)
        config = tomllib.loads(hooks["sh"].communicate(timeout=10)[0].decode())
        assert config["site"]["name"] == "sh"
        assert [(p["name"], p["local"], p["remote"]) for p in config["peers"][0]["paths"]] == [
            ("a", "10.77.1.2", "10.77.1.1:7000"),
            ("b", "10.77.2.2", "10.77.2.1:7000"),
        ]
        assert config["peers"][0]["name"] == "bj"
        assert all(Path(config["tls"][key]).is_file() for key in ("ca", "cert", "key"))
    assert _namespaces_of(run_id) == []
    assert not [link for link in netns.list_links() if link.startswith(f"wl{run_id}")]


def test_sigterm_tears_down_and_cleanup_removes_orphans() -> None:
    run_id, orphan = _run_id(), _run_id()
    up = subprocess.Popen(
        [sys.executable, "-m", "wangate.lab", "up", "critical_jitter_rounds", "--run-id", run_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert up.stdout is not None
    for line in up.stdout:
        if line.startswith("timeline started"):
            break
    assert len(_namespaces_of(run_id)) == 2
    up.send_signal(signal.SIGTERM)
    up.wait(timeout=20)
    assert _namespaces_of(run_id) == []
    # a namespace left by a crashed run (no owner process) is removed by cleanup
    netns.ip("netns", "add", f"wglab-{orphan}-bj")
    removed = cleanup()
    assert f"namespace wglab-{orphan}-bj" in removed
    assert _namespaces_of(orphan) == []


def test_timeline_changes_delay_during_a_run() -> None:
    scenario = dataclasses.replace(
        two_site_scenario([{"name": "a", "delay_ms": 5.0}]),
        timeline=(TimelineEvent(0.5, "a", "a_to_b", {"delay_ms": 40.0}),),
    )
    with Lab(scenario, run_id=_run_id()) as lab:
        # the timeline started 1 s ago: the forwarders apply the change at 0.5 s as they
        # take the start command, before any packet of the blast reaches them
        lab.start_timeline(time.monotonic() - 1.0)
        late = blast(lab, [("a", 2.0, 200, 0.0)])[0]
    assert abs(late.received["delay_median_ms"] - 40.0) < 3.0
