"""What a scenario's workload allows: its send schedule, the best path of a flow, and
the fluid bound every transport's time is measured against (pure arithmetic)."""

from __future__ import annotations

import math

from wangate.lab.scenario import Flow, PathSpec, Scenario


def schedule(flow: Flow) -> list[tuple[float, int]]:
    """(send time after start, size) of every message of ``flow``, in order."""
    return [
        (flow.start_s + step * flow.interval_s, message.size_bytes)
        for step in range(flow.steps)
        for message in flow.messages
    ]


def best_path(scenario: Scenario, flow: Flow) -> PathSpec:
    """The path with the least time for one step on its initial parameters."""
    step_bits = 8 * sum(m.size_bytes for m in flow.messages)

    def step_time(path: PathSpec) -> float:
        params = path.params_from(flow.src)
        serialise = step_bits / params.rate_bps if params.rate_bps > 0 else 0.0
        return math.inf if params.blackhole else serialise + params.delay_ms / 1000.0

    candidates = scenario.paths_between(flow.src, flow.dst)
    if not candidates:
        raise ValueError(f"no path between {flow.src} and {flow.dst}")
    return min(candidates, key=step_time)


def ideal_time_s(scenario: Scenario, flow: Flow) -> float:
    """Fluid bound: every message over the sum of the path rates, plus the least delay.

    Uses the initial parameters (a timeline that degrades a path makes it looser)."""
    paths = [p.params_from(flow.src) for p in scenario.paths_between(flow.src, flow.dst)]
    paths = [p for p in paths if not p.blackhole]
    rate_bps = math.inf if any(p.rate_bps == 0 for p in paths) else sum(p.rate_bps for p in paths)
    least_delay_s = min(p.delay_ms for p in paths) / 1000.0
    finished = 0.0
    for at_s, size in schedule(flow):
        finished = max(finished, at_s) + size * 8 / rate_bps
    return finished + least_delay_s
