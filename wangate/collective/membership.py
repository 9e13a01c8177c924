"""Who contributes to a ``partial=True`` call: joins, then the leader's word.

1. Every site sends ``join`` to every other site of the call and collects joins until
   all arrived or its join window (half the call's timeout) closes. Present = itself plus
   the sites it heard from.
2. The leader is the lowest-named present site. The leader's present set is the
   membership: it sends a ``plan`` (one weight per call site, 0 for a site left out) to
   every member. A non-leader waits for the plan of the site it takes for leader.
3. The members run the allreduce under that plan, whose digest is in every tag.

A site that was late, or took another site for leader, never receives a plan it belongs
to, or runs under a plan digest no one else uses: it times out with an error. So every
site that returns used the same plan, received the same reduced bytes from the same
owners, and returns the same array and the same contributors; the others raise.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from wangate.errors import LocalProtocolError

from .exchange import CollectiveError, CollectiveMismatch, Expected, Outgoing
from .plan import Plan
from .tags import check_collective_tag, wire_tag

_JOIN = np.ones(1, dtype=np.uint8)


class Membership:
    def __init__(self, *, site: str, plan: Plan, tag: str) -> None:
        check_collective_tag(tag)
        if site not in plan.sites:
            raise LocalProtocolError(f"this site {site!r} is not among {list(plan.sites)}")
        self.site, self.plan, self.tag = site, plan, tag
        self.peers = tuple(s for s in plan.sites if s != site)
        names = Plan.equal(plan.sites).digest
        self.join_tag = wire_tag("jn", names, 0, tag)
        self.plan_tag = wire_tag("pl", names, 0, tag)
        self.present: set[str] = {site}

    def start(self) -> list[Outgoing]:
        return [Outgoing.small(self.peers, self.join_tag, _JOIN, True)] if self.peers else []

    def joins_wanted(self) -> list[Expected]:
        return [Expected(p, self.join_tag) for p in self.peers if p not in self.present]

    def joined(self, source: str) -> None:
        if source not in self.peers:
            raise LocalProtocolError(f"join from {source!r}, not a site of this call")
        self.present.add(source)

    @property
    def leader(self) -> str:
        return min(self.present)

    def decide(self) -> tuple[Plan, list[Outgoing]]:
        """As leader, after the join window: the members' plan and the plan message."""
        assert self.leader == self.site
        members = sorted(self.present)
        plan = self.plan.restricted(members)
        weights = np.array(
            [plan.weights[members.index(s)] if s in self.present else 0.0 for s in self.plan.sites],
            dtype=np.float64,
        )
        others = tuple(s for s in members if s != self.site)
        return plan, [Outgoing.small(others, self.plan_tag, weights, True)] if others else []

    def accept(self, source: str, weights: np.ndarray) -> Plan:
        """As a member, the leader's plan message; raises if it leaves this site out."""
        values = weights.reshape(-1)
        if weights.dtype != np.float64 or values.size != len(self.plan.sites):
            raise CollectiveMismatch(
                f"partial {self.tag!r}: {source} sent a plan for other sites "
                "(do all sites pass the same sites=?)"
            )
        chosen = [float(w) for w in values]
        if not all(math.isfinite(w) and w >= 0 for w in chosen):
            raise CollectiveMismatch(f"partial {self.tag!r}: malformed plan from {source}")
        members = [s for s, w in zip(self.plan.sites, chosen, strict=True) if w > 0]
        if self.site not in members or source not in members:
            raise CollectiveError(
                f"partial {self.tag!r}: {source} left {self.site} out of this step "
                "(it arrived after the join window); it joins again at a later step"
            )
        return replace(self.plan, sites=tuple(members), weights=tuple(w for w in chosen if w > 0))
