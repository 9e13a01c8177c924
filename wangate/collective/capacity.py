"""Shares by measured capacity: reports to the leader and the leader's announcement.

Without ``[collective] weights``, a reduce-scatter/all-gather call's shares follow what
each site's paths deliver into and out of it. Each gateway measures ``capacity_mbps`` on
its paths (the delivery rate while the path was kept busy, remembered over idle time:
``wangate.core.capacity``), that is the rate out of its site; every site but the
lowest-named sends that leader its rate to each other site of the call with every call.
The leader drains the reports that arrived (it never waits for one), adds its own, and
from that matrix of rates picks the shares that load the busiest link least (every
message goes straight to its receiver, so each link carries its two ends' shares:
``mesh_weights``); while some link has no rate yet, it takes each site's capacity as the
lesser of what it sends out and what the others deliver into it (reduce-scatter/
all-gather moves as many bytes into a site as out of it) and water-fills
(``capacity_weights``). Over the links it also finds all-gather routes through relays
(``routes``). It then announces the weights and routes for this call. The others wait for
the announcement before sending: one one-way delay per call, paid only by tensors big
enough for reduce-scatter/all-gather.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from wangate.errors import LocalProtocolError
from wangate.rows import PathRow

from .exchange import CollectiveMismatch, Outgoing
from .plan import MAX_WEIGHT, Plan, Route, capacity_weights
from .routes import gather_routes, mesh_weights
from .tags import wire_tag


def out_rates_mbps(rows: Sequence[PathRow], sites: Sequence[str]) -> dict[str, float]:
    """The measured capacity of this gateway's live paths to each of ``sites``, summed per
    site (a site with no live path measured: 0). A row from a gateway that does not report
    ``capacity_mbps`` counts with its delivery rate."""
    totals = dict.fromkeys(sites, 0.0)
    for row in rows:
        rate = row.capacity_mbps if row.capacity_mbps is not None else row.rate_mbps
        live = row.peer in totals and row.state != "down"
        if live and rate is not None and math.isfinite(rate) and rate > 0:
            totals[row.peer] += rate
    return totals


def links_mbps(
    rates: Mapping[str, Mapping[str, float]], sites: Sequence[str]
) -> dict[tuple[str, str], float] | None:
    """The rate of every link between ``sites`` (``rates[a][b]``: a's measured rate to b),
    or None while some pair has no measured rate either way. A direction not measured
    (not reported, or 0: its path was never kept busy) counts as the other's."""
    result = {}
    for a in sites:
        for b in sites:
            if a == b:
                continue
            ab = rates.get(a, {}).get(b, 0.0)
            ba = rates.get(b, {}).get(a, 0.0)
            rate = ab if ab > 0 else ba
            if not rate > 0:
                return None
            result[(a, b)] = rate
    return result


def capacities_mbps(
    rates: Mapping[str, Mapping[str, float]], sites: Sequence[str]
) -> dict[str, float]:
    """Each site's capacity from the rates reported so far (``rates[a][b]``: a's measured
    rate to b): the lesser of its total out and its total in. A rate into ``i`` from a site
    that has not reported counts as ``i``'s own rate to it (paths assumed symmetric); a
    site with nothing known has 0 (``plan_from`` then gives it the mean)."""
    result = {}
    for i in sites:
        others = [j for j in sites if j != i]
        out = rates.get(i)
        totals = []
        if out is not None:
            totals.append(sum(out.get(j, 0.0) for j in others))
        if out is not None or all(j in rates for j in others):
            mine = out or {}
            totals.append(
                sum(rates[j].get(i, 0.0) if j in rates else mine.get(j, 0.0) for j in others)
            )
        result[i] = min(totals) if totals else 0.0
    return result


class Reports:
    def __init__(self, site: str, plan: Plan, tag: str) -> None:
        self.site, self.plan, self.tag = site, plan, tag
        self.peers = tuple(s for s in plan.sites if s != site)
        names = Plan.equal(plan.sites).digest
        self.report_tag = wire_tag("cp", names, 0, tag)
        self.plan_tag = wire_tag("pl", names, 1, tag)

    def report(self, leader: str, rows: Sequence[PathRow]) -> list[Outgoing]:
        rates = out_rates_mbps(rows, self.peers)
        value = np.array([rates.get(s, 0.0) for s in self.plan.sites], dtype=np.float64)
        return [Outgoing.small((leader,), self.report_tag, value, True)]

    def read_report(self, source: str, array: np.ndarray) -> dict[str, float]:
        """``source``'s rate to each other site of the call. A one-value report (its total,
        as gateways before per-site reports sent) is spread evenly over the others."""
        values = array.reshape(-1)
        sized = values.size in (1, len(self.plan.sites))
        if array.dtype != np.float64 or not sized or not bool(np.all(values >= 0)):
            raise CollectiveMismatch(f"collective {self.tag!r}: malformed report from {source}")
        clean = [float(v) if math.isfinite(v) else 0.0 for v in values]
        others = [s for s in self.plan.sites if s != source]
        if len(clean) == 1 and len(self.plan.sites) != 1:
            return {s: clean[0] / len(others) for s in others}
        return {s: v for s, v in zip(self.plan.sites, clean, strict=True) if s != source}

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

    def plan_from_rates(self, rates: Mapping[str, Mapping[str, float]]) -> Plan:
        """Weights from the rates reported so far: over the links (``mesh_weights``) once
        every link has a measured rate, before that from each site's capacity."""
        links = links_mbps(rates, self.plan.sites)
        if links is None:
            return self.plan_from(capacities_mbps(rates, self.plan.sites))
        weights = mesh_weights(self.plan.sites, links)
        return replace(
            self.plan,
            weights=tuple(weights[s] for s in self.plan.sites),
            routes=gather_routes(self.plan.sites, links),
        )

    def announce(self, plan: Plan) -> list[Outgoing]:
        if not self.peers:
            return []
        values = list(plan.weights)
        for route in plan.routes:  # owner, where each site gets it from, weight
            values.append(plan.sites.index(route.owner))
            values += [plan.sites.index(v) for v in route.via]
            values.append(route.weight)
        weights = np.array(values, dtype=np.float64)
        return [Outgoing.small(self.peers, self.plan_tag, weights, True)]

    def accept(self, leader: str, array: np.ndarray) -> Plan:
        values = array.reshape(-1)
        n = len(self.plan.sites)
        if array.dtype != np.float64 or values.size < n or (values.size - n) % (n + 2):
            raise CollectiveMismatch(
                f"collective {self.tag!r}: {leader} announced shares for other sites "
                "(do all sites pass the same sites=?)"
            )
        weights = tuple(float(w) for w in values[:n])
        if not all(math.isfinite(w) and 0 < w <= MAX_WEIGHT for w in weights):
            raise CollectiveMismatch(f"collective {self.tag!r}: malformed shares from {leader}")
        try:
            routes = tuple(self._route(values[k : k + n + 2]) for k in range(n, values.size, n + 2))
            return replace(self.plan, weights=weights, routes=routes)
        except (LocalProtocolError, ValueError, OverflowError) as exc:
            raise CollectiveMismatch(
                f"collective {self.tag!r}: malformed routes from {leader}: {exc}"
            ) from None

    def _route(self, values: np.ndarray) -> Route:
        sites = self.plan.sites
        indices = [float(v) for v in values[:-1]]
        if not all(v.is_integer() and 0 <= v < len(sites) for v in indices):
            raise ValueError(f"site indices {indices}")
        names = [sites[int(v)] for v in indices]
        return Route(names[0], tuple(names[1:]), float(values[-1]))
