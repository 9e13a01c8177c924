"""Error feedback per hop of a collective, indexed by element of the flattened tensor.

A lossy encode's residual is kept per (tag, hop) over the whole tensor, not per chunk or
per destination: the partition may change from one plan to the next (a different
contiguous range goes to each owner) without losing what earlier steps dropped. Each
element is sent on a hop by one encode only (reduce-scatter: to its owner; all-gather and
direct exchange: the same bytes to every peer), so one residual per hop is exact.
"""

from __future__ import annotations

import numpy as np

from wangate.codec import EncodedTensor, ErrorFeedback, encode_tensor, parse_spec


class HopFeedback:
    def __init__(self) -> None:
        self._residuals: dict[tuple[str, str], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._residuals)

    def residual(self, tag: str, hop: str) -> np.ndarray | None:
        return self._residuals.get((tag, hop))

    def reset(self, tag: str | None = None) -> None:
        if tag is None:
            self._residuals.clear()
        else:
            for key in [k for k in self._residuals if k[0] == tag]:
                del self._residuals[key]

    def encode(
        self, spec: str, chunk: np.ndarray, tag: str, hop: str, start: int, total: int
    ) -> EncodedTensor:
        """Encode ``chunk`` (elements [start, start + chunk.size) of a ``total``-element
        tensor) adding the hop's residual first when ``spec`` is lossy."""
        if not parse_spec(spec).lossy:
            return encode_tensor(chunk, spec)
        key = (tag, hop)
        residual = self._residuals.get(key)
        if residual is None or residual.size != total:  # a new tensor under this tag
            residual = np.zeros(total, dtype=np.float32)
            self._residuals[key] = residual
        store = ErrorFeedback()
        # the view is updated in place by the encode: it ends holding what was dropped
        store.commit(0, chunk.shape, residual[start : start + chunk.size])
        return encode_tensor(chunk, spec, feedback=store, key=0)
