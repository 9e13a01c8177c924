"""Streamed delivery: a large message read while it arrives (proto/localapi.md,
"Streamed delivery"). Real daemons, real QUIC, real Unix sockets and descriptors.

Where a test needs the message still in flight, it pauses the sending daemon itself
(SIGSTOP) once the receiver has seen part of it, and resumes it (SIGCONT) after.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import wangate
from tests.selfsite import default_client_settings
from tests.test_localapi_segments import assert_only_kept_segments, daemon_pid, rss_anon_kib
from wangate.codec import encode_tensor
from wangate.core.message import message_checksum
from wangate.localapi.protocol import SendRequest, encode_request
from wangate.loopback import LoopbackSites
from wangate.shm import RECV_NAME, SEND_NAME, SIZE_SEALS, new_segment, seal

from .test_localapi_segments import segment_count
from .test_localapi_server import GatewayThread, read_reply

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    with LoopbackSites(2, 1, directory=tmp_path_factory.mktemp("sites")) as lab:
        lab.wait_all_paths_up()
        yield lab


class Paused:
    """The daemon ``pid`` stopped (SIGSTOP) for the ``with`` block: it sends nothing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> Paused:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def test_a_large_message_is_read_while_it_arrives(sites: LoopbackSites) -> None:
    array = np.arange(32 * MiB, dtype=np.uint32)  # 128 MiB, every word different
    expected = array.view(np.uint8)
    gc.collect()  # what earlier tests left to the collector
    before = segment_count(os.getpid(), RECV_NAME)
    with sites["bj"].client() as bj, sites["sh"].client() as sh:
        msg_id = bj.send("sh", "big", array, step=3)
        incoming = sh.recv("big", source="bj", step=3, stream=True, timeout=60)
        assert (incoming.source, incoming.tag, incoming.step) == ("bj", "big", 3)
        assert (incoming.dtype, incoming.shape, incoming.size) == (
            np.dtype(np.uint32),
            (32 * MiB,),
            128 * MiB,
        )
        assert incoming.wait(8 * MiB, timeout=60) >= 8 * MiB
        with Paused(daemon_pid(sites, "bj")):
            # nothing more leaves the sender: the message cannot finish meanwhile
            with pytest.raises(wangate.RecvTimeout, match="streamed message 'big'"):
                incoming.wait(incoming.size, timeout=0.5)
            ready = incoming.ready_bytes
            assert 8 * MiB <= ready < incoming.size and not incoming.done
            view = incoming.array
            assert view is not None
            # the prefix is there to read, byte for byte, before the end
            assert view.view(np.uint8)[:ready].tobytes() == expected[:ready].tobytes()
        got = incoming.result(timeout=120)
        assert incoming.done and incoming.ready_bytes == incoming.size
        assert got.dtype == np.uint32 and np.array_equal(got, array)
        assert np.shares_memory(got, view)  # the array is the segment: no copy
        bj.wait("sh", msg_id, timeout=60)  # the gateway told the sender it was taken
        del got, view, incoming
    gc.collect()
    assert segment_count(os.getpid(), RECV_NAME) == before
    assert_only_kept_segments(sites, "sh")  # a streamed one is never lent


async def _async_stream(bj_path: Path, sh_path: Path, array: np.ndarray) -> tuple[int, int]:
    async with wangate.AsyncClient(bj_path) as bj, wangate.AsyncClient(sh_path) as sh:
        msg_id = await bj.send("sh", "async", array, step=1)
        incoming = await sh.recv("async", source="bj", step=1, stream=True, timeout=60)
        first = incoming.ready_bytes
        assert await incoming.wait(4 * MiB, timeout=60) >= 4 * MiB
        got = await incoming.result(timeout=120)
        assert np.array_equal(got, array)
        await bj.wait("sh", msg_id, timeout=60)
        return first, incoming.ready_bytes


def test_the_async_client_streams_too(sites: LoopbackSites) -> None:
    array = np.arange(8 * MiB, dtype=np.int32)  # 32 MiB
    first, last = asyncio.run(
        _async_stream(sites["bj"].socket_path, sites["sh"].socket_path, array)
    )
    assert 0 <= first <= last == array.nbytes


def test_a_whole_or_small_message_streams_as_one_finished_reply(sites: LoopbackSites) -> None:
    small = np.arange(1000, dtype=np.float64)
    with sites["bj"].client() as bj, sites["sh"].client() as sh:
        msg_id = bj.send("sh", "small", small)  # below the segment size: never streamed
        incoming = sh.recv("small", source="bj", stream=True, timeout=60)
        bj.wait("sh", msg_id, timeout=60)
        assert incoming.done and incoming.ready_bytes == incoming.size == small.nbytes
        np.testing.assert_array_equal(incoming.result(timeout=0), small)
        with pytest.raises(wangate.RecvTimeout, match="no message 'nothing'"):
            sh.recv("nothing", stream=True, timeout=0.2)


def test_a_message_within_the_site_streams_whole(sites: LoopbackSites) -> None:
    array = np.arange(4 * MiB, dtype=np.float32)  # 16 MiB, in a segment
    with sites["sh"].client() as sh:
        sh.send("sh", "self", array, step=2)
        incoming = sh.recv("self", source="sh", step=2, stream=True, timeout=10)
        assert incoming.done and incoming.ready_bytes == array.nbytes
        np.testing.assert_array_equal(incoming.result(), array)


def test_a_large_message_within_the_site_costs_the_daemon_no_private_copy(
    sites: LoopbackSites,
) -> None:
    pid = daemon_pid(sites, "sh")
    array = np.arange(64 * MiB, dtype=np.uint32)  # 256 MiB
    gc.collect()
    before = segment_count(os.getpid(), RECV_NAME)
    with sites["sh"].client() as sender, sites["sh"].client() as receiver:
        sender.ping()
        idle_kib = rss_anon_kib(pid)
        sender.send("sh", "local", array)  # returns once the copy is in the inbox
        held_kib = rss_anon_kib(pid)
        got = receiver.recv("local", source="sh", timeout=30)
        assert np.array_equal(got, array)
        # the copy is a segment the receiving trainer maps, not the daemon's heap
        assert segment_count(os.getpid(), RECV_NAME) == before + 1
        # handed over whole: the daemon's mapping is the one it keeps to reuse the
        # segment once the trainer returns it
        assert segment_count(pid, RECV_NAME) == 1
        del got
    gc.collect()
    assert segment_count(os.getpid(), RECV_NAME) == before
    assert held_kib - idle_kib < 16 * 1024, (idle_kib, held_kib)  # not 256 MiB


class TamperedSend:
    """A 64 MiB message handed to bj in a segment whose last bytes change right after
    the hand-over, while bj is paused: it cannot pass its checksum at sh."""

    def __init__(self, sites: LoopbackSites, tag: str, step: int) -> None:
        encoded = encode_tensor(np.ones(16 * MiB, dtype=np.float32))
        payload = memoryview(encoded.payload).cast("B")
        checksum = message_checksum(encoded.meta, payload)
        self.fd, self.mapping = new_segment(payload.nbytes, SEND_NAME)
        self.mapping[:] = payload
        seal(self.fd, SIZE_SEALS)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.fspath(sites["bj"].socket_path))
        request = SendRequest(
            1, "sh", tag, step, False, encoded.meta, checksum, None, (0, payload.nbytes)
        )
        with Paused(daemon_pid(sites, "bj")):  # nothing leaves before the bytes are changed
            socket.send_fds(self.sock, [encode_request(request)], [self.fd])
            self.mapping[-4:] = b"\xff\xff\xff\xff"
        reply, _ = read_reply(self.sock)
        assert reply["ok"] is True

    def close(self) -> None:
        self.mapping.close()
        os.close(self.fd)
        self.sock.close()


# The receiver asks before the message is sent: one that fails its checksum before
# anyone asked for it is dropped whole at its end (its sender is told), and nothing is
# left to stream. The ask is sent REGISTER_S before the send; sh is idle meanwhile.
REGISTER_S = 0.5


def test_a_checksum_failure_surfaces_in_result(sites: LoopbackSites) -> None:
    with sites["sh"].client() as sh, ThreadPoolExecutor(1) as pool:
        asked = pool.submit(sh.recv, "tampered", source="bj", stream=True, timeout=60)
        time.sleep(REGISTER_S)
        tampered = TamperedSend(sites, "tampered", 4)
        incoming = asked.result(timeout=90)
        assert (incoming.tag, incoming.step, incoming.done) == ("tampered", 4, False)
        with pytest.raises(wangate.GatewayError) as info:
            incoming.result(timeout=120)
        assert info.value.code == "checksum"
        assert "message 'tampered' (step 4) from bj failed its checksum" in str(info.value)
        assert incoming.ready_bytes < incoming.size  # the bad end never counted as ready
        with pytest.raises(wangate.GatewayError, match="failed its checksum"):
            incoming.wait(incoming.size)
        assert sh.status()["site"] == "sh"  # the connection goes on
    tampered.close()


async def _async_checksum_failure(sites: LoopbackSites) -> wangate.GatewayError:
    async with wangate.AsyncClient(sites["sh"].socket_path) as sh:
        asked = asyncio.ensure_future(
            sh.recv("tampered-async", source="bj", stream=True, timeout=60)
        )
        await asyncio.sleep(REGISTER_S)
        tampered = await asyncio.to_thread(TamperedSend, sites, "tampered-async", 5)
        incoming = await asked
        with pytest.raises(wangate.GatewayError) as info:
            await incoming.result(timeout=120)
        with pytest.raises(wangate.GatewayError, match="failed its checksum"):
            await incoming.wait(incoming.size)
        assert incoming.ready_bytes < incoming.size and not incoming.done
        tampered.close()
        return info.value


def test_the_async_client_sees_a_checksum_failure_too(sites: LoopbackSites) -> None:
    error = asyncio.run(_async_checksum_failure(sites))
    assert error.code == "checksum"
    assert "message 'tampered-async' (step 5) from bj failed its checksum" in str(error)


RECEIVER_THAT_DIES = textwrap.dedent(
    """
    import sys, wangate
    gw = wangate.Client(sys.argv[1])
    incoming = gw.recv("orphan", source="bj", stream=True, timeout=60)
    print(incoming.wait(4 << 20, timeout=60), flush=True)
    sys.stdin.read()  # until killed
    """
)


def test_a_receiver_killed_mid_stream_leaks_nothing(sites: LoopbackSites) -> None:
    array = np.arange(16 * MiB, dtype=np.float32)  # 64 MiB
    sh_pid = daemon_pid(sites, "sh")
    with sites["bj"].client() as bj:
        msg_id = bj.send("sh", "orphan", array)
        child = subprocess.Popen(
            [sys.executable, "-c", RECEIVER_THAT_DIES, os.fspath(sites["sh"].socket_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert child.stdout is not None
        assert int(child.stdout.readline()) >= 4 << 20
        with Paused(daemon_pid(sites, "bj")):
            child.kill()  # mid-stream: the sender is paused
            child.wait(10)
        bj.wait("sh", msg_id, timeout=60)  # completed; taken by the trainer that died
    with sites["sh"].client() as sh:
        status = sh.status()
        assert status["inbox"]["queued"] == 0  # not delivered a second time
        with pytest.raises(wangate.RecvTimeout):
            sh.recv("orphan", timeout=0)
    assert segment_count(sh_pid, RECV_NAME) == 0


def test_a_sender_killed_mid_message_fails_the_stream_naming_the_peer(
    tmp_path: Path,
) -> None:
    with LoopbackSites(2, 1, directory=tmp_path, extra_toml="[limits]\npeer_dead_s = 2\n") as lab:
        lab.wait_all_paths_up()
        array = np.arange(32 * MiB, dtype=np.uint32)
        with lab["bj"].client() as bj, lab["sh"].client() as sh:
            bj.send("sh", "lost", array)
            incoming = sh.recv("lost", source="bj", stream=True, timeout=60)
            incoming.wait(4 * MiB, timeout=60)
            os.kill(daemon_pid(lab, "bj"), signal.SIGSTOP)  # so that it cannot finish first
            lab.kill("bj")
            killed_at = time.monotonic()
            with pytest.raises(wangate.PeerUnreachable) as info:
                incoming.result(timeout=30)
            # peer_dead_s, plus the time to notice it (checks run at least every second)
            assert time.monotonic() - killed_at < 2 + 2
            assert "message 'lost' (step 0) from bj: peer bj is unreachable" in str(info.value)
            assert incoming.ready_bytes < incoming.size
            del incoming
            gc.collect()
            # the gateway keeps the partial body while the peer may come back to finish
            # it; a new instance of the peer cannot, and it goes
            assert sh.status()["peers"]["bj"]["inbound_in_progress"] == 1
            lab.restart("bj")
            assert sh.status()["peers"]["bj"]["inbound_in_progress"] == 0
        assert segment_count(daemon_pid(lab, "sh"), RECV_NAME) == 0


def test_a_gateway_without_segments_answers_a_streaming_recv_whole(tmp_path: Path) -> None:
    settings = default_client_settings(MiB)  # no "segments": nothing can be streamed
    array = np.arange(1000, dtype=np.int16)
    with (
        GatewayThread(tmp_path / "gw.sock", client_settings=settings) as gateway,
        wangate.Client(gateway.path) as gw,
    ):
        gw.send("bj", "plain", array, step=1)
        incoming = gw.recv("plain", step=1, stream=True, timeout=5)
        assert incoming.done and incoming.ready_bytes == incoming.size == array.nbytes
        assert (incoming.source, incoming.tag, incoming.step) == ("bj", "plain", 1)
        np.testing.assert_array_equal(incoming.result(timeout=0), array)
        np.testing.assert_array_equal(incoming.array, array)  # raw: the same bytes
