"""wangate.Client and wangate.AsyncClient against a real server on a real Unix socket."""

from __future__ import annotations

import asyncio
import os
import socket
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wangate
from tests.selfsite import default_client_settings
from tests.test_localapi_server import GatewayThread, raw_connect, read_reply
from wangate.client import aio
from wangate.codec import encode_tensor
from wangate.localapi.protocol import SendRequest, encode_request


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "gw.sock"


@pytest.fixture
def gateway(sock_path: Path) -> Iterator[GatewayThread]:
    with GatewayThread(sock_path) as running:
        yield running


def same(got: np.ndarray, sent: np.ndarray) -> bool:
    return (
        got.dtype == sent.dtype.newbyteorder("<")
        and got.shape == sent.shape
        and got.tobytes() == np.ascontiguousarray(sent, dtype=got.dtype).tobytes()
    )


rng = np.random.default_rng(7)
ARRAYS: dict[str, np.ndarray] = {
    "f32": rng.standard_normal((3, 5)).astype(np.float32),
    "f16": rng.standard_normal(17).astype(np.float16),
    "f64": rng.standard_normal((2, 2, 2)),
    "bf16_bits": rng.integers(0, 2**16, (4, 4), dtype=np.uint16),
    "bool": rng.integers(0, 2, 9).astype(bool),
    "scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros(0, dtype=np.float32),
    "empty_3d": np.zeros((3, 0, 2), dtype=np.int16),
    "noncontiguous": rng.standard_normal((6, 4)).astype(np.float32).T,
    "big_endian": np.arange(10, dtype=">i4"),
    "nan_inf": np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32),
    **{
        f"{kind}{bits}": rng.integers(
            np.iinfo(f"{kind}{bits}").min,
            np.iinfo(f"{kind}{bits}").max,
            33,
            dtype=f"{kind}{bits}",
            endpoint=True,
        )
        for kind in ("int", "uint")
        for bits in (8, 16, 32, 64)
    },
}


def test_round_trips_are_byte_identical(gateway: GatewayThread) -> None:
    with wangate.Client(gateway.path) as gw:
        ids = [gw.send("bj", name, array, step=i) for i, (name, array) in enumerate(ARRAYS.items())]
        assert ids == list(range(1, len(ARRAYS) + 1))
        for i, (name, array) in enumerate(ARRAYS.items()):
            got = gw.recv(name, source="bj", step=i, timeout=5)
            assert same(got, array), name


def test_64_mib_round_trip(gateway: GatewayThread) -> None:
    array = np.random.default_rng(1).standard_normal(16 << 20).astype(np.float32)
    with wangate.Client(gateway.path) as gw:
        gw.send("bj", "big", array, step=1)
        got = gw.recv("big", timeout=10)
    assert got.nbytes == 64 << 20
    assert same(got, array)


def test_recv_matches_tag_source_step_oldest_first(gateway: GatewayThread) -> None:
    with wangate.Client(gateway.path) as gw:
        for step in (3, 1, 2):
            gw.send("bj", "g", np.full(2, step, dtype=np.int64), step=step)
        gw.send("bj", "h", np.full(2, 9, dtype=np.int64), step=1)
        assert gw.recv("g", step=2, timeout=1).tolist() == [2, 2]
        assert gw.recv("g", source="bj", timeout=1).tolist() == [3, 3]
        assert gw.recv("h", timeout=1).tolist() == [9, 9]
        assert gw.recv("g", timeout=1).tolist() == [1, 1]
        with pytest.raises(wangate.RecvTimeout) as info:
            gw.recv("g", timeout=0.05)
        assert info.value.code == "timeout" and isinstance(info.value, TimeoutError)
        with pytest.raises(wangate.RecvTimeout):
            gw.recv("h", source="sh", timeout=0)
        gw.ping()  # the connection is fine after timeouts


def test_one_trainer_receives_what_another_sends(gateway: GatewayThread) -> None:
    with wangate.Client(gateway.path) as a, wangate.Client(gateway.path) as b:
        a.send("bj", "layer3.grad", np.arange(6, dtype=np.float32).reshape(2, 3), step=12)
        got = b.recv("layer3.grad", source="bj", step=12, timeout=5)
    assert got.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_status_paths_ping_and_site(gateway: GatewayThread) -> None:
    with wangate.Client(gateway.path) as gw:
        assert gw.site == "bj"
        assert gw.settings == default_client_settings(gateway.server.max_message_bytes)
        gw.send("bj", "s", np.zeros(1))
        status = gw.status()
        assert status["site"] == "bj" and status["version"] == wangate.__version__
        assert status["local_messages"] == 1 and status["inbox"]["queued"] == 1
        assert gw.paths() == []
        gw.ping()


def test_errors_are_wangate_errors_with_codes(gateway: GatewayThread) -> None:
    with wangate.Client(gateway.path) as gw:
        with pytest.raises(wangate.GatewayError) as info:
            gw.send("sh", "x", np.zeros(3))
        assert info.value.code == "unknown_peer"
        assert isinstance(info.value, wangate.WangateError)
        too_big = np.zeros(gateway.server.max_message_bytes + 1, dtype=np.uint8)
        with pytest.raises(wangate.GatewayError) as info:
            gw.send("bj", "x", too_big)
        assert info.value.code == "too_large"
        gw.ping()


def test_unreachable_gateway_says_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sock"
    with pytest.raises(wangate.GatewayUnavailable) as info:
        wangate.Client(missing)
    assert str(info.value) == (
        f"cannot reach wangate at {missing}: no such file (is `wangate run` running?)"
    )
    stale = tmp_path / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(os.fspath(stale))
    dead.close()
    with pytest.raises(wangate.GatewayUnavailable) as info:
        wangate.Client(stale)
    assert "nothing is listening" in str(info.value)

    async def connect() -> None:
        async with wangate.AsyncClient(missing):
            pass

    with pytest.raises(wangate.GatewayUnavailable) as info:
        asyncio.run(connect())
    assert "no such file" in str(info.value)


def test_socket_path_from_environment(
    gateway: GatewayThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANGATE_SOCKET", os.fspath(gateway.path))
    with wangate.Client() as gw:
        assert gw.site == "bj"


def test_gateway_going_away_raises_unavailable(sock_path: Path) -> None:
    with GatewayThread(sock_path) as gateway:
        gw = wangate.Client(gateway.path)
    with pytest.raises(wangate.GatewayUnavailable) as info:
        gw.ping()
    assert "lost the connection" in str(info.value)
    with pytest.raises(wangate.GatewayUnavailable):
        gw.ping()


def test_damaged_message_raises_checksum_error(gateway: GatewayThread) -> None:
    encoded = encode_tensor(np.arange(4, dtype=np.float32))
    payload = bytes(encoded.payload[:-1]) + bytes([encoded.payload[-1] ^ 1])  # a bit flip
    wrong = zlib.crc32(payload, zlib.crc32(encoded.meta))  # the transport saw these bytes
    sock = raw_connect(gateway.path)
    sock.sendall(
        encode_request(SendRequest(1, "bj", "bad", 0, False, encoded.meta, wrong), len(payload))
        + payload
    )
    assert read_reply(sock)[0]["ok"] is True
    with wangate.Client(gateway.path) as gw:
        with pytest.raises(wangate.ChecksumError):
            gw.recv("bad", timeout=1)
        gw.ping()
    sock.close()


def test_policy_from_hello_and_error_feedback_per_peer_and_tag(sock_path: Path) -> None:
    settings = {
        "compression": {
            "default": "none",
            "tags": [["*.sparse", "topk:0.5/fp32"]],
            "min_lossy_bytes": 0,
        },
        "max_message_bytes": 1 << 20,
    }
    array = np.array([1.0, 0.75], dtype=np.float32)
    with GatewayThread(sock_path, client_settings=settings), wangate.Client(sock_path) as gw:
        sent = []
        for tag in ("a.sparse", "a.sparse", "b.sparse", "a.dense"):
            gw.send("bj", tag, array)
            sent.append(gw.recv(tag, timeout=1).tolist())
    # top-1 of 2 drops 0.75 the first time; error feedback carries it into the next send
    # of the same (peer, tag) only.
    assert sent == [[1.0, 0.0], [0.0, 1.5], [1.0, 0.0], [1.0, 0.75]]


def test_codec_override_per_call(gateway: GatewayThread) -> None:
    array = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
    with wangate.Client(gateway.path) as gw:
        gw.send("bj", "c", array, codec="fp16")
        got = gw.recv("c", timeout=1)
    assert got.dtype == np.float32
    assert np.array_equal(got, array.astype(np.float16).astype(np.float32))


# ------------------------------------------------------------------ asyncio


def test_async_client_concurrent_calls_on_one_connection(gateway: GatewayThread) -> None:
    async def scenario() -> None:
        async with wangate.AsyncClient(gateway.path) as gw:
            assert gw.site == "bj"
            array = np.arange(1000, dtype=np.int32).reshape(10, 100)
            got, message_id = await asyncio.gather(
                gw.recv("a", source="bj", step=5, timeout=5),
                gw.send("bj", "a", array, step=5),
            )
            assert message_id == 1
            assert same(got, array)
            with pytest.raises(wangate.RecvTimeout):
                await gw.recv("a", timeout=0.01)
            assert (await gw.status())["site"] == "bj"
            assert await gw.paths() == []
            await gw.ping()

    asyncio.run(scenario())


def test_async_cancelled_call_leaves_connection_usable(gateway: GatewayThread) -> None:
    async def scenario() -> None:
        async with wangate.AsyncClient(gateway.path) as gw:
            waiting = asyncio.create_task(gw.recv("never", timeout=None))
            await asyncio.to_thread(gateway.wait_for_waiters, 1)  # the gateway holds the recv
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await gw.send("bj", "after", np.ones(3, dtype=np.uint8))
            assert (await gw.recv("after", timeout=1)).tolist() == [1, 1, 1]

    asyncio.run(scenario())


def test_fifty_concurrent_clients(gateway: GatewayThread) -> None:
    count = 50

    async def trainer(i: int) -> bool:
        async with wangate.AsyncClient(gateway.path) as gw:
            array = np.full((64, 64), i, dtype=np.float32)
            await gw.send("bj", f"to{(i + 1) % count}", array, step=i)
            got = await gw.recv(f"to{i}", step=(i - 1) % count, timeout=20)
            return bool(same(got, np.full((64, 64), (i - 1) % count, dtype=np.float32)))

    async def scenario() -> list[bool]:
        return list(await asyncio.gather(*(trainer(i) for i in range(count))))

    assert asyncio.run(scenario()) == [True] * count
    assert gateway.service.received == count


def test_async_gateway_going_away_fails_pending_calls(sock_path: Path) -> None:
    gateway = GatewayThread(sock_path).__enter__()

    async def scenario() -> None:
        async with wangate.AsyncClient(sock_path) as gw:
            waiting = asyncio.create_task(gw.recv("x", timeout=None))
            await asyncio.to_thread(gateway.wait_for_waiters, 1)
            await asyncio.get_running_loop().run_in_executor(None, gateway.__exit__)
            with pytest.raises(wangate.GatewayUnavailable):
                await asyncio.wait_for(waiting, 5)
            with pytest.raises(wangate.GatewayUnavailable):
                await gw.ping()

    asyncio.run(scenario())


def test_async_requests_go_out_at_once_and_a_partial_write_ends_whole(
    gateway: GatewayThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame the socket takes whole goes out in the call itself; what a full socket
    leaves goes by a task, and no other frame comes between (three at once)."""
    waited: list[int] = []
    real = aio.sock_send_rest

    async def spy(loop: asyncio.AbstractEventLoop, sock: socket.socket, rest: list[Any]) -> None:
        waited.append(sum(memoryview(part).nbytes for part in rest))
        await real(loop, sock, rest)

    monkeypatch.setattr(aio, "sock_send_rest", spy)
    small = np.arange(100, dtype=np.int32)
    large = [rng.integers(0, 256, 200_000, dtype=np.uint8) for _ in range(3)]  # in-band

    async def scenario() -> None:
        async with wangate.AsyncClient(gateway.path) as gw:
            await gw.send("bj", "small", small)
            assert waited == []
            assert gw._sock is not None
            gw._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            await asyncio.gather(*(gw.send("bj", f"large{i}", a) for i, a in enumerate(large)))
            assert waited and all(0 < size < 200_000 + 1024 for size in waited)
            for i, array in enumerate(large):
                assert same(await gw.recv(f"large{i}", timeout=5), array)
            assert same(await gw.recv("small", timeout=5), small)

    asyncio.run(scenario())
