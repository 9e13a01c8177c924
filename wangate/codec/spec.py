"""Codec spec strings ("int8+zstd:3", "topk:0.01/int8", ...): parse, validate, canonicalise.

Grammar (whitespace not allowed)::

    spec    := body ["+zstd" [":" LEVEL]]  |  "zstd" [":" LEVEL]
    body    := "none" | "fp16" | "bf16" | "int8" [":" BLOCK] | "int4" [":" BLOCK]
             | "topk:" FRAC ["/" VALUES]
             | "split:" FRAC ["/" REST ["/" KEY]]
    VALUES  := "fp16" | "bf16" | "fp32" | "int8" [":" BLOCK] | "int4" [":" BLOCK]   (default fp16)
    REST    := "int8" [":" BLOCK] | "int4" [":" BLOCK] | "fp16" | "bf16"           (default int8)
    KEY     := "fp32" | "fp16"                                                     (default fp32)
    FRAC    := a decimal fraction, 0 < FRAC < 1
    BLOCK   := a power of two, 8 ... 65536 (defaults: int8 256, int4 128)
    LEVEL   := zstd level, -7 ... 22 (default 3)

"zstd" alone means "none+zstd".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from wangate.errors import CodecError

DEFAULT_BLOCK = {"int8": 256, "int4": 128}
DEFAULT_ZSTD_LEVEL = 3
MIN_ZSTD_LEVEL = -7
MAX_ZSTD_LEVEL = 22
MIN_BLOCK = 8
MAX_BLOCK = 65536

TOPK_VALUE_KINDS = ("fp16", "bf16", "fp32", "int8", "int4")
SPLIT_REST_KINDS = ("int8", "int4", "fp16", "bf16")
SPLIT_KEY_KINDS = ("fp32", "fp16")
_INT_RE = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class DenseKind:
    """How a run of float values is carried: a 16/32-bit float or a blockwise integer."""

    name: str  # fp16, bf16, fp32, int8, int4
    block: int = 0  # elements per scale, blockwise kinds only

    def __str__(self) -> str:
        if self.block and self.block != DEFAULT_BLOCK[self.name]:
            return f"{self.name}:{self.block}"
        return self.name


@dataclass(frozen=True)
class CodecSpec:
    """A parsed spec. ``kind`` is none, fp16, bf16, int8, int4, topk or split."""

    kind: str
    fraction: float = 0.0  # topk/split: share of elements sent by index
    values: DenseKind | None = None  # dense kinds: itself; topk: values; split: the rest
    key: DenseKind | None = None  # split: the largest-magnitude part
    zstd_level: int | None = None  # None: no zstd stage

    @property
    def lossy(self) -> bool:
        return self.kind != "none"

    def lossless_part(self) -> CodecSpec:
        """What is left once the lossy stage is dropped: "int8+zstd:5" -> "zstd:5"."""
        return CodecSpec("none", zstd_level=self.zstd_level)

    def __str__(self) -> str:
        if self.kind == "none":
            body = "none"
        elif self.kind in ("fp16", "bf16", "int8", "int4"):
            body = str(self.values)
        elif self.kind == "topk":
            body = f"topk:{self.fraction!r}/{self.values}"
        else:
            body = f"split:{self.fraction!r}/{self.values}/{self.key}"
        if self.zstd_level is None:
            return body
        zstd = "zstd" if self.zstd_level == DEFAULT_ZSTD_LEVEL else f"zstd:{self.zstd_level}"
        return zstd if body == "none" else f"{body}+{zstd}"


def _bad(spec: str, why: str) -> CodecError:
    return CodecError(f"bad codec spec {spec!r}: {why}")


def _parse_int(spec: str, text: str, what: str) -> int:
    # ASCII digits only: str.isdigit() also accepts "²" and friends, which int() refuses.
    if len(text) > 8 or not _INT_RE.fullmatch(text):
        raise _bad(spec, f"{what} must be an integer, got {text!r}")
    return int(text)


def _parse_dense(spec: str, token: str, allowed: tuple[str, ...]) -> DenseKind:
    name, sep, arg = token.partition(":")
    if name not in allowed:
        raise _bad(spec, f"{name!r} is not one of {', '.join(allowed)}")
    if name not in DEFAULT_BLOCK:
        if sep:
            raise _bad(spec, f"{name} takes no parameter")
        return DenseKind(name)
    block = _parse_int(spec, arg, "block size") if sep else DEFAULT_BLOCK[name]
    if not MIN_BLOCK <= block <= MAX_BLOCK or block & (block - 1):
        raise _bad(spec, f"block size must be a power of two in {MIN_BLOCK}..{MAX_BLOCK}")
    return DenseKind(name, block)


def _parse_fraction(spec: str, text: str) -> float:
    try:
        fraction = float(text)
    except ValueError:
        raise _bad(spec, f"fraction must be a number, got {text!r}") from None
    if not math.isfinite(fraction) or not 0.0 < fraction < 1.0:
        raise _bad(spec, "fraction must be between 0 and 1 (exclusive)")
    return fraction


def _parse_zstd(spec: str, token: str) -> int:
    name, sep, arg = token.partition(":")
    if name != "zstd":
        raise _bad(spec, f"only 'zstd' may follow '+', got {token!r}")
    level = _parse_int(spec, arg, "zstd level") if sep else DEFAULT_ZSTD_LEVEL
    if not MIN_ZSTD_LEVEL <= level <= MAX_ZSTD_LEVEL or level == 0:
        raise _bad(spec, f"zstd level must be in {MIN_ZSTD_LEVEL}..{MAX_ZSTD_LEVEL}, not 0")
    return level


_PARSED: dict[str, CodecSpec] = {}  # every send parses its spec; a process uses a few
_MAX_PARSED = 256


def parse_spec(spec: str) -> CodecSpec:
    """Parse a spec string; raise CodecError naming what is wrong."""
    if not isinstance(spec, str):
        raise CodecError(f"codec spec must be a string, got {type(spec).__name__}")
    parsed = _PARSED.get(spec)
    if parsed is None:
        parsed = _parse(spec)
        if len(_PARSED) >= _MAX_PARSED:
            _PARSED.clear()
        _PARSED[spec] = parsed
    return parsed


def _parse(spec: str) -> CodecSpec:
    if len(spec) > 64 or not spec:
        raise _bad(spec, "empty or longer than 64 characters")
    body, plus, tail = spec.partition("+")
    level = _parse_zstd(spec, tail) if plus else None
    if body.startswith("zstd"):
        if plus:
            raise _bad(spec, "zstd may appear once")
        return CodecSpec("none", zstd_level=_parse_zstd(spec, body))
    head, _, rest = body.partition(":")
    if head == "none" and not rest:
        return CodecSpec("none", zstd_level=level)
    if head in ("fp16", "bf16", "int8", "int4"):
        return CodecSpec(head, values=_parse_dense(spec, body, (head,)), zstd_level=level)
    if head in ("topk", "split"):
        parts = rest.split("/")
        fraction = _parse_fraction(spec, parts[0])
        if head == "topk":
            if len(parts) > 2:
                raise _bad(spec, "topk takes FRAC[/VALUES]")
            values = _parse_dense(spec, parts[1] if len(parts) > 1 else "fp16", TOPK_VALUE_KINDS)
            return CodecSpec("topk", fraction, values, zstd_level=level)
        if len(parts) > 3:
            raise _bad(spec, "split takes FRAC[/REST[/KEY]]")
        rest_kind = _parse_dense(spec, parts[1] if len(parts) > 1 else "int8", SPLIT_REST_KINDS)
        key_kind = _parse_dense(spec, parts[2] if len(parts) > 2 else "fp32", SPLIT_KEY_KINDS)
        return CodecSpec("split", fraction, rest_kind, key_kind, zstd_level=level)
    raise _bad(spec, f"unknown codec {head!r} (none, fp16, bf16, int8, int4, topk, split, zstd)")


def selected_count(fraction: float, n: int) -> int:
    """How many elements top-k/split send by index: round(fraction * n), at least 1."""
    if n == 0:
        return 0
    return min(n, max(1, int(fraction * n + 0.5)))
