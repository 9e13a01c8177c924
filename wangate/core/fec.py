"""Forward error correction for shards: systematic Reed-Solomon blocks over zfec.

A *block* is ``k`` source symbols of ``symbol_bytes`` each. Source symbols go on the
wire unchanged (systematic code, indices ``0..k-1``); repair symbols have indices
``k..MAX_SYMBOLS-1`` and any ``k`` distinct symbols of a block rebuild all of it
(MDS code, RFC 5510 §8 in spirit, as Tetrys/RFC 9407 use it for QUIC).

Padding rule: a source symbol shorter than ``symbol_bytes`` (the last piece of a
message) is zero-padded here, on both sides, and coded as if full. The receiver knows
the true length from the message header and trims what ``recover`` returns.

zfec's generator rows depend only on the row index, not on the total count it was
built for, so every encoder and decoder here is built for ``MAX_SYMBOLS`` and any
repair index below it works without agreeing on a parity count in advance. Encoder
and decoder objects are cached per ``k``.

``parity_for_loss`` picks the repair count from the binomial tail.
"""

from __future__ import annotations

import math
from functools import cache, lru_cache
from typing import Final

import zfec

from wangate.core.buffer import Buffer
from wangate.errors import LocalProtocolError

MAX_SYMBOLS: Final = 256  # GF(2^8): at most 256 distinct symbols per block


@cache
def _encoder(k: int) -> zfec.Encoder:
    return zfec.Encoder(k, MAX_SYMBOLS)


@cache
def _decoder(k: int) -> zfec.Decoder:
    return zfec.Decoder(k, MAX_SYMBOLS)


def _check_shape(k: int, symbol_bytes: int) -> None:
    if not 1 <= k < MAX_SYMBOLS:
        raise LocalProtocolError(f"a block needs 1..{MAX_SYMBOLS - 1} source symbols, not {k}")
    if symbol_bytes < 1:
        raise LocalProtocolError(f"symbol size must be positive, not {symbol_bytes}")


def _symbol(data: Buffer, symbol_bytes: int, index: int) -> bytes | memoryview:
    """``data`` as one full symbol: a view when it already is one, else a padded copy."""
    view = memoryview(data).cast("B")
    if len(view) == symbol_bytes:
        return view
    if len(view) > symbol_bytes:
        raise LocalProtocolError(
            f"symbol {index} is {len(view)} bytes, more than the block's {symbol_bytes}"
        )
    return bytes(view) + bytes(symbol_bytes - len(view))


class BlockEncoder:
    """The sending side of one block.

    Holds references to the source buffers (no copy unless padding is needed): the
    caller must not change them until the block's repair symbols are no longer needed.
    """

    __slots__ = ("_missing", "_repairs", "_sources", "k", "symbol_bytes")

    def __init__(self, k: int, symbol_bytes: int) -> None:
        _check_shape(k, symbol_bytes)
        self.k = k
        self.symbol_bytes = symbol_bytes
        self._sources: list[bytes | memoryview | None] = [None] * k
        self._missing = k
        self._repairs: dict[int, bytes] = {}

    @property
    def max_repair(self) -> int:
        """How many distinct repair symbols this block can have."""
        return MAX_SYMBOLS - self.k

    @property
    def complete(self) -> bool:
        return self._missing == 0

    def add_source(self, index: int, data: Buffer) -> None:
        """Source symbol ``index`` (0..k-1); a short one is zero-padded."""
        if not 0 <= index < self.k:
            raise LocalProtocolError(f"source index {index} outside 0..{self.k - 1}")
        if self._sources[index] is not None:
            raise LocalProtocolError(f"source symbol {index} given twice")
        self._sources[index] = _symbol(data, self.symbol_bytes, index)
        self._missing -= 1

    def repair(self, index: int) -> bytes:
        """Repair symbol ``index`` (k..MAX_SYMBOLS-1), computed on first use and kept."""
        cached = self._repairs.get(index)
        if cached is not None:
            return cached
        return self.repairs(range(index, index + 1))[0]

    def repairs(self, indices: range | list[int]) -> list[bytes]:
        """Several repair symbols in one pass over the sources (cheaper than one by one)."""
        wanted = tuple(i for i in indices if i not in self._repairs)
        for index in wanted:
            if not self.k <= index < MAX_SYMBOLS:
                raise LocalProtocolError(
                    f"repair index {index} outside {self.k}..{MAX_SYMBOLS - 1}"
                )
        if wanted:
            if self._missing:
                raise LocalProtocolError(
                    f"block has {self._missing} of {self.k} source symbols still missing"
                )
            for index, symbol in zip(
                wanted, _encoder(self.k).encode(tuple(self._sources), wanted), strict=True
            ):
                self._repairs[index] = symbol
        return [self._repairs[i] for i in indices]


class BlockDecoder:
    """The receiving side of one block: collects symbols, rebuilds missing sources.

    Keeps references to what ``add`` is given (no copy unless padding is needed).
    """

    __slots__ = ("_recovered", "_symbols", "k", "symbol_bytes")

    def __init__(self, k: int, symbol_bytes: int) -> None:
        _check_shape(k, symbol_bytes)
        self.k = k
        self.symbol_bytes = symbol_bytes
        self._symbols: dict[int, bytes | memoryview] = {}
        self._recovered: dict[int, bytes] | None = None

    @property
    def can_decode(self) -> bool:
        return len(self._symbols) >= self.k

    @property
    def symbol_count(self) -> int:
        """Distinct symbols stored so far."""
        return len(self._symbols)

    def add(self, index: int, data: Buffer) -> bool:
        """Store symbol ``index``; True once any ``k`` distinct symbols are here.

        A duplicate index is ignored, and so is a repair symbol once ``k`` symbols are
        here. A source symbol may be short (zero-padded); a repair symbol must be
        exactly ``symbol_bytes``.
        """
        if not 0 <= index < MAX_SYMBOLS:
            raise LocalProtocolError(f"symbol index {index} outside 0..{MAX_SYMBOLS - 1}")
        symbols = self._symbols
        if index in symbols or (index >= self.k and len(symbols) >= self.k):
            return len(symbols) >= self.k
        if index >= self.k and memoryview(data).nbytes != self.symbol_bytes:
            raise LocalProtocolError(
                f"repair symbol {index} is {memoryview(data).nbytes} bytes, the block's "
                f"are {self.symbol_bytes}"
            )
        symbols[index] = _symbol(data, self.symbol_bytes, index)
        return len(symbols) >= self.k

    def missing_sources(self) -> list[int]:
        """Source indices not received (whether or not they can be recovered yet)."""
        return [i for i in range(self.k) if i not in self._symbols]

    def recover(self) -> dict[int, bytes]:
        """The missing source symbols, each ``symbol_bytes`` long (padding included)."""
        if self._recovered is not None:
            return self._recovered
        if len(self._symbols) < self.k:
            raise LocalProtocolError(
                f"cannot decode: {len(self._symbols)} of the {self.k} symbols needed"
            )
        missing = self.missing_sources()
        if not missing:
            self._recovered = {}
            return self._recovered
        # exactly k symbols: every source we have, then repairs to make up the rest
        chosen = sorted(self._symbols)[: self.k]
        decoded = _decoder(self.k).decode(tuple(self._symbols[i] for i in chosen), tuple(chosen))
        self._recovered = {i: decoded[i] for i in missing}
        return self._recovered


# ---------------------------------------------------------------- parity count


def block_loss_probability(loss_rate: float, k: int, m: int) -> float:
    """P(more than ``m`` of ``k + m`` symbols lost), each lost independently.

    The exact binomial tail, summed in log space so tiny terms do not underflow early.
    """
    n = k + m
    if loss_rate <= 0.0:
        return 0.0
    if loss_rate >= 1.0:
        return 1.0
    log_p = math.log(loss_rate)
    log_q = math.log1p(-loss_rate)
    total = 0.0
    for lost in range(m + 1, n + 1):
        log_term = (
            math.lgamma(n + 1)
            - math.lgamma(lost + 1)
            - math.lgamma(n - lost + 1)
            + lost * log_p
            + (n - lost) * log_q
        )
        total += math.exp(log_term)
    return min(total, 1.0)


LOSS_RATE_QUANTUM: Final = 1e-4  # loss estimates are noisy: cache per 0.01 %


def parity_for_loss(
    loss_rate: float,
    k: int,
    *,
    target_block_loss: float = 1e-3,
    floor: int = 0,
    ceiling: int = 16,
) -> int:
    """Fewest repair symbols ``m`` with P(block undecodable) < ``target_block_loss``.

    Independent loss at ``loss_rate`` (rounded up to ``LOSS_RATE_QUANTUM``); the answer
    is clamped to ``[floor, ceiling]`` (and to what a block can carry).
    """
    if k < 1 or floor < 0 or ceiling < floor or not 0.0 < target_block_loss < 1.0:
        raise LocalProtocolError(
            f"parity_for_loss(k={k}, floor={floor}, ceiling={ceiling}, "
            f"target={target_block_loss}) is not a valid question"
        )
    if not math.isfinite(loss_rate):
        raise LocalProtocolError(f"loss rate {loss_rate} is not a number")
    quanta = math.ceil(min(max(loss_rate, 0.0), 1.0) / LOSS_RATE_QUANTUM - 1e-9)
    return _parity_cached(quanta, k, target_block_loss, floor, min(ceiling, MAX_SYMBOLS - k))


@lru_cache(maxsize=4096)
def _parity_cached(quanta: int, k: int, target: float, floor: int, ceiling: int) -> int:
    loss_rate = quanta * LOSS_RATE_QUANTUM
    for m in range(floor, ceiling + 1):
        if block_loss_probability(loss_rate, k, m) < target:
            return m
    return max(floor, ceiling)
