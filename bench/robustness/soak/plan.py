"""What a soak sends, over what: the sites and paths, and each message's size, flags
and bytes, all a pure function of the seed (no I/O).

A flow is one ordered pair of sites (``bj>sh``): its messages have the tag
``soak.bj.sh`` and steps 0, 1, 2, ...; message ``step`` of a flow is drawn from
``(seed, flow, step)`` alone, so the receiver, given the step a payload names, knows
its size and every byte it must have.
"""

from __future__ import annotations

import itertools
import math
import random
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

KiB, MiB = 1 << 10, 1 << 20
SITE_NAMES = ("bj", "sh", "sg")
PATH_LETTERS = "abc"
MIN_BYTES, MAX_BYTES = KiB, 8 * MiB
MAGIC = b"WGSK"
HEADER = struct.Struct("!4sQI")  # magic, step, CRC-32 of the flow's name
DEADLINE_S = 3.0  # the deadline of the messages drawn to have one


@dataclass(frozen=True)
class Topology:
    """``sites`` sites, every pair joined by ``paths`` paths."""

    sites: int = 3
    paths: int = 2
    rate_mbps: float = 20.0

    def __post_init__(self) -> None:
        if not 2 <= self.sites <= len(SITE_NAMES) or not 1 <= self.paths <= len(PATH_LETTERS):
            raise ValueError(f"sites must be 2..{len(SITE_NAMES)}, paths 1..{len(PATH_LETTERS)}")

    @property
    def site_names(self) -> tuple[str, ...]:
        return SITE_NAMES[: self.sites]

    def pairs(self) -> list[tuple[str, str]]:
        return list(itertools.combinations(self.site_names, 2))

    def path_names(self) -> list[str]:
        return [f"{a}-{b}-{PATH_LETTERS[p]}" for a, b in self.pairs() for p in range(self.paths)]

    def flows(self) -> list[tuple[str, str]]:
        """Every ordered pair: every site sends to every other."""
        return list(itertools.permutations(self.site_names, 2))

    def base_loss(self, path: str) -> float:
        """The loss a path has outside a loss burst: the last path of a pair loses 0.2 %."""
        return 0.002 if path.endswith(PATH_LETTERS[self.paths - 1]) and self.paths > 1 else 0.0

    def scenario_data(
        self, seed: int, seconds: float, timeline: list[dict[str, Any]], gateway_config: str
    ) -> dict[str, Any]:
        """The lab scenario (the dict a scenario TOML file parses to)."""
        links = []
        for pair_index, (a, b) in enumerate(self.pairs()):
            paths = []
            for p in range(self.paths):
                name = f"{a}-{b}-{PATH_LETTERS[p]}"
                paths.append(
                    {
                        "name": name,
                        "rate_mbps": self.rate_mbps,
                        "delay_ms": 10 + 5 * pair_index + 10 * p,
                        "jitter_ms": 1,
                        "loss": self.base_loss(name),
                    }
                )
            links.append({"sites": [a, b], "paths": paths})
        return {
            "name": "soak",
            "description": "the fault soak's sites, paths and faults",
            "seed": seed,
            "duration_s": seconds,
            "sites": [{"name": s} for s in self.site_names],
            "links": links,
            "timeline": timeline,
            "gateway_config": gateway_config,
        }


def flow_name(src: str, dst: str) -> str:
    return f"{src}>{dst}"


def flow_tag(flow: str) -> str:
    src, dst = flow.split(">")
    return f"soak.{src}.{dst}"


@dataclass(frozen=True)
class MessageSpec:
    flow: str
    step: int
    size: int  # payload bytes
    critical: bool
    deadline_s: float | None


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return min(high, max(low, int(math.exp(rng.uniform(math.log(low), math.log(high))))))


def message_spec(seed: int, flow: str, step: int) -> MessageSpec:
    """Message ``step`` of ``flow``: 70 % 1-64 KiB, 25 % 64 KiB-1 MiB, 5 % 1-8 MiB (log-
    uniform within each); a fifth of those up to 256 KiB critical; a tenth of those up
    to 1 MiB with a deadline of ``DEADLINE_S``."""
    rng = random.Random(f"{seed}/{flow}/{step}")
    band = rng.random()
    if band < 0.70:
        size = _log_uniform(rng, MIN_BYTES, 64 * KiB)
    elif band < 0.95:
        size = _log_uniform(rng, 64 * KiB, MiB)
    else:
        size = _log_uniform(rng, MiB, MAX_BYTES)
    critical = size <= 256 * KiB and rng.random() < 0.2
    deadline = DEADLINE_S if size <= MiB and rng.random() < 0.1 else None
    return MessageSpec(flow, step, size, critical, deadline)


def flow_crc(flow: str) -> int:
    return zlib.crc32(flow.encode())


def payload(seed: int, spec: MessageSpec) -> np.ndarray:
    """The message's bytes: a header naming its step and flow, then bytes drawn from
    (seed, flow, step)."""
    head = HEADER.pack(MAGIC, spec.step, flow_crc(spec.flow))
    rng = np.random.Generator(np.random.PCG64([seed, flow_crc(spec.flow), spec.step]))
    body = rng.bytes(spec.size - HEADER.size)
    return np.frombuffer(head + body, dtype=np.uint8)


def identify(data: np.ndarray) -> tuple[int, int] | None:
    """(step, flow CRC) a payload's header names, or None when it has no header."""
    if data.dtype != np.uint8 or data.ndim != 1 or data.size < HEADER.size:
        return None
    magic, step, crc = HEADER.unpack(data[: HEADER.size].tobytes())
    return (step, crc) if magic == MAGIC else None
