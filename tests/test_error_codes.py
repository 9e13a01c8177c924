"""Error codes live in one enum; each says whether it closes the connection."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import wangate
from wangate.core.frames import Ack, Hello
from wangate.core.session import PeerSession
from wangate.errors import ErrorCode, LinkError, RemoteProtocolError
from wangate.localapi.protocol import FATAL_CODES, FrameError, decode_prefix

SOURCE = Path(wangate.__file__).parent


@dataclass(frozen=True)
class CodeLiteral:
    """An error code written as a string where ``ErrorCode`` should name it."""

    where: str  # file:line, from the repository root
    value: str

    def __str__(self) -> str:
        return f"{self.where}: {self.value!r}"


def _string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _strings(node: ast.AST) -> list[str]:
    """The string literals ``node`` is, or holds as a tuple, list or set."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [text for item in node.elts if (text := _string(item)) is not None]
    text = _string(node)
    return [] if text is None else [text]


def _is_code(node: ast.AST) -> bool:
    """``code`` or ``<anything>.code``."""
    return (isinstance(node, ast.Name) and node.id == "code") or (
        isinstance(node, ast.Attribute) and node.attr == "code"
    )


def _callee(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _code_parameters(trees: dict[Path, ast.Module]) -> dict[str, set[int]]:
    """Callable name -> the positions a ``code`` parameter takes in calls to it: for a
    function or method, its own (``self`` not counted); for a class, its ``__init__``'s
    or the nearest base's that has one."""
    functions: dict[str, set[int]] = {}
    inits: dict[str, set[int]] = {}
    bases: dict[str, list[str]] = {}

    def position(args: ast.arguments) -> int | None:
        names = [a.arg for a in args.posonlyargs + args.args]
        if "code" not in names:
            return None
        return names.index("code") - (names[:1] in (["self"], ["cls"]))

    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        index = position(item.args)
                        inits.setdefault(node.name, set())
                        if index is not None:
                            inits[node.name].add(index)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                index = position(node.args)
                if index is not None and node.name != "__init__":
                    functions.setdefault(node.name, set()).add(index)

    def of_class(name: str) -> set[int]:
        if name in inits:
            return inits[name]
        return set().union(*(of_class(base) for base in bases.get(name, ())))

    return functions | {name: found for name in bases if (found := of_class(name))}


def source_trees() -> dict[Path, ast.Module]:
    """Each module of ``wangate/``, by its path from the repository root."""
    return {
        path.relative_to(SOURCE.parent): ast.parse(path.read_text(), str(path))
        for path in sorted(SOURCE.rglob("*.py"))
    }


def code_literals(trees: dict[Path, ast.Module]) -> list[CodeLiteral]:
    """Every place in ``trees`` that writes an error code as a string: passed as
    ``code`` (by keyword, or by position to a callable of ours with a ``code``
    parameter), as a ``code`` parameter's default, assigned to or compared with a
    ``code``, or as the ``"code"`` of a dict literal. In file and line order."""
    parameters = _code_parameters(trees)
    found: list[tuple[Path, int, str]] = []
    for path, tree in trees.items():

        def add(node: ast.AST, values: list[str], path: Path = path) -> None:
            found.extend((path, getattr(node, "lineno", 0), value) for value in values)

        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "code":
                        add(keyword.value, _strings(keyword.value))
                for index in parameters.get(_callee(node) or "", ()):
                    if index < len(node.args):
                        add(node.args[index], _strings(node.args[index]))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                positional = args.posonlyargs + args.args
                with_default = positional[len(positional) - len(args.defaults) :]
                pairs = [
                    *zip(with_default, args.defaults, strict=True),
                    *zip(args.kwonlyargs, args.kw_defaults, strict=True),
                ]
                for arg, default in pairs:
                    if arg.arg == "code" and default is not None:
                        add(default, _strings(default))
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_code(side) for side in sides):
                    for side in sides:
                        add(side, _strings(side))
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if node.value is not None and any(_is_code(t) for t in targets):
                    add(node.value, _strings(node.value))
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if _string(key) == "code":
                        add(value, _strings(value))
    return [CodeLiteral(f"{p.as_posix()}:{line}", value) for p, line, value in sorted(found)]


def test_the_code_finder_finds_each_way_of_writing_a_code() -> None:
    source = """
def f(code: str = "a") -> None: ...
class E(Exception):
    def __init__(self, message: str, code: str = "b") -> None: ...
class F(E): ...
F("m", "c")
E("m", code="d")
x.code == "e" or code in ("f", "g")
x.code = "h"
reply = {"code": "i"}
"""
    trees = {Path("x.py"): ast.parse(source)}
    assert _code_parameters(trees) == {"f": {0}, "E": {1}, "F": {1}}
    assert "".join(literal.value for literal in code_literals(trees)) == "abcdefghi"
    assert str(code_literals(trees)[0]) == "x.py:2: 'a'"


def test_every_code_the_product_uses_is_in_the_enum() -> None:
    known = {code.value for code in ErrorCode}
    unknown = [str(c) for c in code_literals(source_trees()) if c.value not in known]
    assert unknown == []


def test_every_code_is_written_as_an_error_code() -> None:
    # ErrorCode.X, never "x": a misspelt member is an AttributeError (and a mypy error),
    # a misspelt string a code no client knows
    literals = [str(literal) for literal in code_literals(source_trees())]
    assert not literals, "error codes written as strings, not ErrorCode:\n" + "\n".join(literals)


def test_the_codes_that_close_the_connection() -> None:
    closing = sorted(code.value for code in ErrorCode if code.closes_connection)
    assert closing == [
        "access_denied",
        "bad_flags",
        "bad_magic",
        "bad_version",
        "header_too_large",
        "too_large",
        "too_many_connections",
    ]
    assert frozenset(closing) == FATAL_CODES
    assert not ErrorCode.BAD_REQUEST.closes_connection


def test_quic_close_codes() -> None:
    assert [(code.name, code.value, code.unexpected) for code in LinkError] == [
        ("AUTHENTICATION_FAILED", 0x2A, True),
        ("PROTOCOL", 0x102, True),
        ("DUPLICATE", 0x103, False),
        ("SHUTDOWN", 0x104, False),
        ("RESET", 0x105, True),
    ]


def test_a_malformed_frame_from_a_client_is_a_remote_error() -> None:
    with pytest.raises(RemoteProtocolError) as error:
        decode_prefix(b"XX" + bytes(14), 1 << 20)
    assert isinstance(error.value, FrameError) and error.value.code == "bad_magic"


def test_control_frames_are_dispatched_by_type_and_others_are_the_peers_error() -> None:
    session = PeerSession("bj", "sh", max_message_bytes=1 << 20, inbox_window_bytes=1 << 20, now=0)
    session.path_up("a", datagram_bytes=1400, now=0.0)
    session.handle_control("a", Ack(0, 0, ()), 0.1)  # known: handled
    with pytest.raises(RemoteProtocolError, match="unexpected hello frame on path a"):
        session.handle_control("a", Hello("sh", "a", 1, 1 << 20), 0.2)
