"""Shares by measured capacity: reports to the leader and the leader's announcement.

Without ``[collective] weights``, a reduce-scatter/all-gather call's shares follow what
each site's paths deliver. Each site's capacity is the sum of ``rate_mbps`` (the delivery
rate its gateway measures) over its paths up to the call's other sites. Every site but
the lowest-named sends its capacity to that leader with every call; the leader drains
the reports that arrived (it never waits for one), adds its own, and announces the
weights for this call. The others wait for the announcement before sending: one one-way
delay per call, paid only by tensors big enough for reduce-scatter/all-gather.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from wangate.rows import PathRow

from .exchange import CollectiveMismatch, Outgoing
from .plan import MAX_WEIGHT, Plan, capacity_weights
from .tags import wire_tag


def own_capacity_mbps(rows: Sequence[PathRow], sites: Sequence[str]) -> float:
    """Sum of the measured rates of this gateway's live paths to ``sites``."""
    total = 0.0
    for row in rows:
        rate = row.rate_mbps
        live = row.peer in sites and row.state != "down"
        if live and rate is not None and math.isfinite(rate) and rate > 0:
            total += rate
    return total


class Reports:
    def __init__(self, site: str, plan: Plan, tag: str) -> None:
        self.site, self.plan, self.tag = site, plan, tag
        self.peers = tuple(s for s in plan.sites if s != site)
        names = Plan.equal(plan.sites).digest
        self.report_tag = wire_tag("cp", names, 0, tag)
        self.plan_tag = wire_tag("pl", names, 1, tag)

    def report(self, leader: str, rows: Sequence[PathRow]) -> list[Outgoing]:
        value = np.array([own_capacity_mbps(rows, self.plan.sites)], dtype=np.float64)
        return [Outgoing.small((leader,), self.report_tag, value, True)]

    def read_report(self, source: str, array: np.ndarray) -> float:
        values = array.reshape(-1)
        if array.dtype != np.float64 or values.size != 1 or not values[0] >= 0:
            raise CollectiveMismatch(f"collective {self.tag!r}: malformed report from {source}")
        return float(values[0]) if math.isfinite(values[0]) else 0.0

    def plan_from(self, capacity_mbps: Mapping[str, float]) -> Plan:
        """Weights from capacities; a site with none measured yet counts as the mean of
        those measured (so it gets data to measure with), all unmeasured: equal."""
        known = [capacity_mbps[s] for s in self.plan.sites if capacity_mbps.get(s, 0.0) > 0]
        if not known:
            return replace(self.plan, weights=(1.0,) * len(self.plan.sites))
        mean = sum(known) / len(known)
        rates = {s: capacity_mbps.get(s, 0.0) or mean for s in self.plan.sites}
        weights = capacity_weights(rates)
        return replace(self.plan, weights=tuple(weights[s] for s in self.plan.sites))

    def announce(self, plan: Plan) -> list[Outgoing]:
        if not self.peers:
            return []
        weights = np.array(plan.weights, dtype=np.float64)
        return [Outgoing.small(self.peers, self.plan_tag, weights, True)]

    def accept(self, leader: str, array: np.ndarray) -> Plan:
        values = array.reshape(-1)
        if array.dtype != np.float64 or values.size != len(self.plan.sites):
            raise CollectiveMismatch(
                f"collective {self.tag!r}: {leader} announced shares for other sites "
                "(do all sites pass the same sites=?)"
            )
        weights = tuple(float(w) for w in values)
        if not all(math.isfinite(w) and 0 < w <= MAX_WEIGHT for w in weights):
            raise CollectiveMismatch(f"collective {self.tag!r}: malformed shares from {leader}")
        return replace(self.plan, weights=weights)
