"""Shared-memory payloads: memfds passed with the frames (proto/localapi.md, "Segments").

Real servers and daemons, real Unix sockets, real descriptors: what a malicious or
dying client can do with a segment costs its own request only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import wangate
from tests.selfsite import default_client_settings
from wangate.codec import encode_tensor
from wangate.core.message import message_checksum
from wangate.delivery.segments import InboundSegments
from wangate.localapi.protocol import (
    PingRequest,
    RecvRequest,
    SendRequest,
    encode_request,
)
from wangate.localapi.segments import FrameDescriptors
from wangate.loopback import LoopbackSites
from wangate.shm import (
    F_SEAL_FUTURE_WRITE,
    RECV_NAME,
    SEND_NAME,
    SIZE_SEALS,
    SegmentError,
    map_segment,
    new_segment,
    seal,
)

from .test_localapi_server import GatewayThread, is_closed, raw_connect, read_replies, read_reply

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20


def sealed_segment(data: bytes, seals: int = SIZE_SEALS) -> int:
    fd, mapping = new_segment(len(data), SEND_NAME)
    mapping[:] = data
    mapping.close()
    seal(fd, seals)
    return fd


def segment_count(pid: int, name: str) -> int:
    """Distinct memfds called ``name`` that process ``pid`` holds, open or mapped."""
    inodes = set()
    for entry in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            if f"/memfd:{name}" in os.readlink(f"/proc/{pid}/fd/{entry}"):
                inodes.add(os.stat(f"/proc/{pid}/fd/{entry}").st_ino)
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if f"/memfd:{name}" in line:
                inodes.add(int(line.split()[4]))
    return len(inodes)


# ------------------------------------------------------------- validation


def test_a_descriptor_must_be_a_memfd_with_its_size_sealed_holding_the_range() -> None:
    with tempfile.TemporaryFile() as plain:
        plain.write(b"x" * 4096)
        plain.flush()
        with pytest.raises(SegmentError, match="not a memfd"):
            map_segment(plain.fileno(), 0, 4096)
    reader, writer = os.pipe()
    with pytest.raises(SegmentError, match="not a regular file"):
        map_segment(reader, 0, 1)
    os.close(reader)
    os.close(writer)
    unsealed = sealed_segment(b"a" * 4096, seals=0)
    with pytest.raises(SegmentError, match=r"size is not sealed \(F_SEAL_SHRINK"):
        map_segment(unsealed, 0, 4096)
    os.close(unsealed)
    small = sealed_segment(b"b" * 4096)
    with pytest.raises(SegmentError) as info:
        map_segment(small, 0, 8192)
    assert str(info.value) == (
        "the segment holds 4096 bytes, the request names 8192 bytes at offset 0"
    )
    assert info.value.code == "bad_segment"
    view = map_segment(small, 1000, 3096)
    assert bytes(view) == b"b" * 3096
    assert view.readonly
    os.close(small)


def test_a_delivered_segment_cannot_be_written_or_resized_through_its_descriptor() -> None:
    fd, mapping = new_segment(4096, RECV_NAME)
    seal(fd)
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"x", 0)
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 100)
    with pytest.raises(PermissionError):
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # F_SEAL_SEAL: nothing can be unsealed
    mapping.close()
    os.close(fd)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_descriptor_goes_to_the_last_frame_starting_in_its_receive() -> None:
    fds = FrameDescriptors(max_pending=2)
    one, two = os.pipe()
    # one receive: a 50-byte frame sent alone, then a 30-byte frame sent with `one`
    assert fds.received(80, [one])
    assert fds.take(0, 50) is None  # the first frame brought no descriptor
    assert fds.take(50, 80) == one
    # a frame that named no segment leaves its descriptor, closed once frames pass it
    assert fds.received(40, [two])  # bytes 80..120
    assert fds.received(40, [])  # 120..160
    assert fds.take(120, 160) is None
    assert not is_open(two)
    os.close(one)
    three, four = os.pipe()
    assert not fds.received(10, [three, four])  # one frame carries one descriptor
    assert not is_open(four) and is_open(three)
    fds.close()
    assert not is_open(three)


# ------------------------------------------------------------- one server


def send_segment_request(sock: socket.socket, rid: int, meta: bytes, data: bytes, fd: int | None):
    checksum = message_checksum(meta, data)
    request = SendRequest(rid, "bj", "seg", rid, False, meta, checksum, None, (0, len(data)))
    head = encode_request(request)
    if fd is None:
        sock.sendall(head)
    else:
        sent = socket.send_fds(sock, [head], [fd])
        sock.sendall(head[sent:])


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayThread]:
    settings = default_client_settings(64 * MiB) | {"segments": {"min_bytes": MiB}}
    with GatewayThread(tmp_path / "gw.sock", client_settings=settings) as gw:
        yield gw


def test_bad_segments_cost_their_request_only(gateway: GatewayThread) -> None:
    sock = raw_connect(gateway.path)
    data = bytes(range(256)) * 16
    with tempfile.TemporaryFile() as plain:
        plain.write(data)
        plain.flush()
        send_segment_request(sock, 1, b"m", data, plain.fileno())
        unsealed = sealed_segment(data, seals=0)
        send_segment_request(sock, 2, b"m", data, unsealed)
        short = sealed_segment(data[:100])
        send_segment_request(sock, 3, b"m", data, short)
        send_segment_request(sock, 4, b"m", data, None)  # no descriptor came with it
        good = sealed_segment(data)
        send_segment_request(sock, 5, b"m", data, good)
        for fd in (unsealed, short, good):
            os.close(fd)
        replies = {reply["id"]: reply for reply, _ in read_replies(sock, 5)}
    assert {rid: (r["ok"], r.get("code")) for rid, r in replies.items()} == {
        1: (False, "bad_segment"),
        2: (False, "bad_segment"),
        3: (False, "bad_segment"),
        4: (False, "bad_segment"),
        5: (True, None),
    }
    assert replies[1]["error"] == "the descriptor is not a memfd (it cannot carry seals)"
    assert replies[3]["error"] == (
        f"the segment holds 100 bytes, the request names {len(data)} bytes at offset 0"
    )
    assert replies[4]["error"] == "send names a segment but no file descriptor came with it"
    # the good one went through, its bytes copied out of the sender's segment
    sock.sendall(encode_request(RecvRequest(6, "seg", None, 5, 1.0)))
    reader_replies = read_replies(sock, 1)
    assert reader_replies[0][0]["ok"] is True
    assert reader_replies[0][1] == data
    sock.close()


def test_a_send_with_both_a_segment_and_a_payload_is_refused(gateway: GatewayThread) -> None:
    sock = raw_connect(gateway.path)
    request = SendRequest(1, "bj", "t", 0, False, b"", 0, None, (0, 4))
    sock.sendall(encode_request(request, 4) + b"abcd")
    reply, _ = read_reply(sock)
    assert (reply["code"], reply["error"]) == (
        "bad_request",
        "a send with a segment carries no payload",
    )
    sock.sendall(encode_request(PingRequest(2)))
    assert read_reply(sock)[0] == {"ok": True, "id": 2}
    sock.close()


def test_descriptors_beyond_what_a_frame_carries_close_that_connection_only(
    gateway: GatewayThread,
) -> None:
    other = raw_connect(gateway.path)
    sock = raw_connect(gateway.path)
    fds = [sealed_segment(b"x" * 10) for _ in range(5)]
    socket.send_fds(sock, [b"W"], fds)  # more in one message than the gateway takes
    for fd in fds:
        os.close(fd)
    assert is_closed(sock)
    other.sendall(encode_request(PingRequest(1)))
    assert read_reply(other)[0] == {"ok": True, "id": 1}
    other.close()


def test_a_segment_changed_after_hand_over_within_the_site_is_a_copy_checked_first(
    gateway: GatewayThread,
) -> None:
    sock = raw_connect(gateway.path)
    data = b"q" * 8192
    fd = sealed_segment(data)
    request = SendRequest(1, "bj", "t", 0, False, b"m", 0x1234, None, (0, len(data)))
    head = encode_request(request)
    socket.send_fds(sock, [head], [fd])
    reply, _ = read_reply(sock)
    os.close(fd)
    assert reply["code"] == "checksum"
    assert reply["error"] == (
        f"send 't' (step 0) to bj: the payload's checksum is "
        f"{message_checksum(b'm', data):08x}, the request declares 00001234"
    )
    sock.close()


def test_the_client_sends_large_arrays_as_segments_and_small_ones_in_band(
    gateway: GatewayThread,
) -> None:
    big = np.arange(MiB, dtype=np.float32)  # 4 MiB: a segment
    small = np.arange(1000, dtype=np.int16)
    gc.collect()  # what earlier tests left to the collector
    before = segment_count(os.getpid(), SEND_NAME)
    with wangate.Client(gateway.path) as gw:
        for step in range(3):
            gw.send("bj", "big", big + step, step=step)
            gw.send("bj", "small", small, step=step)
            # the gateway copied it (same site) and said so: the one segment is reused
            assert segment_count(os.getpid(), SEND_NAME) == before + 1
            assert gw._session.pool.lent_count == 0
        for step in range(3):
            np.testing.assert_array_equal(gw.recv("big", step=step, timeout=5), big + step)
            np.testing.assert_array_equal(gw.recv("small", step=step, timeout=5), small)
    assert segment_count(os.getpid(), SEND_NAME) == before


# ------------------------------------------------------------- two sites


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    with LoopbackSites(2, 2, directory=tmp_path_factory.mktemp("sites")) as lab:
        lab.wait_all_paths_up()
        yield lab


def daemon_pid(sites: LoopbackSites, name: str) -> int:
    process = sites[name].process
    assert process is not None
    return process.pid


def assert_only_kept_segments(sites: LoopbackSites, name: str) -> int:
    """The gateway ``name`` holds no inbound segment but those it keeps for reuse,
    lent or pooled (its status says how many), once it has seen its clients close
    (what they did not return is forgotten then). Returns how many it keeps."""
    deadline = time.monotonic() + 5
    while True:
        with sites[name].client() as client:
            counts = client.status()["segments"]
        kept = counts["lent"] + counts["pooled"]
        held = segment_count(daemon_pid(sites, name), RECV_NAME)
        if held == kept or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (held, counts["lent"]) == (kept, 0)
    return kept


def test_large_messages_cross_in_segments_and_arrive_in_one(sites: LoopbackSites) -> None:
    array = np.random.default_rng(7).standard_normal(4 * MiB).astype(np.float32)  # 16 MiB
    gc.collect()
    before = segment_count(os.getpid(), RECV_NAME)
    sends_before = segment_count(os.getpid(), SEND_NAME)
    with sites["bj"].client() as bj, sites["sh"].client() as sh:
        msg_id = bj.send("sh", "layer", array, step=1)
        np.testing.assert_array_equal(sh.recv("layer", source="bj", step=1, timeout=60), array)
        bj.wait("sh", msg_id, timeout=30)  # confirmed: the gateway let go of the segment
        msg_id = bj.send("sh", "layer", array * 2, step=2)
        assert segment_count(os.getpid(), SEND_NAME) == sends_before + 1  # the first, reused
        got = sh.recv("layer", source="bj", step=2, timeout=60)
        assert got.tobytes() == (array * 2).tobytes()
        # the array lies in the segment the gateway assembled it in (copy-on-write)
        assert segment_count(os.getpid(), RECV_NAME) == before + 1
        got[0] = 1.0
        assert got[0] == 1.0
        bj.wait("sh", msg_id, timeout=30)
        del got
        gc.collect()
        assert segment_count(os.getpid(), RECV_NAME) == before
    # neither gateway keeps a segment once the message is taken and confirmed, but
    # the receiving one those returned for reuse: the first (returned by the second
    # recv), unless the second message arrived after that return and was written in it
    assert segment_count(daemon_pid(sites, "bj"), SEND_NAME) == 0
    assert assert_only_kept_segments(sites, "sh") <= 1


def send_then_change_bytes(sites: LoopbackSites) -> None:
    """Send 64 MiB from a segment, change its last bytes right after the reply: that
    message fails at the receiving gateway's checksum; another message arrives."""
    encoded = encode_tensor(np.ones(16 * MiB, dtype=np.float32))  # 64 MiB: ~1 s on loopback
    payload = memoryview(encoded.payload).cast("B")
    checksum = message_checksum(encoded.meta, payload)
    fd, mapping = new_segment(payload.nbytes, SEND_NAME)
    mapping[:] = payload
    seal(fd, SIZE_SEALS)  # not against writing: this client keeps its writable mapping
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.fspath(sites["bj"].socket_path))
    request = SendRequest(
        1, "sh", "tampered", 0, False, encoded.meta, checksum, None, (0, payload.nbytes)
    )
    head = encode_request(request)
    socket.send_fds(sock, [head], [fd])
    reply, _ = read_reply(sock)
    # the gateway sends in offset order: the last bytes are still here to change
    mapping[-4:] = b"\xff\xff\xff\xff"
    assert reply["ok"] is True
    msg_id = reply["message_id"]
    with sites["bj"].client() as bj, sites["sh"].client() as sh:
        good = np.arange(3 * MiB, dtype=np.int32)
        good_id = bj.send("sh", "good", good)
        np.testing.assert_array_equal(sh.recv("good", source="bj", timeout=60), good)
        bj.wait("sh", good_id, timeout=30)
        with pytest.raises(wangate.MessageFailed) as info:
            bj.wait("sh", msg_id, timeout=60)
        assert "checksum" in str(info.value)
        assert "'tampered'" in str(info.value)
        with pytest.raises(wangate.RecvTimeout):
            sh.recv("tampered", source="bj", timeout=0)
    mapping.close()
    os.close(fd)
    sock.close()


@pytest.mark.single_process  # with workers: tests/test_workers.py, whose lab drops partials soon
def test_bytes_changed_after_hand_over_fail_that_message_only(sites: LoopbackSites) -> None:
    send_then_change_bytes(sites)


CLIENT_THAT_DIES = textwrap.dedent(
    """
    import sys, time, numpy as np, wangate
    gw = wangate.Client(sys.argv[1])
    if sys.argv[2] == "send":
        print(gw.send("sh", "orphan", np.arange(8 << 20, dtype=np.float32)), flush=True)
    else:
        array = gw.recv("orphan", source="bj", timeout=60)
        print(int(array[-1]), flush=True)
    time.sleep(600)
    """
)


def run_until_it_prints(socket_path: Path, role: str) -> str:
    child = subprocess.Popen(
        [sys.executable, "-c", CLIENT_THAT_DIES, os.fspath(socket_path), role],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    line = child.stdout.readline().decode().strip()
    # killed while the gateway still sends from (or the trainer maps) the segment
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    return line


def test_clients_killed_while_segments_are_shared_leak_none(sites: LoopbackSites) -> None:
    msg_id = int(run_until_it_prints(sites["bj"].socket_path, "send"))
    assert run_until_it_prints(sites["sh"].socket_path, "recv") == str((8 << 20) - 1)
    with sites["bj"].client() as bj:
        bj.wait("sh", msg_id, timeout=60)  # taken (by the trainer that died after)
    assert segment_count(daemon_pid(sites, "bj"), SEND_NAME) == 0
    # what the killed trainer held and never returned is not kept (with workers the
    # sender can learn "taken" before the receiving gateway has let go of the reply
    # it wrote: released within moments)
    assert_only_kept_segments(sites, "sh")


def test_inbound_segments_are_capped_and_fall_back_to_private_memory() -> None:
    segments = InboundSegments(min_bytes=4096, max_live=2)
    small = segments.allocate(4095, None)
    assert isinstance(small, bytearray) and len(small) == 4095
    first = segments.allocate(5000, 59)  # payload at 59: placed 5 bytes in, to start at 64
    second = segments.allocate(5000, None)  # offset unknown: 56 bytes in, to end at 5056
    assert isinstance(first, memoryview) and isinstance(second, memoryview)
    assert (memoryview(first.obj).nbytes, memoryview(second.obj).nbytes) == (5005, 5056)
    # a float64 payload that ends the body starts aligned for its dtype
    payload = np.frombuffer(second[5000 - 8 * 600 :], dtype=np.float64)
    assert payload.flags.aligned and payload.ctypes.data % 8 == 0
    third = segments.allocate(5000, None)
    assert isinstance(third, bytearray)  # two alive already
    assert segments.live == 2 and segments.open_count == 2
    fd = segments.claim(first[59:])
    assert fd is not None and segments.open_count == 1
    assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & F_SEAL_FUTURE_WRITE
    os.close(fd)
    segments.free(second)
    assert segments.open_count == 0
    del first, second, payload
    gc.collect()
    assert segments.live == 0
    assert isinstance(segments.allocate(5000, None), memoryview)


async def _async_round_trip(bj_path: Path, sh_path: Path, array: np.ndarray) -> np.ndarray:
    async with wangate.AsyncClient(bj_path) as bj, wangate.AsyncClient(sh_path) as sh:
        msg_id = await bj.send("sh", "async", array, step=1)
        got = await sh.recv("async", source="bj", step=1, timeout=60)
        await bj.wait("sh", msg_id, timeout=30)
        return got


def test_the_async_client_sends_and_receives_segments(sites: LoopbackSites) -> None:
    array = np.arange(3 * MiB, dtype=np.int32)
    gc.collect()  # what earlier tests left to the collector
    before = segment_count(os.getpid(), RECV_NAME)
    got = asyncio.run(_async_round_trip(sites["bj"].socket_path, sites["sh"].socket_path, array))
    np.testing.assert_array_equal(got, array)
    assert segment_count(os.getpid(), RECV_NAME) == before + 1  # the array is a view of it
    del got
    gc.collect()
    assert segment_count(os.getpid(), RECV_NAME) == before


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError(f"no RssAnon for {pid}")


@pytest.mark.single_process  # 1 GiB: tests/test_workers.py has it with workers
@pytest.mark.timeout(900)
def test_a_gib_crosses_with_each_gateway_holding_a_window_of_private_memory(
    sites: LoopbackSites,
) -> None:
    pids = {name: daemon_pid(sites, name) for name in ("bj", "sh")}
    idle = {name: rss_anon_kib(pid) for name, pid in pids.items()}
    peak = dict(idle)
    done = threading.Event()

    def sample() -> None:  # a reading every 10 ms: a peak it misses is a short one
        while not done.wait(0.01):
            for name, pid in pids.items():
                peak[name] = max(peak[name], rss_anon_kib(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    array = np.arange(256 * MiB, dtype=np.uint32)  # 1 GiB, every word different
    try:
        with sites["bj"].client() as bj, sites["sh"].client() as sh:
            msg_id = bj.send("sh", "gib", array)
            got = sh.recv("gib", source="bj", timeout=800)
            assert np.array_equal(got, array)
            del got
            bj.wait("sh", msg_id, timeout=60)
    finally:
        done.set()
        sampler.join()
    # the bound: a window (64 MiB) above idle, not the message
    assert {name: peak[name] - idle[name] < 64 * 1024 for name in pids} == {
        "bj": True,
        "sh": True,
    }, {name: (peak[name] - idle[name]) // 1024 for name in pids}
