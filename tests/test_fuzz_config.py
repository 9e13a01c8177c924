"""Fuzzing ``load_config`` in CI: arbitrary bytes, mutated example files, arbitrary TOML
documents, and the valid configuration with one value replaced by anything TOML can hold.
Every file loads or raises ``ConfigError`` (checks in ``tests/fuzz/targets.py``)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import targets
from tests.fuzz.strategies import mutated, seeds
from wangate.certs import create_ca, issue_site_certificate
from wangate.errors import ConfigError, WangateError

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EXAMPLE = seeds("config_file")[0]


@pytest.fixture(scope="module", autouse=True)
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder the fuzzed files are written to, with certs/ for sites bj and sh."""
    folder = tmp_path_factory.mktemp("fuzz-config")
    create_ca(folder / "certs")
    issue_site_certificate(folder / "certs", "bj")
    issue_site_certificate(folder / "certs", "sh")
    saved, targets._config_dir = targets._config_dir, folder
    yield folder
    targets._config_dir = saved


def load(data: bytes) -> None:
    try:
        targets.config_file(data)
    except WangateError as exc:
        assert isinstance(exc, ConfigError)
        assert str(targets.config_dir() / targets.CONFIG_NAME) in str(exc)


def toml_string(text: str) -> str:
    escaped = "".join(
        "\\" + ch
        if ch in '"\\'
        else f"\\u{ord(ch):04x}"
        if ord(ch) < 0x20 or ord(ch) == 0x7F
        else ch
        for ch in text
    )
    return f'"{escaped}"'


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(value, repr(value))
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(document: dict[str, Any]) -> str:
    return "".join(f"{toml_string(key)} = {toml_value(value)}\n" for key, value in document.items())


toml_values = st.recursive(
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["bj", "sh", "certs/ca.pem", "127.0.0.1:7443", "[::1]:1", "0660", "int8"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
KEYS = ["site", "tls", "peers", "limits", "compression", "metrics", "fec", "critical", "name"]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path into a parsed document (tables by key, arrays by index)."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        yield (*prefix, key)
        if isinstance(item, dict | list):
            yield from _paths(item, (*prefix, key))


VALID_DOCUMENT = tomllib.loads(EXAMPLE.decode())
VALID_PATHS = sorted(_paths(VALID_DOCUMENT), key=repr)


@FAST
@given(st.binary(max_size=300))
def test_arbitrary_bytes_load_or_raise_config_errors(data: bytes) -> None:
    load(data)


@FAST
@given(data=st.data())
def test_mutated_example_files_load_or_raise_config_errors(data: st.DataObject) -> None:
    load(data.draw(mutated([EXAMPLE], max_edits=3)))


@FAST
@given(st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), toml_values, max_size=5))
def test_arbitrary_toml_documents_load_or_raise_config_errors(document: dict[str, Any]) -> None:
    text = toml_document(document)
    assert tomllib.loads(text) == document
    load(text.encode())


@FAST
@given(st.sampled_from(VALID_PATHS), toml_values | st.none(), st.text(min_size=1, max_size=8))
def test_one_replaced_value_loads_or_raises_config_errors(
    path: tuple[Any, ...], replacement: Any, extra_key: str
) -> None:
    """The example with one value replaced (None: deleted) and maybe an unknown key added."""
    document = tomllib.loads(EXAMPLE.decode())
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if replacement is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    if isinstance(parent, dict) and extra_key not in parent and len(extra_key) % 2:
        parent[extra_key] = 1
    load(toml_document(document).encode())


def test_the_example_round_trips_through_the_toml_writer() -> None:
    text = toml_document(VALID_DOCUMENT)
    assert tomllib.loads(text) == VALID_DOCUMENT
    targets.config_file(text.encode())  # valid: no error at all


# ------------------------------------------------------------------ findings


def test_deeply_nested_toml_is_a_config_error() -> None:
    # tomllib recurses per nesting level: RecursionError escaped load_config.
    with pytest.raises(ConfigError, match="nested too deeply"):
        targets.config_file(b"a = " + b"[" * 1000 + b"]" * 1000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        targets.config_file(b"a = " + b"{b = " * 1000 + b"1" + b"}" * 1000)


@pytest.mark.parametrize("key", ["tls.ca", "tls.cert", "tls.key", "site.socket"])
def test_nul_in_a_file_path_is_a_config_error(key: str) -> None:
    # Reading "certs/ca\0.pem" raised ValueError (embedded null byte); a socket path with
    # a NUL loaded and only failed when the daemon bound it.
    section, name = key.split(".")
    document = tomllib.loads(EXAMPLE.decode())
    document[section][name] = "certs/x\0.pem"
    with pytest.raises(ConfigError, match=rf"{key}: 'certs/x\\x00.pem' contains a NUL character"):
        targets.config_file(toml_document(document).encode())
