"""Whether a peer gateway is there: up, degraded, unreachable or restarted.

Pure bookkeeping of when the peer was last heard (any datagram or control frame on any
path), when it restarted, and what state that makes; time comes in as ``now``. The
session acts on it (proto/delivery.md, "Peer liveness"): when the peer becomes
unreachable its messages fail, and submit refuses new ones until it is heard again.
"""

from __future__ import annotations

import math

DEFAULT_PEER_DEAD_S = 5.0  # [limits] peer_dead_s
PEER_QUIET_S = 1.0  # ten probe intervals without a word: the peer counts as degraded
PEER_STATES = ("up", "degraded", "unreachable", "restarted")


class PeerLiveness:
    def __init__(self, peer_dead_s: float, now: float) -> None:
        self.peer_dead_s = peer_dead_s
        self.quiet_since = now  # silence counts from start-up until first heard
        self.last_heard_at: float | None = None
        self.restarted_at: float | None = None
        self.state = "degraded"  # the last state reported
        self.unreachable = False  # declared: what was queued failed, submit refuses

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

    def classify(self, now: float, paths_up: int, paths_total: int) -> str:
        silent_s = self.silent_s(now)
        if silent_s >= self.peer_dead_s:
            return "unreachable"
        if self.last_heard_at is None:
            return "degraded"
        if self.restarted_at is not None and now - self.restarted_at < self.peer_dead_s:
            return "restarted"
        if silent_s > PEER_QUIET_S:
            return "degraded"
        return "up" if paths_up >= paths_total else "degraded"

    def silence_reason(self, now: float) -> str:
        silent_s = self.silent_s(now)
        if self.last_heard_at is None:
            return f"not heard from in {silent_s:.1f} s since start"
        return f"silent for {silent_s:.1f} s"

    def reason(self, now: float, paths_up: int, paths_total: int) -> str:
        """Why the peer is in ``self.state``, for people."""
        state = self.state
        if state == "unreachable":
            return self.silence_reason(now)
        if state == "restarted":
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
        if self.restarted_at is not None and self.state == "restarted":
            return min(self.restarted_at + self.peer_dead_s, dead_at)
        if heard_at is not None and self.state == "up":
            return heard_at + PEER_QUIET_S
        return dead_at
