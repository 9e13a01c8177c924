"""The import graph: the sans-IO core loads no I/O and no array libraries, `wangate --help`
loads only what it needs, the probe stands apart from the daemon, and no module imports
one that imports it back."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "wangate"


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(result.stdout.splitlines()[-1]))


def roots(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules} | modules


CORE_MODULES = sorted(
    f"wangate.core.{p.stem}" for p in (PACKAGE / "core").glob("*.py") if p.stem != "__init__"
)


def test_the_core_loads_no_io_no_arrays_and_no_client() -> None:
    # the core imports no asyncio, socket or time; it is driven with `now`
    code = "import wangate.core\n" + "\n".join(f"import {m}" for m in CORE_MODULES)
    loaded = roots(loaded_after(code))
    assert len(CORE_MODULES) > 10 and set(CORE_MODULES) <= loaded
    forbidden = {"numpy", "zstandard", "msgpack", "aioquic", "asyncio", "socket", "selectors"}
    forbidden |= {"wangate.client", "wangate.codec", "wangate.daemon", "wangate.net"}
    assert forbidden & loaded == set()


def test_import_wangate_loads_the_client_only_when_used() -> None:
    loaded = roots(loaded_after("import wangate\nwangate.WangateError"))
    assert {"numpy", "zstandard", "msgpack", "wangate.client"} & loaded == set()
    loaded = roots(loaded_after("import wangate\nwangate.Client, wangate.PartialResult"))
    assert {"numpy", "wangate.client", "wangate.collective"} <= loaded


def test_the_cli_starts_without_the_daemon_client_or_arrays() -> None:
    loaded = roots(loaded_after("import wangate.cli\nwangate.cli.build_parser()"))
    heavy = {"numpy", "zstandard", "aioquic", "cryptography", "prometheus_client", "msgpack"}
    heavy |= {"asyncio"}
    assert heavy & loaded == set()
    assert {m for m in loaded if m.startswith("wangate.")} == {"wangate.cli", "wangate.errors"}


def test_the_probe_does_not_load_the_daemon() -> None:
    loaded = loaded_after("import wangate.probe.net, wangate.probe.analysis")
    assert "wangate.probe.net" in loaded
    assert {"wangate.daemon", "wangate.config", "aioquic", "numpy"} & loaded == set()


def test_attribute_access_to_an_unknown_name_still_fails() -> None:
    import wangate

    with pytest.raises(AttributeError, match="no attribute 'Clients'"):
        _ = wangate.Clients  # type: ignore[attr-defined]


# ---------------------------------------------------------------- cycles


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every wangate module ``path`` imports, at any depth of the file (a function's
    import runs too), but not under ``if TYPE_CHECKING``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor) + (f".{node.module}" if node.module else "")
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return (found & modules) - {name}


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# tensorlike hands a torch tensor to wangate.torch.convert only when given one (torch
# is optional); convert reads tensorlike's dtype markers.
KNOWN_CYCLES = [{"wangate.tensorlike", "wangate.torch.convert"}]


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = import_graph()
    assert "wangate.views" in graph["wangate.demo"]  # the graph sees imports at all
    assert "wangate.demo" in graph["wangate.cli"]  # ... and those inside functions
    assert cycles(graph) == KNOWN_CYCLES


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]


# ---------------------------------------------------------------- layers
# trainer API (localapi, client) -> service (gateway) -> delivery / backends (gateway
# drivers, workers) -> drivers (net) -> session (core): no layer imports one above it.
LAYER_RULES = {
    "wangate.net": {"wangate.localapi", "wangate.delivery", "wangate.gateway", "wangate.workers",
                    "wangate.daemon", "wangate.service", "wangate.client"},
    "wangate.delivery": {"wangate.localapi", "wangate.gateway", "wangate.net", "wangate.workers",
                         "wangate.daemon", "wangate.service", "wangate.client"},
    "wangate.gateway": {"wangate.localapi", "wangate.daemon", "wangate.client",
                        "wangate.workers"},
    "wangate.workers": {"wangate.localapi", "wangate.daemon", "wangate.client"},
    "wangate.localapi": {"wangate.gateway", "wangate.net", "wangate.workers", "wangate.daemon"},
    "wangate.engine": {"wangate.core", "wangate.net", "wangate.localapi", "wangate.delivery",
                       "wangate.gateway", "wangate.workers", "wangate.daemon",
                       "wangate.service", "wangate.client"},
}  # fmt: skip


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_layers_import_only_downwards() -> None:
    graph = import_graph()
    broken = sorted(
        f"{module} imports {target}"
        for package, forbidden in LAYER_RULES.items()
        for module, targets in graph.items()
        if _within(module, package)
        for target in targets
        if any(_within(target, f) for f in forbidden)
    )
    assert broken == []


def test_the_peer_driver_is_the_only_caller_of_the_session() -> None:
    graph = import_graph()
    importers = {m for m, targets in graph.items() if "wangate.core.session" in targets}
    assert importers == {"wangate.net.peer_driver"}
    # and nobody reaches past the driver's read-only view into its session
    reaching = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "peer_driver.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in {"session", "_session"}
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                reaching.append(f"{_module_name(path)}:{node.lineno}")
    assert reaching == []


def test_no_class_subclasses_the_gateway() -> None:
    subclasses = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
                if bases & {"Gateway", "Service", "DriverBackend", "Coordinator"}:
                    subclasses.append(f"{_module_name(path)}.{node.name}")
    assert subclasses == []


def test_no_module_is_over_600_lines() -> None:
    long = {
        _module_name(p): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}


# ---------------------------------------------------------------- bench and the lab


def _imported_roots(file: Path) -> set[str]:
    """Every module ``file`` imports, anywhere in it (top level or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_tests_import_nothing_of_bench_and_the_gateway_nothing_of_the_lab() -> None:
    tests = Path(__file__).resolve().parent
    from_tests = {
        str(f.relative_to(tests)): m
        for f in tests.rglob("*.py")
        for m in _imported_roots(f)
        if m == "bench" or m.startswith("bench.")
    }
    assert from_tests == {}
    lab = PACKAGE / "lab"
    assert (lab / "__init__.py").is_file()
    into_lab = {
        str(f.relative_to(PACKAGE)): m
        for f in PACKAGE.rglob("*.py")
        if lab not in f.parents
        for m in _imported_roots(f)
        if m == "wangate.lab" or m.startswith("wangate.lab.")
    }
    assert into_lab == {}
