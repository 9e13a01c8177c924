"""Client(timeout=) and AsyncClient(timeout=): connect and hello are bounded.

Real Unix sockets: a listener that accepts and never answers, one whose backlog is
full (it never accepts), and paths nobody listens on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import wangate
from tests.test_localapi_server import GatewayThread

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 0.5
SLACK_S = 1.0  # scheduling on a shared 2-core machine; the bound is TIMEOUT_S + this


class SilentListener:
    """Accepts every connection and reads what comes, but never answers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(os.fspath(path))
        self.listener.listen(8)
        self.accepted: list[socket.socket] = []
        self.received = bytearray()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(conn)
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                self.received += conn.recv(4096)

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(5)
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[SilentListener]:
    listener = SilentListener(tmp_path / "silent.sock")
    yield listener
    listener.close()


@pytest.fixture
def full_backlog(tmp_path: Path) -> Iterator[Path]:
    """A listener that never accepts, its backlog (0: one connection) already taken."""
    path = tmp_path / "full.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.fspath(path))
    listener.listen(0)
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    first.connect(os.fspath(path))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    with pytest.raises(BlockingIOError):  # the backlog is full indeed
        probe.connect(os.fspath(path))
    probe.close()
    yield path
    first.close()
    listener.close()


def hello_timeout_message(path: Path) -> str:
    return (
        f"wangate at {path} did not answer hello within 0.5 s "
        "(the daemon is stuck or overloaded, or something else listens there)"
    )


def connect_timeout_message(path: Path) -> str:
    return (
        f"connecting to wangate at {path} timed out after 0.5 s "
        "(its backlog is full: the daemon is not accepting connections)"
    )


def test_a_listener_that_never_answers_hello_times_out(silent: SilentListener) -> None:
    started = time.monotonic()
    with pytest.raises(wangate.GatewayUnavailable) as info:
        wangate.Client(silent.path, timeout=TIMEOUT_S)
    elapsed_s = time.monotonic() - started
    assert str(info.value) == hello_timeout_message(silent.path)
    assert info.value.code == "connect_timeout"
    assert TIMEOUT_S <= elapsed_s < TIMEOUT_S + SLACK_S
    # the client did send its hello: id 1, op "hello"
    deadline = time.monotonic() + 5
    while not silent.received and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bytes(silent.received) == bytes.fromhex(
        "574701000000000e000000000000000082a26f70a568656c6c6fa2696401"
    )


def test_a_full_backlog_times_out_connecting(full_backlog: Path) -> None:
    started = time.monotonic()
    with pytest.raises(wangate.GatewayUnavailable) as info:
        wangate.Client(full_backlog, timeout=TIMEOUT_S)
    elapsed_s = time.monotonic() - started
    assert str(info.value) == connect_timeout_message(full_backlog)
    assert info.value.code == "connect_timeout"
    assert TIMEOUT_S <= elapsed_s < TIMEOUT_S + SLACK_S


def test_async_client_times_out_on_hello_and_on_connect(
    silent: SilentListener, full_backlog: Path
) -> None:
    async def attempt(path: Path) -> tuple[wangate.GatewayUnavailable, float]:
        started = time.monotonic()
        client = wangate.AsyncClient(path, timeout=TIMEOUT_S)
        with pytest.raises(wangate.GatewayUnavailable) as info:
            await client.connect()
        elapsed_s = time.monotonic() - started
        with pytest.raises(wangate.GatewayUnavailable) as closed:
            await client.ping()  # the failed client is closed, not half-open
        assert closed.value.code in ("closed", "connect_timeout")
        return info.value, elapsed_s

    error, elapsed_s = asyncio.run(attempt(silent.path))
    assert str(error) == hello_timeout_message(silent.path)
    assert error.code == "connect_timeout"
    assert TIMEOUT_S <= elapsed_s < TIMEOUT_S + SLACK_S
    error, elapsed_s = asyncio.run(attempt(full_backlog))
    assert str(error) == connect_timeout_message(full_backlog)
    assert TIMEOUT_S <= elapsed_s < TIMEOUT_S + SLACK_S


def test_no_listener_fails_at_once_not_after_the_timeout(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sock"
    stale = tmp_path / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(os.fspath(stale))
    dead.close()  # the file stays; nothing listens on it
    expected = {
        missing: f"cannot reach wangate at {missing}: no such file (is `wangate run` running?)",
        stale: f"cannot reach wangate at {stale}: nothing is listening on it "
        "(is `wangate run` running?)",
    }
    for path, message in expected.items():
        started = time.monotonic()
        with pytest.raises(wangate.GatewayUnavailable) as info:
            wangate.Client(path, timeout=10)
        assert str(info.value) == message
        assert info.value.code == "unavailable"

        async def attempt(target: Path = path) -> None:
            await wangate.AsyncClient(target, timeout=10).connect()

        with pytest.raises(wangate.GatewayUnavailable) as info:
            asyncio.run(attempt())
        assert str(info.value) == message
        assert time.monotonic() - started < 2.0  # both, far below the 10 s timeout


def test_a_working_gateway_is_unaffected_by_the_timeout(tmp_path: Path) -> None:
    """After hello the timeout no longer applies: a recv may wait longer than it."""
    with GatewayThread(tmp_path / "gw.sock") as gateway:
        with wangate.Client(gateway.path, timeout=TIMEOUT_S) as gw:
            assert gw.site == "bj"
            with pytest.raises(wangate.RecvTimeout):
                gw.recv("nothing", timeout=TIMEOUT_S + 0.3)
            gw.ping()

        async def use() -> str:
            async with wangate.AsyncClient(gateway.path, timeout=TIMEOUT_S) as gw:
                with pytest.raises(wangate.RecvTimeout):
                    await gw.recv("nothing", timeout=TIMEOUT_S + 0.3)
                await gw.ping()
                return gw.site

        assert asyncio.run(use()) == "bj"


def test_an_infinite_or_huge_timeout_means_no_bound(tmp_path: Path) -> None:
    with GatewayThread(tmp_path / "gw.sock") as gateway:
        for timeout in (float("inf"), 1e30, None):
            with wangate.Client(gateway.path, timeout=timeout) as gw:
                gw.ping()

            async def use(limit: float | None = timeout) -> str:
                async with wangate.AsyncClient(gateway.path, timeout=limit) as gw:
                    return gw.site

            assert asyncio.run(use()) == "bj"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("-inf")])
def test_a_timeout_must_be_positive(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        wangate.Client(tmp_path / "x.sock", timeout=bad)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        wangate.AsyncClient(tmp_path / "x.sock", timeout=bad)
