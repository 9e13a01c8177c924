"""Scenario files (TOML): sites, paths, a timeline of parameter changes, a workload.

The schema is documented in wangate/lab/scenarios/README.md. Loading is strict: an unknown
key or a bad value is a ConfigError naming the file and the key.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from wangate.errors import ConfigError
from wangate.lab.gilbert import GilbertElliottParams
from wangate.lab.link import LinkParams

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
DIRECTIONS = ("both", "a_to_b", "b_to_a")
MAX_PATHS = 250  # one 10.77.<index>.0/30 per path
_PARAM_KEYS = frozenset(f.name for f in fields(LinkParams))
_GE_SHORTHAND = frozenset({"ge_mean_burst", "ge_loss"})


@dataclass(frozen=True)
class PathSpec:
    """One WAN path between two sites; ``a``/``b`` are the link's sites in file order."""

    name: str
    index: int  # 1-based, selects the 10.77.<index>.0/30 subnet
    site_a: str
    site_b: str
    a_to_b: LinkParams
    b_to_a: LinkParams
    mtu: int

    @property
    def address_a(self) -> str:
        return f"10.77.{self.index}.1"

    @property
    def address_b(self) -> str:
        return f"10.77.{self.index}.2"

    def sites(self) -> tuple[str, str]:
        return (self.site_a, self.site_b)

    def params_from(self, site: str) -> LinkParams:
        """Initial parameters of the direction that leaves ``site``."""
        return self.a_to_b if site == self.site_a else self.b_to_a

    def address_of(self, site: str) -> str:
        if site == self.site_a:
            return self.address_a
        if site == self.site_b:
            return self.address_b
        raise KeyError(f"site {site!r} is not an end of path {self.name!r}")


@dataclass(frozen=True)
class TimelineEvent:
    at_s: float
    path: str
    direction: str  # "both", "a_to_b" or "b_to_a"
    changes: dict[str, Any]


@dataclass(frozen=True)
class MessageSpec:
    name: str
    size_bytes: int
    critical: bool


@dataclass(frozen=True)
class Flow:
    """``steps`` rounds of ``messages`` from ``src`` to ``dst``, one round every ``interval_s``."""

    src: str
    dst: str
    steps: int
    interval_s: float
    start_s: float
    messages: tuple[MessageSpec, ...]

    @property
    def total_bytes(self) -> int:
        return self.steps * sum(m.size_bytes for m in self.messages)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    duration_s: float
    sites: tuple[str, ...]
    paths: tuple[PathSpec, ...]
    timeline: tuple[TimelineEvent, ...]
    flows: tuple[Flow, ...]
    source: Path | None = None
    gateway_config: str = ""  # TOML appended to every site's gateway config

    def path(self, name: str) -> PathSpec:
        for path in self.paths:
            if path.name == name:
                return path
        raise KeyError(f"no path named {name!r} in scenario {self.name!r}")

    def paths_between(self, site_x: str, site_y: str) -> list[PathSpec]:
        return [p for p in self.paths if {p.site_a, p.site_b} == {site_x, site_y}]


class _Reader:
    """Strict access to one TOML table, with the key path kept for error messages."""

    def __init__(self, source: str, where: str, table: Any) -> None:
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: {where or 'top level'} must be a table")
        self.source = source
        self.where = where
        self.table: dict[str, Any] = table

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.key(name)}: {message}")

    def only(self, allowed: set[str] | frozenset[str]) -> None:
        for name in self.table:
            if name not in allowed:
                raise self.fail(name, "unknown key")

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if name not in self.table:
            if default is ...:
                raise self.fail(name, "missing")
            return default
        value = self.table[name]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(name, f"expected {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(name, f"expected {_kind_name(kind)}, got {type(value).__name__}")
        return value

    def number(self, name: str, default: Any = ..., minimum: float = 0.0) -> float:
        value = float(self.get(name, (int, float), default))
        if not math.isfinite(value) or value < minimum:
            raise self.fail(name, f"must be a finite number >= {minimum}")
        return value

    def tables(self, name: str) -> list[_Reader]:
        items = self.get(name, list, [])
        return [_Reader(self.source, f"{self.key(name)}[{i}]", t) for i, t in enumerate(items)]


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _param_changes(reader: _Reader, extra_keys: set[str]) -> dict[str, Any]:
    """Link parameters found in ``reader`` (with the ge_mean_burst/ge_loss shorthand)."""
    reader.only(_PARAM_KEYS | _GE_SHORTHAND | extra_keys)
    changes: dict[str, Any] = {}
    for name in reader.table:
        if name in extra_keys:
            continue
        if name == "blackhole":
            changes[name] = reader.get(name, bool)
        elif name == "queue_bytes":
            changes[name] = int(reader.get(name, int))
        elif name in _PARAM_KEYS:
            changes[name] = reader.number(name)
    if _GE_SHORTHAND & reader.table.keys():
        if not reader.table.keys() >= _GE_SHORTHAND:
            raise reader.fail("ge_mean_burst", "ge_mean_burst and ge_loss go together")
        try:
            ge = GilbertElliottParams.from_burst(
                reader.number("ge_mean_burst"), reader.number("ge_loss")
            )
        except ValueError as exc:
            raise reader.fail("ge_mean_burst", str(exc)) from None
        changes.update(ge_p=ge.p, ge_r=ge.r, ge_loss_in_good=0.0, ge_loss_in_bad=1.0)
    return changes


def _link_params(reader: _Reader, base: LinkParams, changes: dict[str, Any]) -> LinkParams:
    try:
        return base.updated(changes)
    except ValueError as exc:
        raise ConfigError(f"{reader.source}: {reader.where}: {exc}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario by file path, or by name from wangate/lab/scenarios/."""
    file = Path(path)
    if not file.exists() and not file.suffix:
        file = SCENARIO_DIR / f"{path}.toml"
    try:
        with open(file, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such scenario file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    return parse_scenario(data, str(file), source=file)


def parse_scenario(data: dict[str, Any], source_name: str, source: Path | None = None) -> Scenario:
    top = _Reader(source_name, "", data)
    top.only(
        {
            "name",
            "description",
            "seed",
            "duration_s",
            "mtu",
            "sites",
            "links",
            "timeline",
            "workload",
            "gateway_config",
        }
    )
    default_mtu = int(top.get("mtu", int, 1500))
    sites: list[str] = []
    for site in top.tables("sites"):
        site.only({"name"})
        name = site.get("name", str)
        if not name.isidentifier() or len(name) > 8 or name in sites:
            raise site.fail("name", "must be a unique identifier of at most 8 characters")
        sites.append(name)
    if len(sites) < 2:
        raise top.fail("sites", "a scenario needs at least two sites")

    paths: list[PathSpec] = []
    for link in top.tables("links"):
        link.only({"sites", "paths"})
        pair = link.get("sites", list)
        if len(pair) != 2 or pair[0] == pair[1] or not all(s in sites for s in pair):
            raise link.fail("sites", "must name two different sites listed in [[sites]]")
        for path_reader in link.tables("paths"):
            name = path_reader.get("name", str)
            if not name.replace("-", "_").isidentifier() or any(p.name == name for p in paths):
                raise path_reader.fail("name", "must be a unique name (letters, digits, - and _)")
            shared = _param_changes(path_reader, {"name", "mtu", "a_to_b", "b_to_a"})
            mtu = int(path_reader.get("mtu", int, default_mtu))
            if not 576 <= mtu <= 9000:
                raise path_reader.fail("mtu", "must be within 576..9000")
            base = _link_params(path_reader, LinkParams(), shared)
            per_direction = {}
            for direction in ("a_to_b", "b_to_a"):
                sub = _Reader(
                    source_name, path_reader.key(direction), path_reader.get(direction, dict, {})
                )
                per_direction[direction] = _link_params(sub, base, _param_changes(sub, set()))
            paths.append(
                PathSpec(
                    name,
                    len(paths) + 1,
                    pair[0],
                    pair[1],
                    per_direction["a_to_b"],
                    per_direction["b_to_a"],
                    mtu,
                )
            )
    if not paths:
        raise top.fail("links", "a scenario needs at least one path")
    if len(paths) > MAX_PATHS:
        raise top.fail("links", f"at most {MAX_PATHS} paths")

    duration_s = top.number("duration_s", 20.0)
    timeline = _parse_timeline(top, paths, duration_s)
    flows = _parse_workload(top, sites)
    return Scenario(
        name=top.get("name", str, source.stem if source else "scenario"),
        description=top.get("description", str, ""),
        seed=int(top.get("seed", int, 1)),
        duration_s=duration_s,
        sites=tuple(sites),
        paths=tuple(paths),
        timeline=timeline,
        flows=flows,
        source=source,
        gateway_config=top.get("gateway_config", str, ""),
    )


def _parse_timeline(
    top: _Reader, paths: list[PathSpec], duration_s: float
) -> tuple[TimelineEvent, ...]:
    names = {p.name for p in paths}
    events: list[TimelineEvent] = []
    for entry in top.tables("timeline"):
        entry.only({"at_s", "path", "direction", "set", "every_s", "until_s"})
        at_s = entry.number("at_s")
        path = entry.get("path", str)
        if path not in names:
            raise entry.fail("path", f"no path named {path!r}")
        direction = entry.get("direction", str, "both")
        if direction not in DIRECTIONS:
            raise entry.fail("direction", f"must be one of {', '.join(DIRECTIONS)}")
        changes_reader = _Reader(top.source, entry.key("set"), entry.get("set", dict))
        changes = _param_changes(changes_reader, set())
        _link_params(changes_reader, LinkParams(), changes)  # validate values early
        every_s = entry.number("every_s", 0.0)
        until_s = entry.number("until_s", duration_s)
        if every_s == 0.0:
            events.append(TimelineEvent(at_s, path, direction, changes))
            continue
        if every_s < 0.01:
            raise entry.fail("every_s", "must be at least 0.01 s")
        step = 0
        while at_s + step * every_s <= until_s + 1e-9:
            events.append(TimelineEvent(round(at_s + step * every_s, 9), path, direction, changes))
            step += 1
    # Stable sort: entries at the same instant apply in file order.
    return tuple(sorted(events, key=lambda e: e.at_s))


def _parse_workload(top: _Reader, sites: list[str]) -> tuple[Flow, ...]:
    workload = _Reader(top.source, "workload", top.get("workload", dict, {}))
    workload.only({"flows"})
    flows: list[Flow] = []
    for flow in workload.tables("flows"):
        flow.only({"src", "dst", "steps", "interval_s", "start_s", "messages"})
        src, dst = flow.get("src", str), flow.get("dst", str)
        if src not in sites or dst not in sites or src == dst:
            raise flow.fail("src", "src and dst must be two different sites")
        steps = int(flow.get("steps", int, 1))
        if steps < 1:
            raise flow.fail("steps", "must be >= 1")
        messages: list[MessageSpec] = []
        for message in flow.tables("messages"):
            message.only({"name", "size_bytes", "critical"})
            size = int(message.get("size_bytes", int))
            if size < 1:
                raise message.fail("size_bytes", "must be >= 1")
            messages.append(
                MessageSpec(
                    message.get("name", str), size, bool(message.get("critical", bool, False))
                )
            )
        if not messages:
            raise flow.fail("messages", "a flow needs at least one message")
        flows.append(
            Flow(
                src,
                dst,
                steps,
                flow.number("interval_s", 0.0),
                flow.number("start_s", 0.0),
                tuple(messages),
            )
        )
    return tuple(flows)
