"""Time bounds for an allreduce over sites joined pairwise by WAN links (pure).

Reduce-scatter then all-gather with shares ``s_i`` (sum 1) of a tensor of ``S`` bytes
over ``N`` sites: in the reduce-scatter site ``i`` sends every other site ``j`` its
share ``s_j S`` and receives ``s_i S`` from each; in the all-gather it sends its reduced
``s_i S`` to each of the ``N - 1`` others and receives theirs. So each site moves

    out_i = in_i = S (1 - s_i) + S (N - 1) s_i = S (1 + (N - 2) s_i)

bytes each way, and no schedule finishes before

    T_site(s) = max_i 8 S (1 + (N - 2) s_i) / C_i

where ``C_i`` is the least of what site ``i``'s links carry out of and into it (bit/s,
the sum over its links). Capacity-weighted shares are ``s_i = C_i / sum C``. With
direct exchanges only (no relaying through a third site) the link between ``i`` and
``j`` carries ``(s_i + s_j) S`` each way, so also

    T_link(s) = max_{i<j} 8 S (s_i + s_j) / c_ij.

Gloo's ring (equal shares, one link per site in each direction) sends ``2 (N-1)/N S``
over each ring link: ``T_ring = 8 S 2 (N - 1) / N / min(ring link rate)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def site_capacities_bps(links_bps: Mapping[tuple[str, str], float]) -> dict[str, float]:
    """Per site: the least of its total outgoing and total incoming link rate.

    ``links_bps[(a, b)]`` is the rate from ``a`` to ``b`` (sum of the paths)."""
    out: dict[str, float] = {}
    into: dict[str, float] = {}
    for (a, b), rate in links_bps.items():
        out[a] = out.get(a, 0.0) + rate
        into[b] = into.get(b, 0.0) + rate
        out.setdefault(b, 0.0)
        into.setdefault(a, 0.0)
    return {site: min(out[site], into[site]) for site in out}


def capacity_shares(capacities_bps: Mapping[str, float]) -> dict[str, float]:
    total = sum(capacities_bps.values())
    return {site: c / total for site, c in capacities_bps.items()}


def equal_shares(sites: Sequence[str]) -> dict[str, float]:
    return {site: 1.0 / len(sites) for site in sites}


def site_bytes(size_bytes: int, shares: Mapping[str, float]) -> dict[str, float]:
    """Bytes each site sends (and receives) in reduce-scatter + all-gather."""
    n = len(shares)
    return {site: size_bytes * (1.0 + (n - 2) * s) for site, s in shares.items()}


def site_bound_s(
    size_bytes: int, capacities_bps: Mapping[str, float], shares: Mapping[str, float]
) -> float:
    """T_site: the slowest site's bytes over its link capacity."""
    moved = site_bytes(size_bytes, shares)
    return max(8.0 * moved[site] / capacities_bps[site] for site in shares)


def link_bound_s(
    size_bytes: int, links_bps: Mapping[tuple[str, str], float], shares: Mapping[str, float]
) -> float:
    """T_link: direct exchanges only; the busiest link direction over its rate."""
    return max(
        8.0 * size_bytes * (shares[a] + shares[b]) / rate for (a, b), rate in links_bps.items()
    )


def best_site_shares(capacities_bps: Mapping[str, float]) -> dict[str, float]:
    """The shares that minimise T_site (water-filling: every site with a share
    finishes together; a site too slow for even its own ``S`` gets none)."""
    sites = list(capacities_bps)
    n = len(sites)
    if n <= 2:
        return equal_shares(sites)
    # T C_i / (8 S) = 1 + (N - 2) s_i for sites with s_i > 0. Try the k fastest.
    order = sorted(sites, key=lambda site: capacities_bps[site], reverse=True)
    for k in range(n, 0, -1):
        chosen = order[:k]
        total = sum(capacities_bps[site] for site in chosen)
        # sum s_i = 1 over chosen: (T/8S) total - k = N - 2
        t_unit = (n - 2 + k) / total
        shares = {site: (t_unit * capacities_bps[site] - 1.0) / (n - 2) for site in chosen}
        if all(share >= 0.0 for share in shares.values()):
            return {site: shares.get(site, 0.0) for site in sites}
    raise AssertionError("unreachable: one site alone always has share 1")


def ring_bound_s(size_bytes: int, ring_rates_bps: Sequence[float]) -> float:
    """Gloo's ring allreduce: ``2 (N-1)/N S`` over each ring link, the slowest decides."""
    n = len(ring_rates_bps)
    return 8.0 * size_bytes * 2.0 * (n - 1) / n / min(ring_rates_bps)
