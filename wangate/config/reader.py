"""The generic checks of a TOML value: its type, shape and range, file paths and
addresses, each failing with a :class:`~wangate.errors.ConfigError` that names the file
and the key."""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path
from typing import Any

from wangate.certs import is_valid_name
from wangate.errors import ConfigError


def type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string"}
    names |= {list: "array", dict: "table"}
    return names.get(type(value), type(value).__name__)


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else '"' + key.replace('"', '\\"') + '"'


class Reader:
    """Checks values of the configuration file ``path``; relative file paths resolve
    against its folder."""

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
            raise self.error(key, f"expected a table, got {type_name(value)}")
        prefix = f"{key}." if key else ""
        allowed = ", ".join(sorted(required | optional))
        for name in value:
            if name not in required and name not in optional:
                where = key or "the top level"
                raise self.error(
                    f"{prefix}{toml_key(name)}", f"unknown key ({where} takes: {allowed})"
                )
        for name in sorted(required):
            if name not in value:
                raise self.error(f"{prefix}{name}", "missing (required)")
        return value

    def typed(self, value: object, key: str, kind: type, kind_name: str) -> Any:
        # bool is an int in Python, never in TOML: keep them apart.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(key, f"expected {kind_name}, got {type_name(value)} {value!r}")
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

    def number(self, value: object, key: str, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"expected a number, got {type_name(value)} {value!r}")
        if not (math.isfinite(value) and low <= value <= high):
            raise self.error(key, f"{value!r} is out of range ({low:g}..{high:g})")
        return float(value)

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
