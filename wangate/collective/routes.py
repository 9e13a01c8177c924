"""Plans from the rates of the links between the sites: shares, and all-gather routes
through relays.

Sent straight from owner to receiver, reduce-scatter/all-gather loads the link between
``i`` and ``j`` with ``s_i + s_j`` of the tensor each way (``mesh_weights``), so a slow
link between two busy sites bounds the call however the shares are set. Passing a reduced
chunk on through a third site loads that site's links instead and adds no byte on the
whole: every site still receives each reduced chunk once, and the relay sends what the
owner no longer does. The reduce-scatter
stays direct: a relay that added contributions would change the documented order of the
additions (``arith``). Which routes, and how much of the tensor each carries, is a linear
program over every route of depth at most two (owner -> relay -> site): maximise the
tensor moved per unit time with no link direction over its rate. It is solved only for a
handful of sites (the routes per owner grow quickly) and used only when it beats the
direct mesh's best by ``MIN_GAIN``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from .lp import maximise_sum
from .plan import Route

MAX_SITES = 5  # 41 routes per owner at five sites, 196 at six
MIN_GAIN = 1.05  # routes must move the tensor at least 5 % faster than direct sends


def _pair_rates(
    sites: Sequence[str], links_mbps: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    """Each direction's usable rate: the slower direction of its pair (0 if unknown)."""
    rates = {}
    for a, b in itertools.permutations(sites, 2):
        known = [
            r for r in (links_mbps.get((a, b)), links_mbps.get((b, a)))
            if r is not None and math.isfinite(r)
        ]  # fmt: skip
        rates[(a, b)] = max(0.0, min(known)) if known else 0.0
    return rates


def mesh_weights(
    sites: Sequence[str], links_mbps: Mapping[tuple[str, str], float], floor: float = 0.05
) -> dict[str, float]:
    """Weights that let reduce-scatter/all-gather finish soonest over the links between
    the sites when every message goes straight to its receiver, none below ``floor`` of
    the largest.

    The link between ``i`` and ``j`` then carries ``S (s_i + s_j)`` each way: ``s_j S``
    of ``i``'s contribution to ``j``'s share and ``s_i S`` of ``i``'s reduced share. The
    call takes at least ``max 8 S (s_i + s_j) / c_ij`` over the links, which also bounds
    each site's total (``capacity_weights``' model), so these shares are the ones of the
    linear program ``max sum x`` over ``x_i + x_j <= c_ij``, ``x >= 0``, scaled to sum 1.
    ``links_mbps[(a, b)]``: the rate from ``a`` to ``b``; the slower direction counts, a
    pair missing both ways counts as 0 (no bytes between those two). Two sites (or
    fewer) exchange directly: equal weights.
    """
    ordered = sorted(set(sites))
    if len(ordered) <= 2:
        return dict.fromkeys(ordered, 1.0)
    rates = _pair_rates(ordered, links_mbps)
    pairs = list(itertools.combinations(ordered, 2))
    rows = [[1.0 if s in pair else 0.0 for s in ordered] for pair in pairs]
    x = maximise_sum(rows, [rates[pair] for pair in pairs])
    top = max(x)
    if top <= 0:
        return dict.fromkeys(ordered, 1.0)
    return {site: round(max(v / top, floor), 4) for site, v in zip(ordered, x, strict=True)}


def _vias(sites: Sequence[str], owner: str) -> Iterator[tuple[str, ...]]:
    """Every route of depth <= 2 from ``owner``: a non-empty set of sites it sends to,
    each other site getting the chunks from one of those."""
    others = [s for s in sites if s != owner]
    for k in range(len(others), 0, -1):
        for direct in itertools.combinations(others, k):
            rest = [s for s in others if s not in direct]
            for parents in itertools.product(direct, repeat=len(rest)):
                via = {
                    owner: owner,
                    **dict.fromkeys(direct, owner),
                    **dict(zip(rest, parents, strict=True)),
                }
                yield tuple(via[s] for s in sites)


def _throughput(
    sites: Sequence[str],
    rates: Mapping[tuple[str, str], float],
    routes: list[tuple[str, tuple[str, ...]]],
) -> list[float]:
    """The linear program: how much of the tensor (in Mbit per second of call) each
    route may carry with no link direction over its rate."""
    rows, limits = [], []
    for (u, v), rate in rates.items():
        row = []
        for owner, via in routes:
            contribution = 1.0 if v == owner else 0.0  # u's slice of owner's part
            gathered = 1.0 if v != owner and via[sites.index(v)] == u else 0.0
            row.append(contribution + gathered)
        rows.append(row)
        limits.append(rate)
    return maximise_sum(rows, limits)


def gather_routes(
    sites: Sequence[str], links_mbps: Mapping[tuple[str, str], float]
) -> tuple[Route, ...]:
    """Routes (with weights) for ``Plan.routes``, or () when direct sends do as well:
    fewer than 3 or more than ``MAX_SITES`` sites, or a gain under ``MIN_GAIN``."""
    ordered = sorted(set(sites))
    if not 3 <= len(ordered) <= MAX_SITES:
        return ()
    rates = _pair_rates(ordered, links_mbps)
    star = [(o, tuple(o for _ in ordered)) for o in ordered]
    direct = sum(_throughput(ordered, rates, star))
    routes = [(o, via) for o in ordered for via in _vias(ordered, o)]
    x = _throughput(ordered, rates, routes)
    total = sum(x)
    if total <= 0 or total < MIN_GAIN * direct:
        return ()
    top = max(x)
    chosen = [
        Route(owner, via, round(v / top, 4))
        for (owner, via), v in zip(routes, x, strict=True)
        if round(v / top, 4) > 0
    ]
    return tuple(chosen)
