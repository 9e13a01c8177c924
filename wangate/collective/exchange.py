"""What a collective run hands its driver: messages to send and messages it waits for.

A run is sans-IO, like the protocol core: ``start()`` and ``receive()`` return
``Outgoing`` messages already encoded (one encode for any number of peers), ``wanted()``
lists the messages it still waits for in the order a sequential driver should ask for
them, and ``arrivals()`` reports what came from whom, for the timeout error.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from wangate.checksum import checksum_with_prefix
from wangate.codec import EncodedTensor, encode_tensor
from wangate.errors import CollectiveError, CollectiveMismatch, CollectiveTimeout

__all__ = [
    "Arrivals",
    "CollectiveError",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "Expected",
    "Outgoing",
]


@dataclass(frozen=True)
class Outgoing:
    peers: tuple[str, ...]
    tag: str
    meta: bytes
    payload: memoryview
    checksum: int
    critical: bool

    @classmethod
    def of(
        cls, peers: tuple[str, ...], tag: str, encoded: EncodedTensor, critical: bool
    ) -> Outgoing:
        meta = bytes(encoded.meta)
        payload = memoryview(encoded.payload).cast("B")
        checksum = checksum_with_prefix(meta, encoded.payload_crc, payload.nbytes)
        return cls(peers, tag, meta, payload, checksum, critical)

    @classmethod
    def small(
        cls, peers: tuple[str, ...], tag: str, values: np.ndarray, critical: bool
    ) -> Outgoing:
        return cls.of(peers, tag, encode_tensor(np.ascontiguousarray(values)), critical)


@dataclass(frozen=True)
class Expected:
    source: str
    tag: str


@dataclass
class Arrivals:
    """Who was expected and what came, for error messages."""

    expected_from: tuple[str, ...]
    counts: Counter[str] = field(default_factory=Counter)

    def note(self, source: str) -> None:
        self.counts[source] += 1

    def timeout(
        self, what: str, site: str, timeout_s: float, still: list[Expected]
    ) -> CollectiveTimeout:
        waiting = sorted({e.source for e in still})
        missing = tuple(s for s in waiting if self.counts[s] == 0)
        partial = [s for s in waiting if self.counts[s] > 0]
        parts = []
        if missing:
            parts.append(f"nothing arrived from {', '.join(missing)}")
        for s in partial:
            left = sum(1 for e in still if e.source == s)
            parts.append(f"{self.counts[s]} of {self.counts[s] + left} messages from {s}")
        done = [s for s in self.expected_from if s not in waiting]
        if done:
            parts.append(f"complete from {', '.join(done)}")
        message = (
            f"{what} at {site} timed out after {timeout_s:g} s: {'; '.join(parts)} "
            "(did those sites call it with the same tag, step and sites?)"
        )
        return CollectiveTimeout(message, missing, dict(self.counts))
