"""Reading a configuration file: the TOML document, then each section of it.

Every mistake is a :class:`~wangate.errors.ConfigError` naming the file and the key, e.g.
``conf/bj.toml: peers[0].paths[1].remote: 'x:y' is not HOST:PORT: ...``. Unknown keys are
errors too: a misspelt optional key must not silently fall back to its default.
Relative file paths resolve against the folder of the configuration file.
"""

from __future__ import annotations

import ipaddress
import math
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wangate.config.access import gid_of, ids, socket_mode, uid_of
from wangate.config.jobs import jobs_config
from wangate.config.reader import Reader, toml_key, type_name
from wangate.config.schema import (
    MAX_MTU,
    MAX_WORKERS,
    MIN_MTU,
    CollectiveConfig,
    CompressionConfig,
    Config,
    CriticalConfig,
    FecConfig,
    LimitsConfig,
    MetricsConfig,
    PathConfig,
    PeerConfig,
    SiteConfig,
    WorkersConfig,
)
from wangate.config.tls_material import tls_config
from wangate.errors import ConfigError, WangateError

MAX_LOCAL_CONNECTIONS = 1 << 20


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a configuration file."""
    config_path = Path(path)
    try:
        text = config_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{config_path}: not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{config_path}: cannot read: {exc.strerror or exc}") from exc
    return parse_config(text, config_path)


def parse_config(text: str, path: Path) -> Config:
    """Validate configuration ``text``; ``path`` names it in errors and anchors relative paths."""
    path = Path(path)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from exc
    except RecursionError:  # tomllib recurses once per level of nested arrays and tables
        raise ConfigError(f"{path}: TOML nested too deeply") from None
    return _Parser(path).config(document)


class _Parser(Reader):
    """The sections of one configuration file, in the order they depend on each other."""

    def config(self, document: dict[str, Any]) -> Config:
        optional = {
            "peers", "limits", "compression", "metrics", "fec", "critical", "collective", "workers",
            "jobs",
        }  # fmt: skip
        self.table(document, "", {"site", "tls"}, optional)
        site = self.site(document["site"])
        tls = tls_config(self, document["tls"], site.name)
        peers = self.peers(document.get("peers", []), site)
        return Config(
            path=self.path,
            site=site,
            tls=tls,
            peers=peers,
            limits=self.limits(document.get("limits", {})),
            compression=self.compression(document.get("compression", {})),
            metrics=self.metrics(document.get("metrics", {})),
            fec=self.fec(document.get("fec", {})),
            critical=self.critical(document.get("critical", {})),
            collective=self.collective(document.get("collective", {}), site, peers),
            workers=self.workers(document.get("workers", {}), site),
            jobs=jobs_config(self, document.get("jobs", {}), site, peers),
        )

    def workers(self, value: object, site: SiteConfig) -> WorkersConfig:
        table = self.table(value, "workers", set(), {"count"})
        if "count" not in table:
            return WorkersConfig()
        count = self.integer(table["count"], "workers.count", 1, MAX_WORKERS)
        for index, (_host, port) in enumerate(site.listen):
            if port and port + count - 1 > 65535:  # worker w listens on port + w
                raise self.error(
                    "workers.count",
                    f"{count} workers need ports {port}..{port + count - 1} of site.listen"
                    f"[{index}]; the last is over 65535",
                )
        return WorkersConfig(count)

    def collective(
        self, value: object, site: SiteConfig, peers: tuple[PeerConfig, ...]
    ) -> CollectiveConfig:
        keys = {"weights", "chunk_bytes", "rate_mbps", "delay_ms"}
        table = self.table(value, "collective", set(), keys)
        chunk_bytes = self.integer(
            table.get("chunk_bytes", CollectiveConfig.chunk_bytes),
            "collective.chunk_bytes",
            1024,
            1 << 30,
        )
        rate = self.number(table.get("rate_mbps", 100.0), "collective.rate_mbps", 1e-3, 1e7)
        delay = self.number(table.get("delay_ms", 30.0), "collective.delay_ms", 0.0, 1e5)
        if "weights" not in table:
            return CollectiveConfig(chunk_bytes=chunk_bytes, rate_mbps=rate, delay_ms=delay)
        weights = table["weights"]
        if not isinstance(weights, dict):
            raise self.error("collective.weights", f"expected a table, got {type_name(weights)}")
        sites = [site.name, *(p.name for p in peers)]
        result = []
        for name, weight in weights.items():
            key = f"collective.weights.{toml_key(name)}"
            if name not in sites:
                raise self.error(key, f"{name!r} is not this site or one of its [[peers]]")
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise self.error(key, f"expected a number, got {type_name(weight)} {weight!r}")
            if not (math.isfinite(weight) and 0 < weight <= 1e6):
                raise self.error(key, f"{weight!r} is out of range (> 0 and <= 1000000)")
            result.append((name, float(weight)))
        missing = [s for s in sites if s not in weights]
        if missing:
            raise self.error(
                "collective.weights",
                f"no weight for {', '.join(missing)}: give every site of the config a weight",
            )
        return CollectiveConfig(tuple(sorted(result)), chunk_bytes, rate, delay)

    def critical(self, value: object) -> CriticalConfig:
        table = self.table(value, "critical", set(), {"host_delay_target_ms"})
        target = table.get("host_delay_target_ms", CriticalConfig.host_delay_target_ms)
        return CriticalConfig(self.integer(target, "critical.host_delay_target_ms", 0, 10_000))

    def fec(self, value: object) -> FecConfig:
        keys = {"enabled", "k", "min_repair", "max_repair", "critical_min_repair"}
        table = self.table(value, "fec", set(), keys)
        default = FecConfig()
        enabled = self.typed(table.get("enabled", True), "fec.enabled", bool, "a boolean")
        k = self.integer(table.get("k", default.k), "fec.k", 1, 128)
        low = self.integer(table.get("min_repair", default.min_repair), "fec.min_repair", 0, 128)
        high = self.integer(table.get("max_repair", default.max_repair), "fec.max_repair", 0, 128)
        if low > high:
            raise self.error("fec.min_repair", f"{low} is larger than fec.max_repair ({high})")
        critical = self.integer(
            table.get("critical_min_repair", default.critical_min_repair),
            "fec.critical_min_repair",
            0,
            128,
        )
        return FecConfig(enabled, k, low, high, critical)

    def site(self, value: object) -> SiteConfig:
        optional = {"listen", "socket_mode", "allow_uids", "allow_gids"}
        table = self.table(value, "site", {"name", "socket"}, optional)
        listen: list[tuple[str, int]] = []
        for index, item in enumerate(self.array(table.get("listen", []), "site.listen")):
            key = f"site.listen[{index}]"
            address = self.host_port(item, key, may_be_unspecified=True)
            if address in listen:
                raise self.error(key, f"{item!r} is listed twice")
            listen.append(address)
        return SiteConfig(
            name=self.name(table["name"], "site.name"),
            socket=self.file_path(table["socket"], "site.socket"),
            listen=tuple(listen),
            socket_mode=socket_mode(self, table.get("socket_mode", 0o660)),
            allow_uids=ids(self, table.get("allow_uids"), "site.allow_uids", uid_of),
            allow_gids=ids(self, table.get("allow_gids"), "site.allow_gids", gid_of),
        )

    def peers(self, value: object, site: SiteConfig) -> tuple[PeerConfig, ...]:
        peers: list[PeerConfig] = []
        for index, item in enumerate(self.array(value, "peers")):
            key = f"peers[{index}]"
            table = self.table(item, key, {"name", "paths"}, set())
            name = self.name(table["name"], f"{key}.name")
            if name == site.name:
                raise self.error(f"{key}.name", f"{name!r} is this site's own name")
            for other_index, other in enumerate(peers):
                if other.name == name:
                    raise self.error(
                        f"{key}.name", f"peer {name!r} is listed twice (also peers[{other_index}])"
                    )
            peers.append(PeerConfig(name=name, paths=self.paths(table["paths"], key, site)))
        return tuple(peers)

    def paths(self, value: object, peer_key: str, site: SiteConfig) -> tuple[PathConfig, ...]:
        items = self.array(value, f"{peer_key}.paths")
        if not items:
            raise self.error(f"{peer_key}.paths", "a peer needs at least one path")
        paths: list[PathConfig] = []
        for index, item in enumerate(items):
            key = f"{peer_key}.paths[{index}]"
            table = self.table(item, key, {"name"}, {"local", "remote", "mtu"})
            name = self.name(table["name"], f"{key}.name")
            if any(path.name == name for path in paths):
                raise self.error(f"{key}.name", f"path {name!r} is listed twice for this peer")
            local = None
            if "local" in table:
                local_ip = self.ip(self.string(table["local"], f"{key}.local"), f"{key}.local")
                local = str(local_ip)
            remote = None
            if "remote" in table:
                remote = self.host_port(table["remote"], f"{key}.remote", may_be_unspecified=False)
            elif not site.listen:
                raise self.error(
                    f"{key}.remote",
                    "missing, and site.listen is empty: no remote on either side, "
                    "so nobody could ever connect this path",
                )
            if local is not None and remote is not None:
                local_version = ipaddress.ip_address(local).version
                if local_version != ipaddress.ip_address(remote[0]).version:
                    raise self.error(
                        f"{key}.local",
                        f"{local!r} is IPv{local_version} but remote {remote[0]!r} is not",
                    )
            mtu = self.integer(table.get("mtu", 1500), f"{key}.mtu", MIN_MTU, MAX_MTU)
            paths.append(PathConfig(name=name, local=local, remote=remote, mtu=mtu))
        return tuple(paths)

    def limits(self, value: object) -> LimitsConfig:
        names = {
            "max_message_bytes",
            "client_budget_bytes",
            "peer_inbox_bytes",
            "partial_message_idle_s",
            "peer_dead_s",
            "max_local_connections",
        }
        table = self.table(value, "limits", set(), names)
        if "max_local_connections" in table:
            key = "limits.max_local_connections"
            self.integer(table["max_local_connections"], key, 1, MAX_LOCAL_CONNECTIONS)
        limits = LimitsConfig(
            **{name: self.integer(table[name], f"limits.{name}", 1) for name in sorted(table)}
        )
        # A message larger than a budget could never be accepted: it would wait forever.
        for budget in ("client_budget_bytes", "peer_inbox_bytes"):
            if limits.max_message_bytes > getattr(limits, budget):
                raise self.error(
                    "limits.max_message_bytes",
                    f"{limits.max_message_bytes} is larger than limits.{budget} "
                    f"({getattr(limits, budget)}): such a message could never be accepted",
                )
        return limits

    def compression(self, value: object) -> CompressionConfig:
        table = self.table(value, "compression", set(), {"default", "min_lossy_bytes", "tags"})
        check_spec = _codec_spec_checker()
        default = CompressionConfig.default
        if "default" in table:
            default = self.codec_spec(table["default"], "compression.default", check_spec)
        min_lossy_bytes = CompressionConfig.min_lossy_bytes
        if "min_lossy_bytes" in table:
            min_lossy_bytes = self.integer(
                table["min_lossy_bytes"], "compression.min_lossy_bytes", 0
            )
        tags: list[tuple[str, str]] = []
        tag_table = table.get("tags", {})
        if not isinstance(tag_table, dict):
            raise self.error("compression.tags", f"expected a table, got {type_name(tag_table)}")
        for glob, spec in tag_table.items():
            key = f"compression.tags.{toml_key(glob)}"
            if not glob:
                raise self.error(key, "an empty tag pattern matches nothing")
            tags.append((glob, self.codec_spec(spec, key, check_spec)))
        return CompressionConfig(default=default, min_lossy_bytes=min_lossy_bytes, tags=tuple(tags))

    def codec_spec(self, value: object, key: str, check: Callable[[str], object] | None) -> str:
        spec = self.string(value, key)
        if check is not None:
            try:
                check(spec)
            except (WangateError, ValueError) as exc:
                raise self.error(key, f"{spec!r} is not a valid codec spec: {exc}") from None
        return spec

    def metrics(self, value: object) -> MetricsConfig:
        table = self.table(value, "metrics", set(), {"listen"})
        if "listen" not in table:
            return MetricsConfig()
        return MetricsConfig(
            listen=self.host_port(table["listen"], "metrics.listen", may_be_unspecified=True)
        )


def _codec_spec_checker() -> Callable[[str], object] | None:
    """``wangate.codec.validate_codec_spec`` if the codec package provides it."""
    # Imported here: the codec package is heavier (numpy) and config must load without it.
    try:
        from wangate.codec import (  # type: ignore[attr-defined,unused-ignore]
            validate_codec_spec,
        )
    except ImportError as exc:
        if exc.name not in (None, "wangate.codec"):
            raise  # the codec package exists but is broken: say so
        return None
    checker: Callable[[str], object] = validate_codec_spec
    return checker
