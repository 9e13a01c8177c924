"""Who owns which part of the tensor, how it is cut into chunks, and which algorithm runs.

A ``Plan`` is a pure value every site of a call must hold identically: the sorted site
names, one weight per site and, from a measured plan, all-gather routes (``Route``:
parts of the tensor whose reduced chunks some sites get through a relay). From it and
the tensor's element count each site derives the same contiguous shares (largest
remainder, in sorted site order), the same chunks and the same choice between
reduce-scatter/all-gather and a direct exchange. Its ``digest``
goes into every wire tag, so two sites holding different plans never mix their data: the
call fails with a timeout instead of returning a wrong sum (proto/collective.md).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from wangate.errors import LocalProtocolError

DEFAULT_CHUNK_BYTES = 1 << 20
# Bound inputs when nothing was measured: a WAN path of 100 Mbit/s and 30 ms one way.
DEFAULT_RATE_BPS = 100e6
DEFAULT_LATENCY_S = 0.030
MAX_WEIGHT = 1e6
MIN_CHUNK_BYTES = 1024
MAX_CHUNK_BYTES = 1 << 30
RELAYED_CHUNK_DIVISOR = 4


@dataclass(frozen=True)
class Share:
    """Elements [start, stop) of the flattened tensor, reduced by ``owner``."""

    owner: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Route:
    """A part of the tensor (``weight`` of it, among the plan's routes) reduced by
    ``owner``, whose reduced chunks reach the site ``sites[k]`` of the plan from
    ``via[k]``: the owner itself, or a site that received them from the owner and
    forwards them (one relay at most)."""

    owner: str
    via: tuple[str, ...]  # one per plan site, sorted order; the owner's entry is the owner
    weight: float

    def children(self, site: str, sites: Sequence[str]) -> tuple[str, ...]:
        """The sites that get this route's chunks from ``site``."""
        return tuple(s for s, v in zip(sites, self.via, strict=True) if v == site and s != site)


@dataclass(frozen=True)
class Plan:
    sites: tuple[str, ...]  # sorted, unique
    weights: tuple[float, ...]  # one per site, > 0
    rate_bps: float = DEFAULT_RATE_BPS  # per-site WAN rate the bound assumes
    latency_s: float = DEFAULT_LATENCY_S  # one-way delay the bound assumes
    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # pipelining unit; part of the plan: all cut alike
    # all-gather through relays: when set, these parts replace the weights' shares
    routes: tuple[Route, ...] = ()

    def __post_init__(self) -> None:
        if len(self.sites) < 1 or list(self.sites) != sorted(set(self.sites)):
            raise LocalProtocolError(f"plan sites must be sorted and unique: {self.sites}")
        if len(self.weights) != len(self.sites):
            raise LocalProtocolError("a plan needs one weight per site")
        for site, weight in zip(self.sites, self.weights, strict=True):
            if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
                raise LocalProtocolError(
                    f"weight of {site!r} is {weight}: it must be > 0 and <= {MAX_WEIGHT:g}"
                )
        if not (self.rate_bps > 0 and math.isfinite(self.rate_bps)):
            raise LocalProtocolError(f"plan rate {self.rate_bps} must be positive")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise LocalProtocolError(f"plan latency {self.latency_s} must not be negative")
        if not MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise LocalProtocolError(
                f"chunk_bytes {self.chunk_bytes} is out of range "
                f"({MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES})"
            )

        for route in self.routes:
            self._check_route(route)

    def _check_route(self, route: Route) -> None:
        sites = self.sites
        if route.owner not in sites or len(route.via) != len(sites):
            raise LocalProtocolError(f"route {route} does not fit the sites {list(sites)}")
        if not (math.isfinite(route.weight) and 0 < route.weight <= MAX_WEIGHT):
            raise LocalProtocolError(f"route weight {route.weight} must be > 0")
        via = dict(zip(sites, route.via, strict=True))
        for site, parent in via.items():
            if site == route.owner:
                ok = parent == route.owner
            else:
                ok = parent != site and parent in via and via[parent] == route.owner
            if not ok:
                raise LocalProtocolError(
                    f"route of {route.owner!r}: {site!r} cannot get its chunks from "
                    f"{parent!r} (the owner, or a site the owner sends to)"
                )

    @classmethod
    def equal(cls, sites: Sequence[str], **bound: Any) -> Plan:
        ordered = tuple(sorted(set(sites)))
        return cls(ordered, (1.0,) * len(ordered), **bound)

    @classmethod
    def weighted(cls, sites: Sequence[str], weights: Mapping[str, float], **bound: Any) -> Plan:
        """Weights by site name; a site left out of ``weights`` is an error."""
        ordered = tuple(sorted(set(sites)))
        missing = [s for s in ordered if s not in weights]
        if missing:
            raise LocalProtocolError(f"no collective weight for {', '.join(missing)}")
        return cls(ordered, tuple(float(weights[s]) for s in ordered), **bound)

    def restricted(self, sites: Sequence[str]) -> Plan:
        """The same weights over a subset of the sites (partial calls)."""
        keep = set(sites)
        unknown = keep - set(self.sites)
        if unknown:
            raise LocalProtocolError(f"sites {sorted(unknown)} are not in the plan")
        pairs = [(s, w) for s, w in zip(self.sites, self.weights, strict=True) if s in keep]
        return replace(
            self,
            sites=tuple(s for s, _ in pairs),
            weights=tuple(w for _, w in pairs),
            routes=(),
        )

    @property
    def digest(self) -> str:
        """8 hex digits naming this plan in wire tags (sites, weights, bound inputs)."""
        text = ";".join(f"{s}={w!r}" for s, w in zip(self.sites, self.weights, strict=True))
        text += f";{self.rate_bps!r};{self.latency_s!r};{self.chunk_bytes}"
        for r in self.routes:
            text += f";{r.owner}<{','.join(r.via)}={r.weight!r}"
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def shares(self, n_elements: int) -> list[Share]:
        """Contiguous shares in sorted site order, sizes proportional to the weights
        (largest remainder; ties go to the earlier site). Every site gets the same."""
        return _split(n_elements, self.sites, self.weights)

    @property
    def cut_bytes(self) -> int:
        """The chunk size the run cuts at: ``chunk_bytes``, or a quarter of it with routes
        (a relay passes a chunk on only once all of it came: smaller chunks wait less)."""
        if not self.routes:
            return self.chunk_bytes
        return max(MIN_CHUNK_BYTES, self.chunk_bytes // RELAYED_CHUNK_DIVISOR)

    def parts(self, n_elements: int) -> list[tuple[Share, Route | None]]:
        """The shares, each with its all-gather route (None: the owner sends to all).
        With routes: one contiguous part per route, in the routes' order, sized by their
        weights like ``shares``."""
        if not self.routes:
            return [(share, None) for share in self.shares(n_elements)]
        owners = tuple(r.owner for r in self.routes)
        split = _split(n_elements, owners, tuple(r.weight for r in self.routes))
        return list(zip(split, self.routes, strict=True))

    def direct(self, nbytes: int) -> bool:
        """True when one direct exchange (every site sends its whole tensor to every
        other, one WAN crossing) beats reduce-scatter + all-gather (two crossings).

        Per site, reduce-scatter/all-gather sends 2(n-1)/n of the tensor and waits for two
        one-way delays; the direct exchange sends (n-1) tensors and waits for one. Direct
        wins when (n-1)(1 - 2/n) * bytes / rate < latency. For n = 2 the byte counts are
        equal, so it always wins.
        """
        n = len(self.sites)
        if n <= 2:
            return True
        extra_s = (n - 1) * (1 - 2 / n) * nbytes * 8 / self.rate_bps
        return extra_s < self.latency_s


def _split(n_elements: int, owners: Sequence[str], weights: Sequence[float]) -> list[Share]:
    total = sum(weights)
    exact = [n_elements * w / total for w in weights]
    sizes = [math.floor(x) for x in exact]
    left = n_elements - sum(sizes)
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[:left]:
        sizes[i] += 1
    result, start = [], 0
    for owner, size in zip(owners, sizes, strict=True):
        result.append(Share(owner, start, start + size))
        start += size
    return result


def chunks(share: Share, itemsize: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[Share]:
    """``share`` cut into pieces of at most ``chunk_bytes`` (at least one element each)."""
    per = max(1, chunk_bytes // max(1, itemsize))
    return [
        Share(share.owner, start, min(start + per, share.stop))
        for start in range(share.start, share.stop, per)
    ]


def capacity_weights(rates_mbps: Mapping[str, float], floor: float = 0.05) -> dict[str, float]:
    """Weights from each site's capacity that let reduce-scatter/all-gather finish soonest,
    none below ``floor`` of the largest (a path that measured nothing yet must not leave
    its site without data to measure with).

    With ``n`` sites a site owning share ``s_i`` sends and receives ``S (1 + (n-2) s_i)``
    bytes, so at capacity ``C_i`` it needs time proportional to ``(1 + (n-2) s_i) / C_i``.
    The shares that minimise the slowest site's time make every site with a share finish
    together (water-filling): ``s_i = (t C_i - 1) / (n-2)`` with ``t`` set by
    ``sum s_i = 1``; a site too slow for even its own contribution gets none (then the
    floor). Shares merely proportional to capacity load fast sites too little: on three
    sites of 60, 60 and 40 Mbit/s they take 8.4 s where these take 6.7 s (equal: 9.0 s).
    Two sites (or fewer) exchange directly and need no shares: equal weights.
    """
    if not rates_mbps:
        return {}
    clean = {s: (r if math.isfinite(r) and r > 0 else 0.0) for s, r in rates_mbps.items()}
    n = len(clean)
    if max(clean.values()) <= 0 or n <= 2:
        return dict.fromkeys(clean, 1.0)
    shares: dict[str, float] = {}
    order = sorted(clean, key=lambda site: -clean[site])
    for k in range(n, 0, -1):  # the k fastest own shares; fewer if one comes out negative
        total = sum(clean[site] for site in order[:k])
        t = (n - 2 + k) / total
        shares = {site: (t * clean[site] - 1.0) / (n - 2) for site in order[:k]}
        if all(share >= 0.0 for share in shares.values()):
            break
    top = max(shares.values())
    return {site: round(max(shares.get(site, 0.0) / top, floor), 4) for site in clean}
