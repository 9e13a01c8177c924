"""The benchmark runner end to end: real gateways in the WAN lab, messages across lossy
emulated links, the JSON record and the summary.

Needs root and /dev/net/tun (network namespaces, TUN devices); skipped otherwise,
with the reason. The pure record helpers are tested without the lab.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from bench.lab import netns
from bench.lab.scenario import load_scenario, parse_scenario
from bench.runner import record as rec
from bench.runner.run import check_scenario, run_scenario
from bench.runner.trainer import digest, payload
from wangate.errors import ConfigError

TINY = """
name = "tiny"
description = "Two sites, two paths of 20 Mbit/s (10 and 20 ms one-way), 1 % loss each way."
seed = 11

[[sites]]
name = "bj"
[[sites]]
name = "sh"

[[links]]
sites = ["bj", "sh"]
[[links.paths]]
name = "a"
rate_mbps = 20
delay_ms = 10
loss = 0.01
[[links.paths]]
name = "b"
rate_mbps = 20
delay_ms = 20
loss = 0.01

[[workload.flows]]
src = "bj"
dst = "sh"
steps = 4
interval_s = 0.3
[[workload.flows.messages]]
name = "layer0"
size_bytes = 65536
critical = true
[[workload.flows.messages]]
name = "bulk"
size_bytes = 1_000_003
"""


def test_payload_is_deterministic_and_distinct_per_message() -> None:
    first = payload(11, 0, 2, 1, 1001)
    assert first.dtype.name == "uint8" and first.shape == (1001,)
    assert payload(11, 0, 2, 1, 1001).tobytes() == first.tobytes()
    assert payload(11, 0, 3, 1, 1001).tobytes() != first.tobytes()
    assert payload(12, 0, 2, 1, 1001).tobytes() != first.tobytes()
    assert digest(first) == digest(payload(11, 0, 2, 1, 1001))
    damaged = first.copy()
    damaged[500] ^= 1
    assert digest(damaged) != digest(first)


def test_counter_deltas_spread_over_seconds_and_survive_resets() -> None:
    points = [(0.0, 0), (0.5, 1000), (1.5, 3000), (2.0, 500)]  # reset before 2.0
    spans = rec.counter_deltas(points)
    assert spans == [(0.0, 0.5, 1000), (0.5, 1.5, 2000), (1.5, 2.0, 500)]
    assert rec.bytes_between(spans, 0.0, 1.0) == 2000.0
    assert rec.per_second(spans, 2.0) == [2000 * 8 / 1e6, 1500 * 8 / 1e6]


def test_latency_stats_picks_order_statistics() -> None:
    stats = rec.latency_stats([0.3, 0.1, 0.2, 0.4])
    assert stats == {"p50_s": 0.3, "p95_s": 0.4, "max_s": 0.4, "count": 4}
    assert rec.latency_stats([])["count"] == 0


def test_scenarios_with_small_mtu_are_refused_clearly() -> None:
    small = TINY.replace('name = "b"\n', 'name = "b"\nmtu = 1200\n')
    scenario = parse_scenario(__import__("tomllib").loads(small), "tiny.toml")
    with pytest.raises(ConfigError, match="path 'b' has mtu 1200; wangate needs at least 1280"):
        check_scenario(scenario)


def test_shipped_scenarios_with_a_workload_are_runnable() -> None:
    files = sorted(Path(rec.__file__).resolve().parents[1].glob("scenarios/*.toml"))
    runnable = [s for s in map(load_scenario, files) if s.flows]
    assert {"clean3", "loss1", "three_sites"} <= {s.name for s in runnable}
    for scenario in runnable:
        check_scenario(scenario)


_problem = netns.environment_problem()


@pytest.mark.netns
@pytest.mark.timeout(120)
@pytest.mark.skipif(_problem is not None, reason=f"WAN lab unavailable: {_problem}")
def test_messages_cross_lossy_emulated_links_intact(tmp_path: Path) -> None:
    scenario_file = tmp_path / "tiny.toml"
    scenario_file.write_text(TINY)
    scenario = load_scenario(scenario_file)
    record = run_scenario(
        scenario,
        tmp_path / "results",
        baselines=(),
        timeout_s=30.0,
        run_id="r" + secrets.token_hex(2),
        plots=False,
        quiet=True,
    )

    out = tmp_path / "results" / "tiny"
    on_disk = json.loads((out / "run.json").read_text())
    assert set(rec.RECORD_KEYS) <= set(on_disk)
    assert on_disk["wangate"] == json.loads(json.dumps(record["wangate"]))

    messages = on_disk["messages"]
    assert [(m["step"], m["name"], m["size_bytes"], m["critical"]) for m in messages] == [
        (step, name, size, critical)
        for step in range(4)
        for name, size, critical in (("layer0", 65536, True), ("bulk", 1_000_003, False))
    ]
    assert all(m["intact"] for m in messages), [m for m in messages if not m["intact"]]
    for m in messages:
        # what is ordered for certain: the call comes at its time (times are kept to 1 us),
        # returns after it began, and the far trainer cannot have the message before the
        # call; the receiver can have it before the sender's thread reads its clock again
        # after `send` returned, so accepted_s and delivered_s are not ordered
        assert m["scheduled_s"] - 1e-6 <= m["call_s"] <= m["accepted_s"]
        assert m["call_s"] < m["delivered_s"]
        assert m["latency_s"] == pytest.approx(m["delivered_s"] - m["scheduled_s"], abs=1e-5)
        assert m["latency_s"] > 0.010  # at least the 10 ms one-way delay of the best path
        assert set(m["path_bytes"]) == {"a", "b"}
    wangate = on_disk["wangate"]
    assert wangate["complete"] and wangate["intact"] == wangate["messages"] == 8
    assert wangate["delivered_bytes"] == 4 * (65536 + 1_000_003)
    assert wangate["time_s"] == max(m["delivered_s"] for m in messages)
    assert wangate["trainer_errors"] == {}

    paths = on_disk["paths"]["bj->sh"]
    assert set(paths) == {"a", "b"}
    for name in ("a", "b"):
        assert sum(paths[name]["goodput_mbps"]) > 0, name
        assert paths[name]["received_bytes"] > 0, name
    # both paths together carried at least every payload byte (repairs come on top)
    assert paths["a"]["received_bytes"] + paths["b"]["received_bytes"] >= 0.95 * 4 * 1_065_539
    assert on_disk["bound_is_multipath"] is True
    assert on_disk["link_stats"]["wangate_run"]["a"]["a_to_b"]["dropped_loss"] > 0
    summary = (out / "summary.md").read_text()
    assert "Messages intact: 8 of 8" in summary
    assert "| wangate |" in summary
