"""Whether a peer gateway is there: up, degraded, unreachable or restarted.

Pure bookkeeping of when the peer was last heard (any datagram or control frame on any
path), when it restarted, and what state that makes; time comes in as ``now``. The
session acts on it (proto/delivery.md, "Peer liveness"): when the peer becomes
unreachable its messages fail, and submit refuses new ones until it is heard again.
"""

from __future__ import annotations

import math
from typing import Final

from wangate.core.states import PEER_TRANSITIONS, PeerStateKind, check_transition

DEFAULT_PEER_DEAD_S: Final = 5.0  # [limits] peer_dead_s
PEER_QUIET_S: Final = 1.0  # ten probe intervals without a word: the peer counts as degraded


class PeerLiveness:
    def __init__(self, peer_dead_s: float, now: float) -> None:
        self.peer_dead_s = peer_dead_s
        self.quiet_since = now  # silence counts from start-up until first heard
        self.last_heard_at: float | None = None
        self.restarted_at: float | None = None
        self.state = PeerStateKind.DEGRADED  # the last state reported
        self.unreachable = False  # declared: what was queued failed, submit refuses

    def move(self, state: PeerStateKind) -> bool:
        """Report ``state`` from now on; whether that changes it (``PEER_TRANSITIONS``)."""
        changed = check_transition(PEER_TRANSITIONS, self.state, state, "peer state")
        self.state = state
        return changed

    def heard(self, now: float) -> bool:
        """Anything arrived from the peer; True when that ends a declared outage."""
        self.last_heard_at = now
        if self.unreachable:
            self.unreachable = False
            return True
        return False

    def restarted(self, now: float) -> None:
        self.restarted_at = now
        self.heard(now)

    def silent_s(self, now: float) -> float:
        heard_at = self.last_heard_at
        return now - (self.quiet_since if heard_at is None else heard_at)

    def classify(self, now: float, paths_up: int, paths_total: int) -> PeerStateKind:
        """The state at ``now`` with ``paths_up`` of ``paths_total`` paths up (a question:
        nothing changes)."""
        silent_s = self.silent_s(now)
        if silent_s >= self.peer_dead_s:
            return PeerStateKind.UNREACHABLE
        if self.last_heard_at is None:
            return PeerStateKind.DEGRADED
        if self.restarted_at is not None and now - self.restarted_at < self.peer_dead_s:
            return PeerStateKind.RESTARTED
        if silent_s > PEER_QUIET_S:
            return PeerStateKind.DEGRADED
        return PeerStateKind.UP if paths_up >= paths_total else PeerStateKind.DEGRADED

    def silence_reason(self, now: float) -> str:
        silent_s = self.silent_s(now)
        if self.last_heard_at is None:
            return f"not heard from in {silent_s:.1f} s since start"
        return f"silent for {silent_s:.1f} s"

    def reason(
        self, now: float, paths_up: int, paths_total: int, state: PeerStateKind | None = None
    ) -> str:
        """Why the peer is in ``state`` (by default the one reported), for people."""
        state = self.state if state is None else state
        if state == PeerStateKind.UNREACHABLE:
            return self.silence_reason(now)
        if state == PeerStateKind.RESTARTED:
            assert self.restarted_at is not None
            return f"a new instance of the peer since {now - self.restarted_at:.1f} s"
        if self.last_heard_at is None:
            return "not connected yet"
        if self.silent_s(now) > PEER_QUIET_S:
            return self.silence_reason(now)
        others = "" if paths_up >= paths_total else ", the others degraded or down"
        return f"{paths_up} of {paths_total} paths up{others}"

    def next_change_at(self) -> float:
        """When the state may change with nothing heard meanwhile."""
        if self.unreachable:
            return math.inf
        heard_at = self.last_heard_at
        dead_at = (self.quiet_since if heard_at is None else heard_at) + self.peer_dead_s
        if self.restarted_at is not None and self.state == PeerStateKind.RESTARTED:
            return min(self.restarted_at + self.peer_dead_s, dead_at)
        if heard_at is not None and self.state == PeerStateKind.UP:
            return heard_at + PEER_QUIET_S
        return dead_at
