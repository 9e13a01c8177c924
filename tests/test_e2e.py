"""Real daemons on loopback, three QUIC paths, trainers on real Unix sockets."""

from __future__ import annotations

import os
import signal
import threading
import time
import zlib
from collections.abc import Iterator

import numpy as np
import pytest

import wangate
from wangate.loopback import LoopbackSites

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    with LoopbackSites(2, 3, directory=tmp_path_factory.mktemp("sites")) as lab:
        yield lab


def bulk(source: str, index: int) -> np.ndarray:
    return np.random.default_rng([ord(source[0]), index]).standard_normal(8 * MiB, np.float32)


def small(source: str, index: int) -> np.ndarray:
    rng = np.random.default_rng([ord(source[0]), 10_000 + index])
    return rng.integers(-1000, 1000, size=1 + index % 257, dtype=np.int32)


@pytest.mark.slow
def test_bulk_and_small_messages_both_ways_arrive_identical(sites: LoopbackSites) -> None:
    """128 MiB of float32 in 32 MiB messages each way at once, plus 1,000 small ones."""
    names = ("bj", "sh")
    received: dict[tuple[str, str, int], bytes] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def sender(site: str, peer: str) -> None:
        try:
            with sites[site].client() as gw:
                for i in range(4):
                    gw.send(peer, "bucket", bulk(site, i), step=i)
                for i in range(500):
                    gw.send(peer, "small", small(site, i), step=i, critical=i % 10 == 0)
        except BaseException as exc:
            errors.append(exc)

    def receiver(site: str, peer: str) -> None:
        try:
            with sites[site].client() as gw:
                for i in range(4):
                    arr = gw.recv("bucket", source=peer, step=i, timeout=120)
                    with lock:
                        received[(peer, "bucket", i)] = arr.tobytes()
                for i in range(500):
                    arr = gw.recv("small", source=peer, step=i, timeout=60)
                    with lock:
                        received[(peer, "small", i)] = arr.tobytes()
        except BaseException as exc:
            errors.append(exc)

    pairs = [(a, b) for a in names for b in names if a != b]
    threads = [threading.Thread(target=receiver, args=pair) for pair in pairs]
    threads += [threading.Thread(target=sender, args=pair) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(received) == 2 * (4 + 500)
    for source in names:
        for i in range(4):
            want = bulk(source, i)
            got = received[(source, "bucket", i)]
            assert len(got) == 32 * MiB
            assert zlib.crc32(got) == zlib.crc32(want.tobytes())
            assert got == want.tobytes()
        for i in range(500):
            assert received[(source, "small", i)] == small(source, i).tobytes()

    for name in names:
        with sites[name].client() as gw:
            rows = gw.paths()
        assert {r["path"] for r in rows} == {"fiber-a", "fiber-b", "fiber-c"}
        for row in rows:
            assert row["state"] != "down", row
            # every path carried part of the 128 MiB each way (the critical route less:
            # while critical messages flow, bulk keeps off it whenever it shows a queue)
            assert row["sent_bytes"] > 1 * MiB, row
            assert row["recv_bytes"] > 1 * MiB, row


def test_status_counts_the_messages(sites: LoopbackSites) -> None:
    with sites["bj"].client() as gw:
        before = gw.status()["peers"]["sh"]["messages_sent"]
        gw.send("sh", "count", np.arange(10, dtype=np.int64), step=1)
    with sites["sh"].client() as gw:
        got = gw.recv("count", source="bj", step=1, timeout=30)
    assert got.tolist() == list(range(10))
    # the sender counts a message once the last of its acks is back, a moment after delivery
    deadline = time.monotonic() + 10
    with sites["bj"].client() as gw:
        while (status := gw.status())["peers"]["sh"]["messages_sent"] == before:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert status["site"] == "bj"
    assert status["peers"]["sh"]["messages_sent"] == before + 1
    assert status["peers"]["sh"]["paths_up"] == ["fiber-a", "fiber-b", "fiber-c"]


def test_unknown_peer_is_a_clear_error_and_the_daemon_keeps_serving(
    sites: LoopbackSites,
) -> None:
    with sites["bj"].client() as gw:
        with pytest.raises(wangate.GatewayError) as info:
            gw.send("nowhere", "x", np.zeros(4, np.float32), step=0)
        assert info.value.code == "unknown_peer"
        assert "nowhere" in str(info.value)
        gw.send("sh", "after", np.ones(3, np.float32), step=0)
    with sites["sh"].client() as gw:
        assert gw.recv("after", source="bj", step=0, timeout=30).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.single_process  # counts the bytes of one session
def test_a_path_reset_mid_transfer_loses_nothing(sites: LoopbackSites) -> None:
    """Kill one path's connection while a 128 MiB message crosses: the others finish it.
    The receiving daemon is stopped (SIGSTOP) while the message starts, so that the cut
    lands with the path's sent data unacknowledged however fast or busy the host is."""
    arr = np.random.default_rng(7).standard_normal(32 * MiB, np.float32)
    result: dict[str, np.ndarray] = {}

    def receive() -> None:
        with sites["sh"].client() as gw:
            result["got"] = gw.recv("reset", source="bj", step=0, timeout=120)

    receiver = threading.Thread(target=receive)
    receiver.start()
    receiving = sites.pids(sites["sh"])
    with sites["bj"].client() as gw:
        before = {r["path"]: r["sent_bytes"] for r in gw.paths()}
        before_status = gw.status()["peers"]["sh"]
        for pid in receiving:
            os.kill(pid, signal.SIGSTOP)
        try:
            gw.send("sh", "reset", arr, step=0)
            # wait until fiber-b has sent part of the message (none of it acknowledged),
            # then cut its connection
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                rows = {r["path"]: r for r in gw.paths()}
                if rows["fiber-b"]["sent_bytes"] - before["fiber-b"] > 16 * 1024:
                    break
            else:
                pytest.fail("fiber-b never carried 16 KiB of the message")
            gw.reset_path("sh", "fiber-b")
        finally:
            for pid in receiving:
                os.kill(pid, signal.SIGCONT)
        receiver.join()
        status = gw.status()["peers"]["sh"]
    assert result["got"].tobytes() == arr.tobytes()
    # what was in flight on the cut path was made up for (repair symbols or ranges), and
    # not one byte of the message went out twice as new data
    made_up = sum(status[k] - before_status[k] for k in ("repair_bytes", "fec_bytes"))
    assert 0 < made_up < arr.nbytes // 4
    assert 0 <= status["source_bytes"] - before_status["source_bytes"] - arr.nbytes < 1024
    log = sites["bj"].log_path.read_text()
    assert "sh/fiber-b: connection reset by operator" in log
    sites.wait_all_paths_up(timeout_s=20)  # and the path comes back by itself


def test_reset_of_an_unknown_path_is_refused(sites: LoopbackSites) -> None:
    with sites["bj"].client() as gw, pytest.raises(wangate.GatewayError) as info:
        gw.reset_path("sh", "no-such-path")
    assert info.value.code == "unknown_path"


@pytest.mark.slow
def test_one_gibibyte_message_arrives_identical(sites: LoopbackSites) -> None:
    """The largest size the contract promises, through both daemons and both sockets."""
    arr = np.arange(256 * MiB, dtype=np.uint32)  # 1 GiB, every word distinct
    arr[::4096] ^= 0xA5A5A5A5
    result: dict[str, np.ndarray] = {}

    def receive() -> None:
        with sites["sh"].client() as gw:
            result["got"] = gw.recv("gib", source="bj", step=0, timeout=300)

    receiver = threading.Thread(target=receive)
    receiver.start()
    with sites["bj"].client() as gw:
        gw.send("sh", "gib", arr, step=0)
    receiver.join()
    got = result["got"]
    assert got.dtype == np.uint32 and got.shape == arr.shape
    assert np.array_equal(got, arr)
