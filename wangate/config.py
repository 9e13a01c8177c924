"""The gateway's TOML configuration, validated strictly.

Every mistake is a :class:`~wangate.errors.ConfigError` naming the file and the key, e.g.
``conf/bj.toml: peers[0].paths[1].remote: 'x:y' is not HOST:PORT: ...``. Unknown keys are
errors too: a misspelt optional key must not silently fall back to its default.
Relative file paths resolve against the folder of the configuration file.
"""

from __future__ import annotations

import grp
import ipaddress
import logging
import math
import os
import pwd
import re
import stat
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from wangate.certs import is_valid_name, load_ca_certificates, verify_site_certificate
from wangate.errors import ConfigError, WangateError

log = logging.getLogger("wangate.config")

# RFC 9000 section 14: QUIC needs UDP payloads of 1200 bytes; with IPv6 (40) and UDP (8)
# headers that is an MTU of 1248, so the IPv6 minimum link MTU of 1280 is the floor.
MIN_MTU = 1280
MAX_MTU = 65535
MAX_WORKERS = 64
_IPV4_UDP_OVERHEAD = 20 + 8
_IPV6_UDP_OVERHEAD = 40 + 8


@dataclass(frozen=True)
class PathConfig:
    name: str
    local: str | None  # bind IP for this path (dial side); None = wildcard
    remote: tuple[str, int] | None  # None = we do not dial this path; the peer dials us
    mtu: int = 1500  # datagram size follows it

    @property
    def max_datagram_size(self) -> int:
        """Largest UDP payload for this path: the MTU less IP and UDP headers.

        The family comes from ``remote``, else ``local``; unknown means IPv6 (the larger).
        """
        address = self.remote[0] if self.remote is not None else self.local
        if address is not None and ipaddress.ip_address(address).version == 4:
            return self.mtu - _IPV4_UDP_OVERHEAD
        return self.mtu - _IPV6_UDP_OVERHEAD


@dataclass(frozen=True)
class PeerConfig:
    name: str
    paths: tuple[PathConfig, ...]

    def path(self, name: str) -> PathConfig:
        for path in self.paths:
            if path.name == name:
                return path
        known = ", ".join(p.name for p in self.paths)
        raise ConfigError(f"peer {self.name!r} has no path named {name!r} (it has: {known})")


@dataclass(frozen=True)
class SiteConfig:
    name: str
    socket: Path
    listen: tuple[tuple[str, int], ...]
    socket_mode: int = 0o660
    # local API access (wangate.localapi.access): None = the default, which for
    # allow_gids is the socket file's group; the daemon's user and root always pass
    allow_uids: tuple[int, ...] | None = None
    allow_gids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TlsConfig:
    ca: Path
    cert: Path
    key: Path
    # a private key that group or others may read is refused unless this is set
    allow_readable_key: bool = False


@dataclass(frozen=True)
class LimitsConfig:
    max_message_bytes: int = 4 << 30
    client_budget_bytes: int = 8 << 30  # bytes one trainer connection may have in the daemon
    peer_inbox_bytes: int = 8 << 30  # delivered-but-unclaimed bytes per source peer
    # a partial message from a peer that sends nothing more for it this long is dropped
    partial_message_idle_s: int = 60
    # silent this long, a peer is unreachable: sends to it and recvs only it could
    # satisfy fail at once (proto/delivery.md)
    peer_dead_s: int = 5

    max_local_connections: int = 1024  # trainer connections at once; more are refused


@dataclass(frozen=True)
class CompressionConfig:
    default: str = "none"
    min_lossy_bytes: int = 65536
    tags: tuple[tuple[str, str], ...] = ()  # (glob, spec) in file order


@dataclass(frozen=True)
class MetricsConfig:
    listen: tuple[str, int] | None = None


@dataclass(frozen=True)
class FecConfig:
    """[fec]: forward error correction of shard data (wangate.core.coding)."""

    enabled: bool = True
    # source symbols per block: the repair symbols that keep residual block loss under
    # 1e-3 cost 3 % at 0.1 % loss and 6 % at 1 % with k=64, against 6 % and 12.5 % with
    # k=16 (measured in the lab: bench/RESULTS.md, "Block size")
    k: int = 64
    min_repair: int = 0  # repair symbols per block, at least (even on a clean path)
    max_repair: int = 16  # ...and at most, however lossy the paths
    critical_min_repair: int = 2  # at least this many per block of a critical message


@dataclass(frozen=True)
class CriticalConfig:
    """[critical]: protecting critical messages from bulk (wangate.core.governor)."""

    # while critical traffic flows, bulk is slowed when the gateways' own delay (common to
    # every path) exceeds this. 0 (the default) never slows bulk: when critical and bulk
    # gradients belong to the same step, slowing bulk makes the step slower.
    host_delay_target_ms: int = 0


@dataclass(frozen=True)
class WorkersConfig:
    """[workers]: worker processes (wangate.workers). None: chosen by the host."""

    count: int | None = None

    def resolved(self, cpu_count: int | None, paths: int) -> int:
        """The number of workers: as configured, else one per path plus the critical
        worker, within the cores less one for the coordinator; 1 (no workers: one
        process, as before) on a host of fewer than 4 cores, where the processes would
        only compete for them."""
        if self.count is not None:
            return self.count
        cores = cpu_count or 1
        if cores < 4:
            return 1
        return max(1, min(cores - 1, paths + 1, MAX_WORKERS))


@dataclass(frozen=True)
class CollectiveConfig:
    """[collective]: how allreduce shares the tensor between sites (proto/collective.md)."""

    # site name -> relative share; empty: shares follow measured capacity or are equal
    weights: tuple[tuple[str, float], ...] = ()
    chunk_bytes: int = 1 << 20  # pipelining unit; every site must use the same
    # the bound that picks direct exchange over reduce-scatter/all-gather (Plan.direct)
    rate_mbps: float = 100.0
    delay_ms: float = 30.0


@dataclass(frozen=True)
class Config:
    path: Path
    site: SiteConfig
    tls: TlsConfig
    peers: tuple[PeerConfig, ...]
    limits: LimitsConfig
    compression: CompressionConfig
    metrics: MetricsConfig
    fec: FecConfig = FecConfig()
    critical: CriticalConfig = CriticalConfig()
    workers: WorkersConfig = WorkersConfig()
    collective: CollectiveConfig = CollectiveConfig()

    def collective_settings(self) -> dict[str, Any]:
        """What a trainer's client needs for collectives (sent in the hello reply)."""
        return {
            "peers": sorted(p.name for p in self.peers),
            "weights": dict(self.collective.weights),
            "chunk_bytes": self.collective.chunk_bytes,
            "rate_mbps": self.collective.rate_mbps,
            "delay_ms": self.collective.delay_ms,
        }

    def peer(self, name: str) -> PeerConfig:
        for peer in self.peers:
            if peer.name == name:
                return peer
        known = ", ".join(p.name for p in self.peers) or "none"
        raise ConfigError(f"{self.path}: no peer named {name!r} (configured peers: {known})")


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


_SOCKET_MODE_STRING = re.compile(r"0?[0-7]{3}|0o[0-7]{3}")
MAX_ID = 2**32 - 2  # uid_t / gid_t; (uid_t)-1 means "no id"
MAX_LOCAL_CONNECTIONS = 1 << 20
_ID_KIND = {"site.allow_uids": "user", "site.allow_gids": "group"}


def _uid_of(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


def _gid_of(name: str) -> int:
    return grp.getgrnam(name).gr_gid


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string"}
    names |= {list: "array", dict: "table"}
    return names.get(type(value), type(value).__name__)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else '"' + key.replace('"', '\\"') + '"'


class _Parser:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.base = path.parent.absolute()

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {message}")

    # -- generic shape checks --------------------------------------------------------

    def table(
        self, value: object, key: str, required: set[str], optional: set[str]
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a table, got {_type_name(value)}")
        prefix = f"{key}." if key else ""
        allowed = ", ".join(sorted(required | optional))
        for name in value:
            if name not in required and name not in optional:
                where = key or "the top level"
                raise self.error(
                    f"{prefix}{_toml_key(name)}", f"unknown key ({where} takes: {allowed})"
                )
        for name in sorted(required):
            if name not in value:
                raise self.error(f"{prefix}{name}", "missing (required)")
        return value

    def typed(self, value: object, key: str, kind: type, kind_name: str) -> Any:
        # bool is an int in Python, never in TOML: keep them apart.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(key, f"expected {kind_name}, got {_type_name(value)} {value!r}")
        return value

    def string(self, value: object, key: str) -> str:
        text: str = self.typed(value, key, str, "a string")
        if not text:
            raise self.error(key, "must not be empty")
        return text

    def array(self, value: object, key: str) -> list[Any]:
        items: list[Any] = self.typed(value, key, list, "an array")
        return items

    def integer(self, value: object, key: str, low: int, high: int | None = None) -> int:
        number: int = self.typed(value, key, int, "an integer")
        if number < low or (high is not None and number > high):
            bounds = f"{low}..{high}" if high is not None else f">= {low}"
            raise self.error(key, f"{number} is out of range ({bounds})")
        return number

    def name(self, value: object, key: str) -> str:
        text = self.string(value, key)
        if not is_valid_name(text):
            raise self.error(
                key,
                f"{text!r} is not a valid name (1-63 of letters, digits, '.', '_', '-', "
                "starting with a letter or digit, and not an IP address)",
            )
        return text

    def file_path(self, value: object, key: str) -> Path:
        text = self.string(value, key)
        if "\0" in text:  # no file has one; open() would raise ValueError
            raise self.error(key, f"{text!r} contains a NUL character")
        return self.base / Path(text)

    # -- addresses ------------------------------------------------------------------

    def ip(self, text: str, key: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            raise self.error(key, f"{text!r} is not an IP address literal") from None
        if address.is_multicast:
            raise self.error(key, f"{text!r} is a multicast address")
        return address

    def host_port(self, value: object, key: str, *, may_be_unspecified: bool) -> tuple[str, int]:
        text = self.string(value, key)

        def bad(reason: str) -> ConfigError:
            return self.error(key, f"{text!r} is not HOST:PORT: {reason}")

        if text.startswith("["):
            host, bracket, port_text = text[1:].partition("]:")
            if not bracket:
                raise bad("an IPv6 address is written '[ADDRESS]:PORT'")
        else:
            host, colon, port_text = text.rpartition(":")
            if not colon:
                raise bad("no ':PORT'")
            if ":" in host:
                raise bad("an IPv6 address needs brackets, like '[::1]:7443'")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise bad(f"{host!r} is not an IP address literal") from None
        if text.startswith("[") and address.version != 6:
            raise bad("only IPv6 addresses go in brackets")
        if not re.fullmatch(r"[0-9]{1,5}", port_text) or not 1 <= int(port_text) <= 65535:
            raise bad(f"port {port_text!r} is not a number in 1..65535")
        if address.is_multicast:
            raise bad("a multicast address")
        if not may_be_unspecified and address.is_unspecified:
            raise bad("the unspecified address cannot be dialled")
        if isinstance(address, ipaddress.IPv4Address) and address == ipaddress.IPv4Address(
            "255.255.255.255"
        ):
            raise bad("the broadcast address")
        return str(address), int(port_text)

    # -- sections -------------------------------------------------------------------

    def config(self, document: dict[str, Any]) -> Config:
        optional = {
            "peers", "limits", "compression", "metrics", "fec", "critical", "collective", "workers"
        }  # fmt: skip
        self.table(document, "", {"site", "tls"}, optional)
        site = self.site(document["site"])
        tls = self.tls(document["tls"], site.name)
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
            raise self.error("collective.weights", f"expected a table, got {_type_name(weights)}")
        sites = [site.name, *(p.name for p in peers)]
        result = []
        for name, weight in weights.items():
            key = f"collective.weights.{_toml_key(name)}"
            if name not in sites:
                raise self.error(key, f"{name!r} is not this site or one of its [[peers]]")
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise self.error(key, f"expected a number, got {_type_name(weight)} {weight!r}")
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

    def number(self, value: object, key: str, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"expected a number, got {_type_name(value)} {value!r}")
        if not (math.isfinite(value) and low <= value <= high):
            raise self.error(key, f"{value!r} is out of range ({low:g}..{high:g})")
        return float(value)

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
            socket_mode=self.socket_mode(table.get("socket_mode", 0o660)),
            allow_uids=self.ids(table.get("allow_uids"), "site.allow_uids", _uid_of),
            allow_gids=self.ids(table.get("allow_gids"), "site.allow_gids", _gid_of),
        )

    def ids(self, value: object, key: str, by_name: Callable[[str], int]) -> tuple[int, ...] | None:
        """Numeric ids, or names looked up on this machine (``by_name``)."""
        if value is None:
            return None
        ids: list[int] = []
        for index, item in enumerate(self.array(value, key)):
            item_key = f"{key}[{index}]"
            if isinstance(item, str):
                try:
                    number = by_name(self.string(item, item_key))
                except KeyError:
                    raise self.error(item_key, f"no such {_ID_KIND[key]} {item!r}") from None
            elif isinstance(item, int) and not isinstance(item, bool):
                number = self.integer(item, item_key, 0, MAX_ID)
            else:
                raise self.error(
                    item_key,
                    f"expected a numeric id or a {_ID_KIND[key]} name, "
                    f"got {_type_name(item)} {item!r}",
                )
            if number not in ids:
                ids.append(number)
        return tuple(ids)

    def socket_mode(self, value: object) -> int:
        key = "site.socket_mode"
        if isinstance(value, str):
            if not _SOCKET_MODE_STRING.fullmatch(value):
                raise self.error(key, f"{value!r} is not an octal mode like '0660'")
            return int(value.removeprefix("0o"), 8)
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value <= 0o777:
                raise self.error(key, f"{value:#o} is not a file mode (0..0o777)")
            return value
        raise self.error(key, f"expected an integer or an octal string, got {_type_name(value)}")

    def tls(self, value: object, site: str) -> TlsConfig:
        table = self.table(value, "tls", {"ca", "cert", "key"}, {"allow_readable_key"})
        paths = {name: self.file_path(table[name], f"tls.{name}") for name in ("ca", "cert", "key")}
        allow_readable_key: bool = self.typed(
            table.get("allow_readable_key", False), "tls.allow_readable_key", bool, "a boolean"
        )
        data = {name: self.read(path, f"tls.{name}") for name, path in paths.items()}

        try:
            cas = load_ca_certificates(paths["ca"])
        except WangateError as exc:
            raise self.error("tls.ca", str(exc)) from None
        try:
            chain = x509.load_pem_x509_certificates(data["cert"])
        except ValueError:
            raise self.error("tls.cert", f"{paths['cert']} holds no PEM certificate") from None
        try:
            key = serialization.load_pem_private_key(data["key"], password=None)
        except (ValueError, TypeError) as exc:
            raise self.error(
                "tls.key", f"{paths['key']} is not an unencrypted PEM private key: {exc}"
            ) from None
        self.key_permissions(paths["key"], allow_readable_key)
        if key.public_key() != chain[0].public_key():
            raise self.error("tls.key", f"{paths['key']} is not the key of {paths['cert']}")
        try:
            named = verify_site_certificate(chain[0], chain[1:], cas)
        except WangateError as exc:
            raise self.error("tls.cert", f"{paths['cert']}: {exc}") from None
        if named != site:
            raise self.error(
                "tls.cert", f"{paths['cert']} is for site {named!r}, but site.name is {site!r}"
            )
        return TlsConfig(
            ca=paths["ca"],
            cert=paths["cert"],
            key=paths["key"],
            allow_readable_key=allow_readable_key,
        )

    def key_permissions(self, path: Path, allow_readable_key: bool) -> None:
        """A private key is for the daemon's eyes only (like ssh's ``chmod 600`` rule).

        Its group is refused too: the daemon's group is the trainers' group, for the socket.
        """
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError as exc:
            raise self.error("tls.key", f"cannot read {path}: {exc.strerror or exc}") from None
        readers = [
            who
            for bit, who in ((stat.S_IRGRP, "its group"), (stat.S_IROTH, "others"))
            if mode & bit
        ]
        if not readers:
            return
        who = " and ".join(readers)
        if allow_readable_key:
            log.warning(
                "%s: tls.key: %s (mode %04o) is readable by %s; allowed by tls.allow_readable_key",
                self.path,
                path,
                mode,
                who,
            )
            return
        raise self.error(
            "tls.key",
            f"{path} (mode {mode:04o}) is readable by {who}: run `chmod 600 {path}`, "
            "or set allow_readable_key = true in [tls] to accept it",
        )

    def read(self, path: Path, key: str) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise self.error(key, f"cannot read {path}: {exc.strerror or exc}") from None

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
            raise self.error("compression.tags", f"expected a table, got {_type_name(tag_table)}")
        for glob, spec in tag_table.items():
            key = f"compression.tags.{_toml_key(glob)}"
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


__all__ = [
    "MAX_MTU",
    "MIN_MTU",
    "CollectiveConfig",
    "CompressionConfig",
    "Config",
    "LimitsConfig",
    "MetricsConfig",
    "PathConfig",
    "PeerConfig",
    "SiteConfig",
    "TlsConfig",
    "load_config",
    "parse_config",
]
