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

from bench.runner import baselines
from bench.runner import record as rec
from bench.runner.run import check_scenario, run_scenario
from bench.runner.trainer import digest, payload
from wangate.errors import ConfigError
from wangate.lab import netns
from wangate.lab.lab import Lab
from wangate.lab.scenario import SCENARIO_DIR, load_scenario, parse_scenario

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
    files = sorted(SCENARIO_DIR.glob("*.toml"))
    runnable = [s for s in map(load_scenario, files) if s.flows]
    assert {"multipath_clean3", "loss_1", "multipath_three_sites"} <= {s.name for s in runnable}
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


@pytest.mark.netns
@pytest.mark.timeout(120)
@pytest.mark.skipif(_problem is not None, reason=f"WAN lab unavailable: {_problem}")
def test_a_baseline_whose_sender_prints_nothing_is_a_failed_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TCP sender asking for a congestion control the kernel does not have dies with a
    traceback and no report; the baselines go on and that row says why it failed."""
    scenario_file = tmp_path / "tiny.toml"
    scenario_file.write_text(TINY)
    bogus = (("tcp-cubic", "tcp", "nosuchcc"), ("tcp-bbr", "tcp", "bbr"))
    monkeypatch.setattr(baselines, "BASELINES", bogus)
    with Lab(load_scenario(scenario_file), run_id="b" + secrets.token_hex(2)) as lab:
        report = baselines.run_baselines(lab, timeout_s=30.0)
    failed, bbr = report["baselines"]
    assert failed["name"] == "tcp-cubic" and failed["time_s"] is None
    assert failed["delivered_bytes"] == 0
    assert failed["error"].startswith("bj->sh: sender exited with 1 and printed no report: ")
    assert "FileNotFoundError" in failed["error"]
    assert bbr["name"] == "tcp-bbr" and bbr["error"] is None
    assert bbr["time_s"] is not None and bbr["delivered_bytes"] == 4 * (65536 + 1_000_003)
    table = baselines.markdown_table(report)
    assert f"| tcp-cubic | failed: {failed['error']} | | | |" in table.splitlines()
    record = {
        "wangate": {"time_s": 1.0, "complete": True, "timeout_s": 9.0},
        "baselines": report,
        "bound_s": 1.0,
        "total_bytes": 1,
        "scenario": "tiny",
    }
    assert rec.results_rows(record)[1] == ("tcp-cubic", None, f"failed: {failed['error']}")
    row = rec.combined_table([record]).splitlines()[2].split(" | ")
    assert row[4:6] == ["failed", f"{bbr['time_s']:.2f} s ({bbr['time_s']:.2f})"]


@pytest.mark.netns
@pytest.mark.timeout(120)
@pytest.mark.skipif(_problem is not None, reason=f"WAN lab unavailable: {_problem}")
def test_baselines_carry_two_flows_between_the_same_sites(tmp_path: Path) -> None:
    """A critical flow and a bulk flow from bj to sh share the best path: each baseline
    gives each flow a receiver of its own, and both arrive whole."""
    two_flows = TINY.replace(
        '[[workload.flows.messages]]\nname = "bulk"',
        '[[workload.flows]]\nsrc = "bj"\ndst = "sh"\nsteps = 4\ninterval_s = 0.3\n'
        '[[workload.flows.messages]]\nname = "bulk"',
    )
    scenario_file = tmp_path / "two.toml"
    scenario_file.write_text(two_flows)
    scenario = load_scenario(scenario_file)
    assert [len(f.messages) for f in scenario.flows] == [1, 1]
    with Lab(scenario, run_id="f" + secrets.token_hex(2)) as lab:
        report = baselines.run_baselines(lab, timeout_s=30.0, only=("tcp-bbr",))
    (bbr,) = report["baselines"]
    assert bbr["error"] is None, bbr["error"]
    assert bbr["delivered_bytes"] == bbr["total_bytes"] == 4 * (65536 + 1_000_003)
    assert bbr["time_s"] is not None
    assert set(bbr["detail"]) == {"bj->sh #0", "bj->sh #1"}
    assert [d["cc"] for d in bbr["detail"].values()] == ["bbr", "bbr"]
