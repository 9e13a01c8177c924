"""python -m bench jobs: its scenarios and how it reads a phase (no lab needed)."""

from __future__ import annotations

import pytest

from bench.jobs import lab as jobs_lab
from wangate.lab.scenario import load_scenario


def test_scenarios_declare_the_jobs_and_one_placement_line() -> None:
    one = load_scenario(jobs_lab.ONE_PATH)
    assert len(one.paths) == 1
    for job in ("a", "b", "crit", "bulk", "live", "stuck"):
        assert f"[jobs.{job}]" in one.gateway_config
    three = load_scenario(jobs_lab.THREE_PATHS)
    assert len(three.paths) == 3 and len({p.a_to_b.rate_mbps for p in three.paths}) == 1
    uneven = load_scenario(jobs_lab.UNEVEN)
    assert sum(p.a_to_b.rate_mbps for p in uneven.paths) == sum(
        p.a_to_b.rate_mbps for p in three.paths
    )
    assert set(jobs_lab.PLACEMENTS) == set(jobs_lab.PLACEMENT_REPEATS) == {three.name, uneven.name}
    for scenario in (three, uneven):  # the bench rewrites this line for the spread runs
        assert scenario.gateway_config.count('placement = "share"') == 1


def test_bytes_in_spreads_each_message_since_the_one_before() -> None:
    events = [[float(t), 100, t] for t in range(1, 11)]  # 100 B a second from t=0
    assert jobs_lab.bytes_in(events, 2.0, 6.0) == pytest.approx(400.0)
    assert jobs_lab.bytes_in(events, 2.5, 3.0) == pytest.approx(50.0)
    assert jobs_lab.bytes_in([], 0.0, 1.0) == 0.0
    assert jobs_lab.mbps(events, 0.0, 10.0) == pytest.approx(1000 * 8 / 10 / 1e6)


def test_latencies_take_the_messages_sent_in_the_window() -> None:
    phase = {
        "sites": {
            "sh": {
                "roles": [
                    {
                        "job": "crit",
                        "role": "recv",
                        "events": [[1.03, 65536, 0, 1.0], [1.1, 65536, 1, 1.05], [3.0, 1, 2, 2.9]],
                    }
                ]
            }
        }
    }
    assert jobs_lab.latencies(phase, "crit", 1.0, 2.0) == pytest.approx([0.03, 0.05])
