"""One direction of one emulated path: a pure, seeded packet scheduler.

No I/O and no clock: the caller passes ``now`` (seconds, any monotonic origin).
A packet goes through, in order:

1. blackhole - everything pushed is dropped (packets already in flight still arrive);
2. bottleneck - rate limit with a bounded FIFO queue; a packet that would make the
   backlog (bytes not yet serialised, the one on the wire included) exceed the
   bound is tail-dropped; otherwise it leaves when its last bit is serialised;
3. random loss, then Gilbert-Elliott bursty loss - "on the wire", so a lost
   packet has used its share of the rate, as on a real lossy link;
4. propagation - one-way delay plus jitter (normal, sd ``jitter_ms``, the sum
   clamped at 0). Jitter keeps FIFO order: a packet never overtakes the one
   before it (that is what ``reorder`` is for);
5. reordering - with probability ``reorder`` a packet is held back a further
   ``reorder_ms`` and so is overtaken by the ones behind it;
6. duplication - with probability ``duplicate`` a second copy arrives with it.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import asdict, dataclass, fields

from wangate.lab.gilbert import GilbertElliott, GilbertElliottParams

DEFAULT_QUEUE_MS = 50.0
MIN_QUEUE_BYTES = 3000  # two full-size packets: a bound below that drops everything


@dataclass(frozen=True)
class LinkParams:
    """Parameters of one path direction. Rates in Mbit/s (0 = unlimited)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    ge_p: float = 0.0
    ge_r: float = 1.0
    ge_loss_in_good: float = 0.0
    ge_loss_in_bad: float = 1.0
    rate_mbps: float = 0.0
    queue_bytes: int | None = None
    queue_ms: float | None = None
    reorder: float = 0.0
    reorder_ms: float = 10.0
    duplicate: float = 0.0
    blackhole: bool = False

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms", "rate_mbps", "reorder_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in (
            "loss",
            "ge_p",
            "ge_r",
            "ge_loss_in_good",
            "ge_loss_in_bad",
            "reorder",
            "duplicate",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
        if self.queue_bytes is not None and self.queue_bytes < 0:
            raise ValueError("queue_bytes must be >= 0")
        if self.queue_ms is not None and not (math.isfinite(self.queue_ms) and self.queue_ms >= 0):
            raise ValueError("queue_ms must be a finite number >= 0")

    @property
    def rate_bps(self) -> float:
        return self.rate_mbps * 1e6

    @property
    def queue_limit_bytes(self) -> int:
        """Backlog bound at the bottleneck; ``queue_bytes`` wins over ``queue_ms``."""
        if self.queue_bytes is not None:
            return self.queue_bytes
        queue_ms = DEFAULT_QUEUE_MS if self.queue_ms is None else self.queue_ms
        return max(MIN_QUEUE_BYTES, int(queue_ms / 1000.0 * self.rate_bps / 8.0))

    @property
    def gilbert_elliott(self) -> GilbertElliottParams:
        return GilbertElliottParams(self.ge_p, self.ge_r, self.ge_loss_in_good, self.ge_loss_in_bad)

    def updated(self, changes: dict[str, object]) -> LinkParams:
        """A copy with some fields changed (unknown names raise ValueError)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown link parameter(s): {', '.join(unknown)}")
        merged = asdict(self)
        merged.update(changes)
        return LinkParams(**merged)


@dataclass
class LinkStats:
    pushed_packets: int = 0
    pushed_bytes: int = 0
    delivered_packets: int = 0
    delivered_bytes: int = 0
    dropped_blackhole: int = 0
    dropped_queue: int = 0
    dropped_loss: int = 0
    dropped_burst: int = 0
    reordered: int = 0
    duplicated: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _Rngs:
    loss: random.Random
    burst: random.Random
    jitter: random.Random
    reorder: random.Random
    duplicate: random.Random

    @classmethod
    def seeded(cls, seed: str) -> _Rngs:
        # One stream per mechanism, so enabling jitter does not change the loss pattern.
        return cls(*(random.Random(f"{seed}/{f.name}") for f in fields(cls)))


class LinkEmulator:
    """One path direction. ``push`` packets in, ``pop_ready`` them out when due."""

    def __init__(self, params: LinkParams, seed: str | int = 0) -> None:
        self.params = params
        self.stats = LinkStats()
        self._rng = _Rngs.seeded(str(seed))
        self._ge = GilbertElliott(params.gilbert_elliott, self._rng.burst)
        self._busy_until = -math.inf  # when the bottleneck finishes its backlog
        self._last_arrival = -math.inf  # FIFO floor for jittered packets
        self._sequence = 0
        self._in_flight: list[tuple[float, int, bytes]] = []
        self._queue_limit = params.queue_limit_bytes
        self._rate_bytes_per_s = params.rate_bps / 8.0
        self._delay_s = params.delay_ms / 1000.0
        self._jitter_s = params.jitter_ms / 1000.0

    def apply(self, params: LinkParams, now: float) -> None:
        """Change parameters from ``now`` on; packets already scheduled keep their times."""
        del now  # changes are instantaneous; kept for a uniform driver interface
        if params.gilbert_elliott != self.params.gilbert_elliott:
            self._ge.params = params.gilbert_elliott
        self.params = params
        self._queue_limit = params.queue_limit_bytes
        self._rate_bytes_per_s = params.rate_bps / 8.0
        self._delay_s = params.delay_ms / 1000.0
        self._jitter_s = params.jitter_ms / 1000.0

    def backlog_bytes(self, now: float) -> float:
        """Bytes at the bottleneck not yet serialised at ``now``."""
        if self._rate_bytes_per_s <= 0.0 or self._busy_until <= now:
            return 0.0
        return (self._busy_until - now) * self._rate_bytes_per_s

    def push(self, packet: bytes, now: float) -> None:
        params = self.params
        stats = self.stats
        size = len(packet)
        stats.pushed_packets += 1
        stats.pushed_bytes += size
        if params.blackhole:
            stats.dropped_blackhole += 1
            return
        rate = self._rate_bytes_per_s
        if rate > 0.0:
            if self.backlog_bytes(now) + size > self._queue_limit:
                stats.dropped_queue += 1
                return
            start = self._busy_until if self._busy_until > now else now
            leave = start + size / rate
            self._busy_until = leave
        else:
            leave = now
        if params.loss > 0.0 and self._rng.loss.random() < params.loss:
            stats.dropped_loss += 1
            return
        if self._ge.params.enabled and self._ge.lose():
            stats.dropped_burst += 1
            return
        delay = self._delay_s
        if self._jitter_s > 0.0:
            delay = max(0.0, delay + self._rng.jitter.gauss(0.0, self._jitter_s))
        arrival = leave + delay
        if arrival < self._last_arrival:
            arrival = self._last_arrival
        self._last_arrival = arrival
        if params.reorder > 0.0 and self._rng.reorder.random() < params.reorder:
            arrival += params.reorder_ms / 1000.0
            stats.reordered += 1
        self._schedule(arrival, packet)
        if params.duplicate > 0.0 and self._rng.duplicate.random() < params.duplicate:
            stats.duplicated += 1
            self._schedule(arrival, packet)

    def _schedule(self, arrival: float, packet: bytes) -> None:
        self._sequence += 1
        heapq.heappush(self._in_flight, (arrival, self._sequence, packet))

    def next_deadline(self) -> float | None:
        """When the next packet is due, or None when nothing is in flight."""
        return self._in_flight[0][0] if self._in_flight else None

    def pop_ready(self, now: float) -> list[bytes]:
        """Packets due at or before ``now``, in arrival order."""
        ready: list[bytes] = []
        in_flight = self._in_flight
        while in_flight and in_flight[0][0] <= now:
            packet = heapq.heappop(in_flight)[2]
            ready.append(packet)
        if ready:
            self.stats.delivered_packets += len(ready)
            self.stats.delivered_bytes += sum(len(p) for p in ready)
        return ready

    def in_flight_packets(self) -> int:
        return len(self._in_flight)
