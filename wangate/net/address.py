"""How an address is written for people: ``host:port``, IPv6 hosts in brackets (RFC 3986
3.2.2), the way the config's ``listen``/``remote`` keys take them."""

from __future__ import annotations


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
