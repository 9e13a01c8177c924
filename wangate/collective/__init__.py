"""Cross-site collectives (allreduce, broadcast, barrier) over tagged messages.

The pure parts (plan and partition, chunking, the reduction, the partial-membership
agreement) are sans-IO; ``driver`` moves their messages through a client. Format and
semantics: proto/collective.md.
"""

from __future__ import annotations

from .allreduce import AllreduceRun
from .api import CollectiveState, PartialResult
from .exchange import CollectiveError, CollectiveMismatch, CollectiveTimeout, Expected, Outgoing
from .feedback import HopFeedback
from .membership import Membership
from .plan import Plan, Share, capacity_weights, chunks
from .small import BarrierRun, BroadcastRun
from .tags import PREFIX, check_user_tag

__all__ = [
    "PREFIX",
    "AllreduceRun",
    "BarrierRun",
    "BroadcastRun",
    "CollectiveError",
    "CollectiveMismatch",
    "CollectiveState",
    "CollectiveTimeout",
    "Expected",
    "HopFeedback",
    "Membership",
    "Outgoing",
    "PartialResult",
    "Plan",
    "Share",
    "capacity_weights",
    "check_user_tag",
    "chunks",
]
