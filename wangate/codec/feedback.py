"""Error feedback: what a lossy encode dropped is added to the next encode of the same key.

The store lives in the trainer's process, inside the client library, keyed by whatever the
caller passes (the client uses ``(destination peer, tag)``). That is where it is cheapest to
keep correct: the sender alone knows what it dropped, the residual never crosses the wire, and
the daemon stays a mover of opaque bytes.

Residuals are float32 whatever the input float dtype (the lossy codecs compute in float32).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

import numpy as np

from wangate.errors import CodecError

from .chunks import as_float32


class ErrorFeedback:
    """Residual store. Not safe for concurrent encodes of the same key from two threads."""

    def __init__(self) -> None:
        self._residuals: dict[Hashable, tuple[tuple[int, ...], np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self._residuals)

    def __contains__(self, key: object) -> bool:
        return key in self._residuals

    def keys(self) -> Iterator[Hashable]:
        return iter(list(self._residuals))

    @property
    def nbytes(self) -> int:
        return sum(flat.nbytes for _, flat in self._residuals.values())

    def residual(self, key: Hashable) -> np.ndarray | None:
        """A read-only view of the residual for ``key`` in its tensor's shape, or None."""
        entry = self._residuals.get(key)
        if entry is None:
            return None
        shape, flat = entry
        view = flat.reshape(shape)
        view.flags.writeable = False
        return view

    def add(self, key: Hashable, dropped: np.ndarray) -> None:
        """Accumulate ``dropped`` (any float array) into the residual for ``key``."""
        shape = tuple(dropped.shape)
        flat = as_float32(np.ascontiguousarray(dropped).reshape(-1))
        entry = self._residuals.get(key)
        if entry is None:
            self._residuals[key] = (shape, flat.copy())
            return
        self._check_shape(key, entry[0], shape)
        residual = entry[1]
        residual += flat

    def reset(self, key: Hashable | None = None) -> None:
        """Forget the residual for ``key``, or every residual when ``key`` is None."""
        if key is None:
            self._residuals.clear()
        else:
            self._residuals.pop(key, None)

    def checkout(self, key: Hashable, flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 work buffer holding input + residual; the key's entry is removed until
        ``commit`` puts the new residual back, so a failed encode leaves no stale residual."""
        entry = self._residuals.get(key)
        if entry is not None:
            self._check_shape(key, entry[0], shape)
        values = as_float32(flat)
        if entry is None:
            return values.copy() if values is flat else values
        del self._residuals[key]
        work = entry[1]
        work += values
        return work

    def commit(self, key: Hashable, shape: tuple[int, ...], residual: np.ndarray) -> None:
        self._residuals[key] = (shape, residual)

    @staticmethod
    def _check_shape(key: Hashable, held: tuple[int, ...], given: tuple[int, ...]) -> None:
        if held != given:
            raise CodecError(
                f"error feedback for {key!r} holds shape {held} but the tensor has shape "
                f"{given}; call reset({key!r}) if the tensor really changed"
            )
