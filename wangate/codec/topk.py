"""Top-k selection by magnitude and delta-coded index lists (used by topk and split).

Selection avoids a full sort: a strided sample estimates the magnitude threshold, one pass keeps
the candidates above it, and ``np.argpartition`` picks exactly k among them (falling back to
argpartition over everything if the estimate was too high).

Indices travel sorted ascending as deltas (the first is the index itself), all in one unsigned
little-endian width (1, 2, 4 or 8 bytes) chosen per frame: the smallest that holds every delta.
"""

from __future__ import annotations

import numpy as np

from wangate.errors import CodecError

from .chunks import check_finite

SAMPLE_ELEMS = 1 << 16
INDEX_WIDTHS = (1, 2, 4, 8)


def select_largest(x: np.ndarray, k: int) -> np.ndarray:
    """Sorted int64 indices of the k largest |x| (ties at the edge: any of them)."""
    n = x.size
    if k == 0:
        return np.empty(0, dtype=np.int64)
    check_finite(float(x.min()), float(x.max()))
    if k == n:
        return np.arange(n, dtype=np.int64)
    magnitude = np.abs(x)
    chosen: np.ndarray | None = None
    if n >= 4 * SAMPLE_ELEMS and k <= n // 8:
        sample = magnitude[:: n // SAMPLE_ELEMS]
        # Aim for about twice k candidates so one estimate nearly always suffices.
        keep = min(sample.size - 1, 2 * k * sample.size // n + 8)
        threshold = np.partition(sample, sample.size - keep)[sample.size - keep]
        candidates = np.flatnonzero(magnitude >= threshold)
        if candidates.size >= k:
            among = np.argpartition(magnitude[candidates], candidates.size - k)
            chosen = candidates[among[candidates.size - k :]]
    if chosen is None:
        chosen = np.argpartition(magnitude, n - k)[n - k :]
    chosen.sort()
    return chosen.astype(np.int64, copy=False)


def index_width(indices: np.ndarray) -> int:
    """Bytes per delta for sorted ``indices``."""
    if indices.size == 0:
        return 1
    largest = int(max(int(indices[0]), int(np.diff(indices).max(initial=0))))
    for width in INDEX_WIDTHS:
        if largest < 1 << (8 * width):
            return width
    raise CodecError("index delta does not fit in 8 bytes")


def encode_indices(indices: np.ndarray, width: int, out: np.ndarray) -> None:
    deltas = out.view(f"<u{width}")
    if indices.size:
        deltas[0] = indices[0]
        np.subtract(indices[1:], indices[:-1], out=deltas[1:], casting="unsafe")


def decode_indices(body: np.ndarray, width: int, n: int) -> np.ndarray:
    """Indices from deltas; CodecError unless strictly increasing and below n."""
    deltas = body.view(f"<u{width}")
    indices = np.cumsum(deltas, dtype=np.uint64)
    # A wrapped sum is smaller than its predecessor, so this also catches uint64 overflow.
    if indices.size and (int(indices[-1]) >= n or not bool(np.all(indices[1:] > indices[:-1]))):
        raise CodecError("frame carries indices that are not strictly increasing below the size")
    return indices.astype(np.int64)
