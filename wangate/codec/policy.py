"""Which codec a tensor gets: per-call override, else the first matching tag glob, else the
default; lossy codecs fall back to their lossless part for small or non-float tensors."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import numpy as np

from wangate.errors import CodecError

from .dtypes import FLOAT_CODES, dtype_code, is_bfloat16
from .spec import parse_spec

_MAX_REMEMBERED_TAGS = 1024


class CodecPolicy:
    def __init__(
        self,
        default: str = "none",
        tags: Sequence[tuple[str, str]] = (),
        min_lossy_bytes: int = 65536,
    ) -> None:
        parse_spec(default)
        rules: list[tuple[str, str]] = []
        for rule in tags:
            if len(rule) != 2 or not all(isinstance(part, str) for part in rule):
                raise CodecError(f"codec rule {rule!r} must be a (tag glob, spec) pair of strings")
            parse_spec(rule[1])
            rules.append((rule[0], rule[1]))
        if isinstance(min_lossy_bytes, bool) or not isinstance(min_lossy_bytes, int):
            raise CodecError("min_lossy_bytes must be an integer")
        if min_lossy_bytes < 0:
            raise CodecError("min_lossy_bytes must not be negative")
        self._default = default
        self._tags = tuple(rules)
        self.min_lossy_bytes = min_lossy_bytes
        self._rules: dict[str, str] = {}  # tag -> its rule's spec: a loop sends the same tags

    @property
    def default(self) -> str:
        return self._default

    @property
    def tags(self) -> tuple[tuple[str, str], ...]:
        """(tag glob, spec) rules, first match wins; fixed (a new policy for new rules)."""
        return self._tags

    def choose(
        self,
        tag: str,
        nbytes: int,
        override: str | None = None,
        dtype: np.dtype[np.generic] | None = None,
    ) -> str:
        """The spec for one tensor. ``override`` (send(..., codec=...)) beats the tag rules; the
        size threshold and the dtype check apply to it too. With ``dtype`` given, a lossy spec
        on a non-float tensor also falls back to its lossless part."""
        spec = override if override is not None else self._rule_for(tag)
        parsed = parse_spec(spec)
        if not parsed.lossy:
            return spec
        too_small = nbytes < self.min_lossy_bytes
        not_float = dtype is not None and (
            is_bfloat16(dtype) or dtype.kind != "f" or dtype_code(dtype) not in FLOAT_CODES
        )
        if too_small or not_float:
            return str(parsed.lossless_part())
        return spec

    def _rule_for(self, tag: str) -> str:
        spec = self._rules.get(tag)
        if spec is None:
            spec = next(
                (spec for pattern, spec in self._tags if fnmatch.fnmatchcase(tag, pattern)),
                self._default,
            )
            if len(self._rules) >= _MAX_REMEMBERED_TAGS:
                self._rules.clear()
            self._rules[tag] = spec
        return spec
