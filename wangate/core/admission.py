"""Who may start a QUIC handshake with the listener, and for how long.

A connection that has sent an Initial but has not yet authenticated as a configured
site is *half-open*: it holds a TLS context, crypto state and buffers (tens of KiB)
for someone who has proved nothing but an address. Address validation (QUIC Retry,
RFC 9000 §8.1.2) keeps spoofed sources from creating any; this bounds what validated
sources can hold:

* at most ``max_half_open`` half-open connections in all, and at most
  ``max_half_open_per_source`` from one IP address (RFC 9000 §21.6: servers limit the
  state they commit before a handshake completes);
* each must authenticate within ``handshake_timeout_s`` of its first Initial, or it
  is closed and forgotten.

Crypto work for sources that have proved nothing (a Retry, checking a Retry token) and
other stateless answers (Version Negotiation) cost CPU and bandwidth, so they come from
a token bucket: under a flood the excess is dropped unanswered (a real client repeats
its Initial after a probe timeout, RFC 9002 §6.2.4).

Addresses that peers have authenticated from before (the last ``known_sources``) are
kept apart: they get answers from a bucket of their own and are not held to the total
cap, so a peer reconnects while strangers flood. Forging such an address gains an
attacker nothing but that bucket: the Retry goes to the real peer, never to him.

Pure: time comes in as ``now``; the caller closes what :meth:`expire` returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from wangate.errors import LocalProtocolError

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class AdmissionLimits:
    max_half_open: int = 64
    max_half_open_per_source: int = 8
    handshake_timeout_s: float = 5.0
    # crypto work for unvalidated sources: a Retry costs ~80 us of CPU, so this is at
    # most ~2 % of a core however fast the flood; a handful of paths needs far less
    responses_per_s: float = 200.0
    response_burst: int = 50
    known_responses_per_s: float = 100.0  # the same, for addresses peers came from
    known_response_burst: int = 20
    known_sources: int = 256

    def __post_init__(self) -> None:
        if self.max_half_open < 1 or self.max_half_open_per_source < 1:
            raise LocalProtocolError("half-open caps must be at least 1")
        if self.handshake_timeout_s <= 0 or self.responses_per_s <= 0:
            raise LocalProtocolError("handshake timeout and response rate must be positive")
        if self.response_burst < 1 or self.known_response_burst < 1:
            raise LocalProtocolError("response bursts must be at least 1")
        if self.known_responses_per_s <= 0 or self.known_sources < 0:
            raise LocalProtocolError("known-source rate must be positive, count not negative")


@dataclass(frozen=True)
class Refusal:
    """Why a new connection was not admitted (for counters and the log)."""

    reason: str  # "total" or "source"
    source: str


class HandshakeAdmission(Generic[Key]):
    """Half-open connections by key (the connection), with their source and deadline."""

    def __init__(self, limits: AdmissionLimits, now: float) -> None:
        self.limits = limits
        # insertion order is deadline order: every entry gets the same timeout
        self._deadlines: dict[Key, tuple[str, float]] = {}
        self._per_source: dict[str, int] = {}  # no zero entries: bounded by max_half_open
        self._strangers = _TokenBucket(limits.responses_per_s, limits.response_burst, now)
        self._known_bucket = _TokenBucket(
            limits.known_responses_per_s, limits.known_response_burst, now
        )
        self._known: OrderedDict[str, None] = OrderedDict()  # least recently seen first
        self.admitted = 0
        self.established_count = 0
        self.timed_out = 0
        self.refused_total = 0  # refused because the total cap was reached
        self.refused_source = 0  # refused because the source's cap was reached
        self.responses_dropped = 0

    # ---- half-open connections ---------------------------------------------------------

    @property
    def half_open(self) -> int:
        return len(self._deadlines)

    def half_open_from(self, source: str) -> int:
        return self._per_source.get(source, 0)

    def refusal(self, source: str) -> Refusal | None:
        """Whether a new connection from ``source`` would go over a cap (and is counted
        as refused if so); check before building anything for it."""
        if len(self._deadlines) >= self.limits.max_half_open and source not in self._known:
            self.refused_total += 1
            return Refusal("total", source)
        if self._per_source.get(source, 0) >= self.limits.max_half_open_per_source:
            self.refused_source += 1
            return Refusal("source", source)
        return None

    def add(self, key: Key, source: str, now: float) -> None:
        """Count ``key`` as half-open from ``source`` until it authenticates or goes."""
        if key in self._deadlines:
            raise LocalProtocolError("connection admitted twice")
        if self.refusal(source) is not None:
            raise LocalProtocolError(f"no room for a half-open connection from {source}")
        self._deadlines[key] = (source, now + self.limits.handshake_timeout_s)
        self._per_source[source] = self._per_source.get(source, 0) + 1
        self.admitted += 1

    def is_half_open(self, key: Key) -> bool:
        return key in self._deadlines

    def established(self, key: Key) -> None:
        """``key`` authenticated: it no longer counts against any cap, and its source
        becomes a known one."""
        entry = self._deadlines.get(key)
        if entry is None:
            return
        self._forget(key)
        self.established_count += 1
        self._known[entry[0]] = None
        self._known.move_to_end(entry[0])
        while len(self._known) > self.limits.known_sources:
            self._known.popitem(last=False)

    def is_known(self, source: str) -> bool:
        return source in self._known

    def closed(self, key: Key) -> None:
        """``key`` went away before authenticating (refused, or closed by its peer)."""
        self._forget(key)

    def expire(self, now: float) -> list[Key]:
        """The half-open connections whose time is up, forgotten here; close them."""
        expired: list[Key] = []
        for key, (_, deadline) in self._deadlines.items():
            if deadline > now:
                break
            expired.append(key)
        for key in expired:
            self._forget(key)
        self.timed_out += len(expired)
        return expired

    def get_timer(self) -> float | None:
        """When :meth:`expire` next has something to return."""
        for _, deadline in self._deadlines.values():
            return deadline
        return None

    def _forget(self, key: Key) -> bool:
        entry = self._deadlines.pop(key, None)
        if entry is None:
            return False
        source = entry[0]
        left = self._per_source[source] - 1
        if left:
            self._per_source[source] = left
        else:
            del self._per_source[source]
        return True

    # ---- stateless answers -------------------------------------------------------------

    def may_respond(self, source: str, now: float, *, peek: bool = False) -> bool:
        """Whether a stateless answer to ``source`` may be sent now (taking a token,
        unless ``peek``; a refusal is counted either way)."""
        bucket = self._known_bucket if source in self._known else self._strangers
        if bucket.take(now, peek=peek):
            return True
        self.responses_dropped += 1
        return False


class _TokenBucket:
    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self._tokens = float(burst)
        self._refilled_at = now

    def take(self, now: float, *, peek: bool = False) -> bool:
        elapsed_s = max(0.0, now - self._refilled_at)
        self._refilled_at = now
        self._tokens = min(self.burst, self._tokens + elapsed_s * self.rate_per_s)
        if self._tokens >= 1.0:
            if not peek:
                self._tokens -= 1.0
            return True
        return False
