"""The start-up check of aioquic's private parts fails loudly, naming what moved."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeGuard

import aioquic.tls
import pytest
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.quic.connection import QuicConnection
from aioquic.quic.recovery import QuicPacketRecovery
from aioquic.quic.stream import QuicStreamSender

from wangate.config import load_config
from wangate.daemon import Gateway
from wangate.errors import GatewayError
from wangate.loopback import write_site_configs
from wangate.net import aioquic_compat
from wangate.net.aioquic_compat import AioquicIncompatible, check_aioquic


def test_the_installed_aioquic_passes() -> None:
    check_aioquic()


def _drop_after_init(monkeypatch: pytest.MonkeyPatch, cls: type, attribute: str) -> None:
    original = vars(cls)["__init__"]

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        delattr(self, attribute)

    monkeypatch.setattr(cls, "__init__", init)


@pytest.mark.parametrize(
    ("cls", "attribute", "owner"),
    [
        (QuicConnection, "_network_paths", "QuicConnection"),
        (QuicConnection, "_cryptos", "QuicConnection"),
        (QuicConnection, "_handshake_complete", "QuicConnection"),
        (QuicConnection, "_peer_cid", "QuicConnection"),
        (QuicConnection, "_original_destination_connection_id", "QuicConnection"),
        (QuicConnection, "_streams", "QuicConnection"),
        (QuicPacketRecovery, "_pacer", "QuicPacketRecovery"),
        (QuicPacketRecovery, "_rtt_smoothed", "QuicPacketRecovery"),
        (QuicConnectionProtocol, "_quic", "QuicConnectionProtocol"),
        (QuicConnectionProtocol, "_timer", "QuicConnectionProtocol"),
        (QuicConnectionProtocol, "_connection_id_issued_handler", "QuicConnectionProtocol"),
        (QuicServer, "_transport", "QuicServer"),
        (QuicStreamSender, "_buffer", "QuicStreamSender"),
        (aioquic.tls.Context, "_request_client_certificate", "tls.Context"),
        (aioquic.tls.Context, "_peer_certificate", "tls.Context"),
        (aioquic.tls.Context, "_peer_certificate_chain", "tls.Context"),
    ],
)
def test_a_moved_attribute_is_named(
    monkeypatch: pytest.MonkeyPatch, cls: type, attribute: str, owner: str
) -> None:
    _drop_after_init(monkeypatch, cls, attribute)
    with pytest.raises(AioquicIncompatible) as error:
        check_aioquic()
    assert f"{owner} has no attribute {attribute!r}" in str(error.value)
    assert f"aioquic {aioquic.__version__}" in str(error.value)


@pytest.mark.parametrize(
    ("cls", "attribute", "owner"),
    [
        (QuicConnection, "_replenish_connection_ids", "QuicConnection"),
        (QuicConnectionProtocol, "_process_events", "QuicConnectionProtocol"),
        (QuicConnectionProtocol, "_transmit_soon", "QuicConnectionProtocol"),
    ],
)
def test_a_moved_method_is_named(
    monkeypatch: pytest.MonkeyPatch, cls: type, attribute: str, owner: str
) -> None:
    monkeypatch.delattr(cls, attribute)
    with pytest.raises(AioquicIncompatible) as error:
        check_aioquic()
    assert f"{owner} has no attribute {attribute!r}" in str(error.value)


def test_an_initialize_hook_that_is_never_called_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # an aioquic whose connect() builds its TLS context some other way
    monkeypatch.setattr(aioquic_compat, "after_initialize", lambda connection, hook: None)
    with pytest.raises(AioquicIncompatible, match="no attribute '_initialize'"):
        check_aioquic()


def test_the_daemon_refuses_to_start_with_an_incompatible_aioquic(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _drop_after_init(monkeypatch, QuicConnection, "_network_paths")
    _, sh_site = write_site_configs(tmp_path, 2, 1, mtu=1500)
    gateway = Gateway(load_config(sh_site.config_path))

    async def start() -> None:
        try:
            await gateway.start()
        finally:
            await gateway.close()

    with pytest.raises(GatewayError) as error:
        asyncio.run(start())
    assert error.value.code == "startup"
    assert "'_network_paths'" in str(error.value)
    assert not sh_site.socket_path.exists()  # it stopped before listening


# ------------------------------------------------- only aioquic_compat reads aioquic's privates

REPO = Path(__file__).resolve().parent.parent
COMPAT = REPO / "wangate" / "net" / "aioquic_compat.py"
# What a QuicConnectionProtocol's subclass is written against (aioquic's own examples
# and its HTTP/3 code use them): a PathLink may read these of itself.
PROTOCOL_STATE = frozenset({"_quic", "_loop", "_transport"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self_store(node: ast.AST) -> TypeGuard[ast.Attribute]:
    """``self.<name> = ...``"""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _own_names(cls: ast.ClassDef) -> set[str]:
    """What a class defines itself: its methods and fields, and what it assigns to ``self``."""
    names: set[str] = set()
    for item in cls.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    names.update(node.attr for node in ast.walk(cls) if _is_self_store(node))
    return names


def _base_names(cls: ast.ClassDef) -> list[str]:
    return [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in cls.bases]


def _classes(trees: Iterable[ast.Module]) -> dict[str, list[ast.ClassDef]]:
    classes: dict[str, list[ast.ClassDef]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)
    return classes


def _names(classes: dict[str, list[ast.ClassDef]], name: str, seen: frozenset[str]) -> set[str]:
    """What class ``name`` and its bases among ``classes`` define."""
    if name in seen:
        return set()
    found: set[str] = set()
    for cls in classes.get(name, ()):
        found |= _own_names(cls)
        for base in _base_names(cls):
            found |= _names(classes, base, seen | {name})
    return found


def aioquic_private_names() -> dict[str, frozenset[str]]:
    """Each aioquic class's private attributes and methods, inherited ones included."""
    package = Path(aioquic.__file__).parent
    classes = _classes(ast.parse(path.read_text(), str(path)) for path in package.rglob("*.py"))
    return {
        name: frozenset(n for n in _names(classes, name, frozenset()) if _private(n))
        for name in classes
    }


def private_aioquic_uses(
    trees: dict[Path, ast.Module], private: dict[str, frozenset[str]]
) -> list[str]:
    """file:line of each read or write of aioquic's private attributes, and of each import
    of a private aioquic module. ``x.<name>`` is aioquic's when an aioquic class has a
    private ``<name>``; but ``self.<name>`` is ours where the class, or a base class of
    ours, defines it, unless the class subclasses an aioquic class that has it."""
    any_private = frozenset().union(*private.values())
    ours = _classes(trees.values())

    def aioquic_bases(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if name in seen:
            return set()
        found: set[str] = set()
        for cls in ours.get(name, ()):
            for base in _base_names(cls):
                if base in ours:
                    found |= aioquic_bases(base, seen | {name})
                elif base in private:
                    found.add(base)
        return found

    def is_aioquic(cls: ast.ClassDef | None, node: ast.Attribute) -> bool:
        if node.attr not in any_private:
            return False
        if cls is None or not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            return True
        bases = aioquic_bases(cls.name)
        if any(node.attr in private[base] for base in bases):
            return not ("QuicConnectionProtocol" in bases and node.attr in PROTOCOL_STATE)
        return node.attr not in _names(ours, cls.name, frozenset())

    found: list[str] = []
    for path, tree in trees.items():

        def visit(node: ast.AST, cls: ast.ClassDef | None, path: Path = path) -> None:
            if isinstance(node, ast.ClassDef):
                cls = node
            where = f"{path.as_posix()}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and is_aioquic(cls, node):
                found.append(f"{where}: {ast.unparse(node)}")
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            for module in modules:
                parts = module.split(".")
                if parts[0] == "aioquic" and any(_private(part) for part in parts):
                    found.append(f"{where}: import {module}")
            for child in ast.iter_child_nodes(node):
                visit(child, cls)

        visit(tree, None)
    return found


def _repository_trees() -> dict[Path, ast.Module]:
    paths = [p for top in ("wangate", "bench", "examples") for p in (REPO / top).rglob("*.py")]
    return {
        path.relative_to(REPO): ast.parse(path.read_text(), str(path))
        for path in sorted(paths)
        if path != COMPAT
    }


def test_the_private_use_finder_sees_through_names_and_classes() -> None:
    source = """
import aioquic._buffer
class Link(QuicConnectionProtocol):
    def go(self) -> None:
        self._quic.send()
        self._closed = True
    def other(self, protocol) -> None:
        protocol._quic._loss
        self._transmit_soon()
class Ours:
    def __init__(self) -> None:
        self._timer = None
    def go(self) -> None:
        self._timer
"""
    found = private_aioquic_uses({Path("x.py"): ast.parse(source)}, aioquic_private_names())
    assert found == [
        "x.py:2: import aioquic._buffer",
        "x.py:6: self._closed",
        "x.py:8: protocol._quic._loss",
        "x.py:8: protocol._quic",
        "x.py:9: self._transmit_soon",
    ]


def test_only_aioquic_compat_touches_aioquic_private_attributes() -> None:
    found = private_aioquic_uses(_repository_trees(), aioquic_private_names())
    assert not found, "aioquic's private parts outside aioquic_compat:\n" + "\n".join(found)
