from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.core.fec import (
    MAX_SYMBOLS,
    BlockDecoder,
    BlockEncoder,
    block_loss_probability,
    parity_for_loss,
)
from wangate.errors import LocalProtocolError


def _block(k: int, symbol_bytes: int, seed: int, last_bytes: int | None = None) -> list[bytes]:
    rng = random.Random(seed)
    sources = [rng.randbytes(symbol_bytes) for _ in range(k)]
    if last_bytes is not None:
        sources[-1] = sources[-1][:last_bytes]
    return sources


def _encode(sources: list[bytes], symbol_bytes: int, m: int) -> dict[int, bytes]:
    k = len(sources)
    encoder = BlockEncoder(k, symbol_bytes)
    for index, data in enumerate(sources):
        encoder.add_source(index, memoryview(data))
    symbols = dict(enumerate(sources))
    symbols.update(zip(range(k, k + m), encoder.repairs(range(k, k + m)), strict=True))
    return symbols


def _padded(data: bytes, symbol_bytes: int) -> bytes:
    return data + bytes(symbol_bytes - len(data))


def _check_recovers(sources: list[bytes], symbol_bytes: int, m: int, erased: set[int]) -> None:
    k = len(sources)
    symbols = _encode(sources, symbol_bytes, m)
    decoder = BlockDecoder(k, symbol_bytes)
    ready = False
    for index in range(k + m):
        if index not in erased:
            ready = decoder.add(index, symbols[index])
    assert ready
    lost_sources = sorted(i for i in erased if i < k)
    assert decoder.missing_sources() == lost_sources
    recovered = decoder.recover()
    assert sorted(recovered) == lost_sources
    for index in lost_sources:
        assert recovered[index] == _padded(sources[index], symbol_bytes)


def test_every_erasure_pattern_up_to_m_recovers_exhaustively() -> None:
    k, m, symbol_bytes = 5, 3, 37
    sources = _block(k, symbol_bytes, seed=1, last_bytes=20)
    patterns = 0
    for count in range(m + 1):
        for erased in itertools.combinations(range(k + m), count):
            _check_recovers(sources, symbol_bytes, m, set(erased))
            patterns += 1
    assert patterns == 1 + 8 + 28 + 56


@settings(max_examples=150, deadline=None)
@given(
    k=st.integers(1, 40),
    m=st.integers(0, 12),
    symbol_bytes=st.integers(1, 600),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_any_erasures_up_to_m_recover_byte_exact(
    k: int, m: int, symbol_bytes: int, seed: int, data: st.DataObject
) -> None:
    erased = data.draw(st.sets(st.integers(0, k + m - 1), max_size=m))
    last_bytes = data.draw(st.integers(1, symbol_bytes))
    _check_recovers(_block(k, symbol_bytes, seed, last_bytes), symbol_bytes, m, erased)


def test_high_repair_indices_work_without_agreeing_on_m() -> None:
    k, symbol_bytes = 16, 64
    sources = _block(k, symbol_bytes, seed=2)
    encoder = BlockEncoder(k, symbol_bytes)
    for index, data in enumerate(sources):
        encoder.add_source(index, data)
    assert encoder.max_repair == MAX_SYMBOLS - k
    decoder = BlockDecoder(k, symbol_bytes)
    # only the highest repair indices plus 12 sources
    for index in range(12):
        decoder.add(index, sources[index])
    for index in range(MAX_SYMBOLS - 4, MAX_SYMBOLS):
        decoder.add(index, encoder.repair(index))
    assert decoder.recover() == {i: sources[i] for i in range(12, 16)}


def test_repair_is_cached_and_batch_equals_single() -> None:
    k, symbol_bytes = 8, 100
    sources = _block(k, symbol_bytes, seed=3)
    encoder = BlockEncoder(k, symbol_bytes)
    for index, data in enumerate(sources):
        encoder.add_source(index, data)
    first = encoder.repair(9)
    assert encoder.repair(9) is first
    other = BlockEncoder(k, symbol_bytes)
    for index, data in enumerate(sources):
        other.add_source(index, data)
    assert other.repairs([8, 9, 10]) == [encoder.repair(8), first, encoder.repair(10)]


def test_fewer_than_k_symbols_cannot_decode() -> None:
    k, m, symbol_bytes = 6, 4, 50
    symbols = _encode(_block(k, symbol_bytes, seed=4), symbol_bytes, m)
    decoder = BlockDecoder(k, symbol_bytes)
    for index in (0, 2, 7, 8, 9):
        assert decoder.add(index, symbols[index]) is False
    assert decoder.can_decode is False
    with pytest.raises(LocalProtocolError, match="5 of the 6"):
        decoder.recover()
    assert decoder.add(6, symbols[6]) is True
    assert decoder.recover() == {i: symbols[i] for i in (1, 3, 4, 5)}


def test_duplicates_are_ignored() -> None:
    k, m, symbol_bytes = 4, 2, 16
    symbols = _encode(_block(k, symbol_bytes, seed=5), symbol_bytes, m)
    decoder = BlockDecoder(k, symbol_bytes)
    for _ in range(3):
        assert decoder.add(0, symbols[0]) is False
        assert decoder.add(4, symbols[4]) is False
    assert decoder.add(5, symbols[5]) is False  # three distinct symbols so far
    assert decoder.add(5, symbols[5]) is False
    assert decoder.add(2, symbols[2]) is True
    assert decoder.recover() == {1: symbols[1], 3: symbols[3]}


def test_no_missing_sources_recovers_nothing() -> None:
    k, symbol_bytes = 3, 8
    sources = _block(k, symbol_bytes, seed=6)
    decoder = BlockDecoder(k, symbol_bytes)
    for index, data in enumerate(sources):
        decoder.add(index, data)
    assert decoder.missing_sources() == []
    assert decoder.recover() == {}


def test_misuse_is_refused() -> None:
    encoder = BlockEncoder(4, 10)
    with pytest.raises(LocalProtocolError, match="still missing"):
        encoder.repair(4)
    encoder.add_source(0, bytes(10))
    with pytest.raises(LocalProtocolError, match="given twice"):
        encoder.add_source(0, bytes(10))
    with pytest.raises(LocalProtocolError, match="more than the block's 10"):
        encoder.add_source(1, bytes(11))
    with pytest.raises(LocalProtocolError, match="source index 4"):
        encoder.add_source(4, bytes(10))
    for index in (1, 2, 3):
        encoder.add_source(index, bytes(10))
    with pytest.raises(LocalProtocolError, match="repair index 3"):
        encoder.repair(3)
    with pytest.raises(LocalProtocolError, match="repair index 256"):
        encoder.repair(MAX_SYMBOLS)
    decoder = BlockDecoder(4, 10)
    with pytest.raises(LocalProtocolError, match="repair symbol 5 is 9 bytes"):
        decoder.add(5, bytes(9))
    with pytest.raises(LocalProtocolError, match="source symbols"):
        BlockDecoder(0, 10)
    with pytest.raises(LocalProtocolError, match="source symbols"):
        BlockEncoder(MAX_SYMBOLS, 10)


# ------------------------------------------------------------------ parity count


def _tail_exact(p: Fraction, k: int, m: int) -> Fraction:
    n = k + m
    return sum(
        (Fraction(math.comb(n, i)) * p**i * (1 - p) ** (n - i) for i in range(m + 1, n + 1)),
        Fraction(0),
    )


def test_block_loss_probability_matches_hand_computed_tails() -> None:
    p = 0.05
    assert block_loss_probability(p, 1, 0) == pytest.approx(p, rel=1e-12)
    assert block_loss_probability(p, 1, 1) == pytest.approx(p * p, rel=1e-12)
    # k=2, m=1: two or three of three lost
    assert block_loss_probability(p, 2, 1) == pytest.approx(3 * p**2 * (1 - p) + p**3, rel=1e-12)
    for k, m, loss in ((16, 2, "0.01"), (16, 5, "0.05"), (32, 4, "0.003"), (8, 0, "0.2")):
        exact = _tail_exact(Fraction(loss), k, m)
        assert block_loss_probability(float(loss), k, m) == pytest.approx(float(exact), rel=1e-9)
    assert block_loss_probability(0.0, 16, 0) == 0.0
    assert block_loss_probability(1.0, 16, 4) == 1.0


def test_parity_for_loss_reproduces_design_figures() -> None:
    assert parity_for_loss(0.01, 16) == 2
    assert parity_for_loss(0.05, 16) == 5
    # and it is the smallest: one fewer misses the target
    assert float(_tail_exact(Fraction("0.01"), 16, 1)) >= 1e-3
    assert float(_tail_exact(Fraction("0.01"), 16, 2)) < 1e-3
    assert float(_tail_exact(Fraction("0.05"), 16, 4)) >= 1e-3
    assert float(_tail_exact(Fraction("0.05"), 16, 5)) < 1e-3


def test_parity_for_loss_edges_and_clamps() -> None:
    assert parity_for_loss(0.0, 16) == 0
    assert parity_for_loss(-0.5, 16) == 0
    assert parity_for_loss(0.0, 16, floor=1) == 1
    assert parity_for_loss(0.5, 16) == 16
    assert parity_for_loss(0.05, 16, ceiling=3) == 3
    assert parity_for_loss(0.05, 16, target_block_loss=1e-6) > 5
    assert parity_for_loss(0.01, 250, ceiling=16) == 6  # a block holds 256 symbols at most
    # rounding up to the cache quantum never gives less protection
    assert parity_for_loss(0.04999, 16) == parity_for_loss(0.05, 16)
    with pytest.raises(LocalProtocolError):
        parity_for_loss(float("nan"), 16)
    with pytest.raises(LocalProtocolError):
        parity_for_loss(0.01, 16, floor=5, ceiling=4)


@given(st.floats(0.0, 0.3), st.integers(1, 64))
def test_parity_meets_target_and_is_minimal(loss: float, k: int) -> None:
    m = parity_for_loss(loss, k, ceiling=64)
    rounded = math.ceil(loss / 1e-4 - 1e-9) * 1e-4
    if m < 64:
        assert block_loss_probability(rounded, k, m) < 1e-3
    if m > 0:
        assert block_loss_probability(rounded, k, m - 1) >= 1e-3
