"""The local API server on a real Unix socket: misbehaving clients, limits, socket file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import struct
import tempfile
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

import wangate
from tests.selfsite import SelfSiteService, default_client_settings
from wangate.config.schema import JobConfig
from wangate.delivery.inbox import Inbox
from wangate.errors import GatewayError, RecvTimeout
from wangate.localapi.framing import SyncFrameReader
from wangate.localapi.protocol import (
    ClaimRequest,
    HelloRequest,
    PingRequest,
    RecvRequest,
    SendRequest,
    decode_reply,
    encode_prefix,
    encode_request,
)
from wangate.localapi.server import MAX_REQUESTS_IN_FLIGHT, LocalApiServer
from wangate.service import Submission

MAX_MESSAGE = 64 << 20


class GatewayThread:
    """A real server with a self-site service, on its own event loop in a thread."""

    def __init__(
        self,
        path: Path,
        *,
        site: str = "bj",
        max_message_bytes: int = MAX_MESSAGE,
        client_budget_bytes: int = 2 * MAX_MESSAGE,
        peer_inbox_bytes: int = 4 * MAX_MESSAGE,
        client_settings: dict[str, Any] | None = None,
        use_uvloop: bool = False,
        jobs: tuple[JobConfig, ...] = (),
        **server: Any,
    ) -> None:
        self.path = path
        self.use_uvloop = use_uvloop
        self.service = SelfSiteService(
            site,
            Inbox(peer_inbox_bytes),
            client_settings or default_client_settings(max_message_bytes),
            jobs=jobs,
        )
        self.server = LocalApiServer(
            self.service,
            path,
            max_message_bytes=max_message_bytes,
            client_budget_bytes=client_budget_bytes,
            **server,
        )
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        factory = None
        if self.use_uvloop:
            import uvloop

            factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self.server.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.server.close()

    def run(self, make: Callable[[], Coroutine[Any, Any, Any]], timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(timeout_s)

    def wait_until(self, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Return once ``condition`` holds, polled on the server's loop."""

        async def poll() -> None:
            while not condition():
                await asyncio.sleep(0.001)

        self.run(lambda: asyncio.wait_for(poll(), timeout_s), timeout_s + 1)

    def wait_for_waiters(self, count: int) -> None:
        self.wait_until(lambda: self.service.inbox.mailbox.waiter_count() == count)

    def __enter__(self) -> GatewayThread:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "gw.sock"


def raw_connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(os.fspath(path))
    return sock


def read_reply(sock: socket.socket, limit: int = MAX_MESSAGE) -> tuple[dict[str, Any], bytes]:
    head = SyncFrameReader(sock, limit).read_head()
    assert head is not None, "connection closed instead of replying"
    return decode_reply(head[1]), b""


def read_replies(sock: socket.socket, count: int) -> list[tuple[dict[str, Any], bytes]]:
    reader = SyncFrameReader(sock, MAX_MESSAGE)
    replies = []
    for _ in range(count):
        head = reader.read_head()
        assert head is not None
        replies.append((decode_reply(head[1]), bytes(reader.read_payload(head[0].payload_bytes))))
    return replies


def is_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def ping_works(sock: socket.socket, request_id: int = 77) -> bool:
    sock.sendall(encode_request(PingRequest(request_id)))
    reply, _ = read_reply(sock)
    return reply == {"ok": True, "id": request_id}


def good_transfer(path: Path, tag: str, size_bytes: int = 16 << 20) -> Callable[[], None]:
    """Start a well-behaved client's round trip in a thread; the returned call checks it."""
    array = np.random.default_rng(len(tag)).integers(0, 256, size_bytes, dtype=np.uint8)
    outcome: list[object] = []

    def work() -> None:
        try:
            with wangate.Client(path) as gw:
                gw.send("bj", tag, array, step=1)
                outcome.append(gw.recv(tag, source="bj", step=1, timeout=10))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=work)
    thread.start()

    def check() -> None:
        thread.join(20)
        assert len(outcome) == 1
        got = outcome[0]
        assert isinstance(got, np.ndarray), got
        assert got.dtype == np.uint8 and got.tobytes() == array.tobytes()

    return check


def prefix(version: int = 1, flags: int = 0, header: int = 10, payload: int = 0) -> bytes:
    return b"WG" + struct.pack("!BBIQ", version, flags, header, payload)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def frame(header: bytes, payload: bytes = b"", payload_bytes: int | None = None) -> bytes:
    size = len(payload) if payload_bytes is None else payload_bytes
    return encode_prefix(len(header), size) + header + payload


SEND = {
    "op": "send",
    "id": 5,
    "peer": "bj",
    "tag": "t",
    "step": 0,
    "critical": False,
    "meta": b"",
    "checksum": 0,
}

# (bytes, expected code or None for "closed without a reply", connection survives)
BAD_INPUTS = {
    "garbage": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad_magic", False),
    "bad_version": (prefix(version=2) + b"x" * 10, "bad_version", False),
    "bad_flags": (prefix(flags=0x80) + b"x" * 10, "bad_flags", False),
    "header_too_big": (prefix(header=1 << 20), "header_too_large", False),
    "payload_too_big": (prefix(header=10, payload=2**62), "too_large", False),
    "payload_over_max": (prefix(header=10, payload=MAX_MESSAGE + 1), "too_large", False),
    "not_msgpack": (frame(b"\xc1" * 10), "bad_header", True),
    "not_a_map": (frame(pack([1, 2, 3])), "bad_header", True),
    "wrong_keys": (frame(pack({**SEND, "extra": 1}), b"abc"), "bad_request", True),
    "missing_key": (frame(pack({"op": "recv", "id": 5, "tag": "t"})), "bad_request", True),
    "wrong_type": (frame(pack({**SEND, "step": "12"}), b"abc"), "bad_request", True),
    "unknown_op": (frame(pack({"op": "allreduce", "id": 5})), "unknown_op", True),
    "payload_on_ping": (frame(pack({"op": "ping", "id": 5}), b"xyz"), "bad_request", True),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gets_its_error_and_others_are_unaffected(sock_path: Path, case: str) -> None:
    data, code, survives = BAD_INPUTS[case]
    with GatewayThread(sock_path):
        bad = raw_connect(sock_path)
        check_good = good_transfer(sock_path, f"good-{case}")
        bad.sendall(data)
        reply, _ = read_reply(bad)
        assert reply["ok"] is False and reply["code"] == code
        assert reply["id"] == (5 if code in ("bad_request", "unknown_op") else None)
        if survives:
            assert ping_works(bad)
        else:
            assert is_closed(bad)
        check_good()
        bad.close()


def test_server_under_uvloop(sock_path: Path) -> None:
    with GatewayThread(sock_path, use_uvloop=True):
        bad = raw_connect(sock_path)
        bad.sendall(frame(pack({"op": "allreduce", "id": 5})))
        assert read_reply(bad)[0]["code"] == "unknown_op"
        good_transfer(sock_path, "good-uvloop")()
        assert ping_works(bad)
        bad.close()


def test_truncated_and_stalled_frames_do_not_block_others(sock_path: Path) -> None:
    with GatewayThread(sock_path) as gateway:
        stalled = raw_connect(sock_path)
        stalled.sendall(prefix(header=100) + b"\x80" * 10)  # header promised, never finished
        payload_stalled = raw_connect(sock_path)
        header = pack(SEND)
        payload_stalled.sendall(frame(header, payload_bytes=1 << 20) + b"x" * 1000)
        truncated = raw_connect(sock_path)
        truncated.sendall(prefix()[:9])
        truncated.shutdown(socket.SHUT_WR)
        assert is_closed(truncated)  # closed mid-frame: nothing to reply to
        check_good = good_transfer(sock_path, "good-stalled")
        check_good()
        # The two stalled clients stay; the good one's close reaches the server a little later.
        gateway.wait_until(lambda: gateway.server.connection_count == 2)
        stalled.close()
        payload_stalled.close()


def test_over_budget_payload_is_skipped_and_connection_continues(sock_path: Path) -> None:
    with GatewayThread(sock_path, client_budget_bytes=1 << 20):
        sock = raw_connect(sock_path)
        sock.sendall(frame(pack(SEND), b"\x01" * ((1 << 20) + 1)))
        reply, _ = read_reply(sock)
        assert (reply["code"], reply["id"]) == ("over_budget", 5)
        assert ping_works(sock)
        sock.close()


def test_pipelined_requests_reply_by_id_as_they_complete(sock_path: Path) -> None:
    with GatewayThread(sock_path):
        sock = raw_connect(sock_path)
        payload = b"payload!"
        sock.sendall(
            encode_request(RecvRequest(1, "later", None, None, 5.0))
            + encode_request(PingRequest(2))
        )
        ping_reply, _ = read_reply(sock)  # the waiting recv holds nothing up
        assert ping_reply == {"ok": True, "id": 2}
        sock.sendall(
            encode_request(SendRequest(3, "bj", "later", 9, True, b"m", 1234), len(payload))
            + payload
        )
        replies = sorted(read_replies(sock, 2), key=lambda r: int(r[0]["id"]))
        assert replies[1][0] == {"ok": True, "id": 3, "message_id": 1}
        recv_reply, recv_payload = replies[0]
        assert recv_reply == {
            "ok": True,
            "id": 1,
            "source": "bj",
            "tag": "later",
            "step": 9,
            "critical": True,
            "meta": b"m",
            "checksum": 1234,
        }
        assert recv_payload == payload
        sock.close()


def test_full_client_budget_stops_reading_until_space_frees(sock_path: Path) -> None:
    # The inbox holds one message, so send 2 waits inside the service holding 600 KiB of
    # the 1 MiB client budget: frame 3 must then stay unread, and the ping behind it too.
    with GatewayThread(sock_path, client_budget_bytes=1 << 20, peer_inbox_bytes=1):
        sock = raw_connect(sock_path)
        body = b"\x02" * (600 << 10)
        frames = [
            encode_request(SendRequest(rid, "bj", "b", rid, False, b"", 0), len(body)) + body
            for rid in (1, 2, 3)
        ] + [encode_request(PingRequest(4))]
        writer = threading.Thread(target=sock.sendall, args=(b"".join(frames),))
        writer.start()
        first, _ = read_reply(sock)
        assert first == {"ok": True, "id": 1, "message_id": 1}
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        sock.settimeout(10)
        assert writer.is_alive()  # the server stopped reading: the kernel buffer is full
        with wangate.Client(sock_path) as other:  # everyone else is still served
            other.ping()
        drain = raw_connect(sock_path)
        drain.sendall(encode_request(RecvRequest(9, "b", None, 1, 1.0)))
        assert read_replies(drain, 1)[0][0]["step"] == 1
        replies = read_replies(sock, 2)
        assert sorted(reply["id"] for reply, _ in replies) == [2, 4]
        writer.join(10)
        assert not writer.is_alive()
        drain.close()
        sock.close()


def test_pending_recv_of_a_closed_client_loses_nothing(sock_path: Path) -> None:
    with GatewayThread(sock_path) as gateway:
        gone = raw_connect(sock_path)
        gone.sendall(encode_request(RecvRequest(1, "t", None, None, None)))
        gateway.wait_for_waiters(1)
        gone.close()
        gateway.wait_for_waiters(0)
        with wangate.Client(sock_path) as gw:
            gw.send("bj", "t", np.arange(3, dtype=np.int32), step=4)
            assert gw.recv("t", timeout=1).tolist() == [0, 1, 2]


def test_reply_frames_are_well_formed_for_service_errors(sock_path: Path) -> None:
    with GatewayThread(sock_path):
        sock = raw_connect(sock_path)
        sock.sendall(frame(pack({**SEND, "peer": "sh"})))
        reply, _ = read_reply(sock)
        assert (reply["ok"], reply["id"], reply["code"]) == (False, 5, "unknown_peer")
        assert "sh" in reply["error"]
        sock.sendall(encode_request(RecvRequest(6, "none", None, None, 0.0)))
        reply, _ = read_reply(sock)
        assert (reply["id"], reply["code"]) == (6, "timeout")
        sock.close()


def test_requests_beyond_the_in_flight_limit_wait_for_a_reply_to_go_out(
    sock_path: Path,
) -> None:
    with GatewayThread(sock_path):
        sock = raw_connect(sock_path)
        waiting = b"".join(
            encode_request(RecvRequest(i, "never", None, None, 0.5))
            for i in range(1, MAX_REQUESTS_IN_FLIGHT + 1)
        )
        sock.sendall(waiting + frame(pack({"op": "allreduce", "id": 900})))
        sock.sendall(encode_request(PingRequest(901)))
        replies = read_replies(sock, MAX_REQUESTS_IN_FLIGHT + 2)
        ids = [reply["id"] for reply, _ in replies]
        # neither the bad frame nor the ping was read before a recv timed out
        assert replies[0][0]["code"] == "timeout" and ids[0] <= MAX_REQUESTS_IN_FLIGHT
        assert sorted(ids) == [*range(1, MAX_REQUESTS_IN_FLIGHT + 1), 900, 901]
        bad = replies[ids.index(900)][0]
        assert (bad["ok"], bad["code"]) == (False, "unknown_op")
        assert replies[ids.index(901)][0] == {"ok": True, "id": 901}
        assert ping_works(sock)
        sock.close()


def test_a_failing_service_gets_an_internal_error_and_the_connection_goes_on(
    sock_path: Path,
) -> None:
    class Failing(SelfSiteService):
        def submit_now(self, submission: Submission) -> int | None:
            if submission.tag == "boom":
                raise RuntimeError("service bug")
            return super().submit_now(submission)

    with GatewayThread(sock_path) as gateway:
        gateway.server.service = Failing("bj", Inbox(MAX_MESSAGE), default_client_settings(99))
        sock = raw_connect(sock_path)
        sock.sendall(frame(pack({**SEND, "tag": "boom"}), b"abc"))
        reply, _ = read_reply(sock)
        assert (reply["ok"], reply["id"], reply["code"]) == (False, 5, "internal")
        assert reply["error"] == "gateway error: service bug"
        sock.sendall(frame(pack({**SEND, "id": 6}), b"abc"))
        reply, _ = read_reply(sock)
        assert reply == {"ok": True, "id": 6, "message_id": 1}
        assert ping_works(sock)
        sock.close()


# ------------------------------------------------------------------ jobs

JOBS = (JobConfig("llama-run3"), JobConfig("closed", allow_uids=(4242424,)))


def hello(sock: socket.socket, job: str | None, request_id: int = 1) -> dict[str, Any]:
    sock.sendall(encode_request(HelloRequest(request_id, job)))
    return read_reply(sock)[0]


def claim(sock: socket.socket, call: str, step: int, request_id: int = 13) -> dict[str, Any]:
    sock.sendall(encode_request(ClaimRequest(request_id, call, step)))
    return read_reply(sock)[0]


def test_a_connection_is_in_the_job_its_hello_names_and_sees_only_its_messages(
    sock_path: Path,
) -> None:
    with GatewayThread(sock_path, jobs=JOBS) as gateway:
        with (
            wangate.Client(sock_path, job="llama-run3") as run3,
            wangate.Client(sock_path) as plain,
        ):
            assert (run3.job, plain.job) == ("llama-run3", "default")
            run3.send("bj", "g", np.arange(3, dtype=np.int32), step=1)
            plain.send("bj", "g", np.arange(4, dtype=np.int32), step=1)
            assert plain.recv("g", source="bj", step=1, timeout=5).tolist() == [0, 1, 2, 3]
            with pytest.raises(RecvTimeout):  # run3's message is not the default job's
                plain.recv("g", timeout=0)
            assert run3.recv("g", source="bj", step=1, timeout=5).tolist() == [0, 1, 2]
        uid = os.getuid()
        assert sorted(gateway.service.joined) == [("default", uid), ("llama-run3", uid)]


def test_a_connection_without_hello_is_in_the_default_job_from_its_first_call(
    sock_path: Path,
) -> None:
    with GatewayThread(sock_path, jobs=JOBS) as gateway:
        sock = raw_connect(sock_path)
        assert ping_works(sock)
        assert gateway.service.joined == [("default", os.getuid())]
        sock.close()


def test_an_undeclared_job_is_refused_and_the_connection_stays(sock_path: Path) -> None:
    with GatewayThread(sock_path, jobs=JOBS):
        sock = raw_connect(sock_path)
        assert hello(sock, "llama-run4") == {
            "ok": False,
            "id": 1,
            "code": "unknown_job",
            "error": "no job 'llama-run4' in wangate.toml (jobs: default, llama-run3, closed)",
        }
        assert hello(sock, "bad job", 2)["code"] == "bad_request"
        reply = hello(sock, "llama-run3", 3)
        assert (reply["ok"], reply["job"]) == (True, "llama-run3")
        assert ping_works(sock)
        sock.close()
        with pytest.raises(GatewayError, match=r"no job 'x' in wangate\.toml") as refused:
            wangate.Client(sock_path, job="x")
        assert refused.value.code == "unknown_job"


def test_a_second_trainer_entering_the_same_call_collides_until_the_first_is_gone(
    sock_path: Path,
) -> None:
    with GatewayThread(sock_path, jobs=JOBS) as gateway:
        first, second, other = (raw_connect(sock_path) for _ in range(3))
        hello(first, "llama-run3")
        hello(second, "llama-run3")
        hello(other, None)
        assert claim(first, "allreduce/ddp.b0", 3) == {"ok": True, "id": 13}
        assert claim(first, "allreduce/ddp.b0", 3, 14) == {"ok": True, "id": 14}  # its own
        assert claim(other, "allreduce/ddp.b0", 3) == {"ok": True, "id": 13}  # another job
        assert claim(second, "allreduce/ddp.b0", 3) == {
            "ok": False,
            "id": 13,
            "code": "collision",
            "error": "collision: allreduce 'ddp.b0' at step 3 in job 'llama-run3' was entered "
            f"at this site by another trainer (pid {os.getpid()}); two trainers of one job at "
            "one site may not enter the same collective",
        }
        assert claim(second, "allreduce/ddp.b0", 4) == {"ok": True, "id": 13}
        assert ping_works(second)  # a collision does not close the connection
        first.close()
        gateway.wait_until(lambda: gateway.service.claims.count("llama-run3") == 1)
        assert claim(second, "allreduce/ddp.b0", 3) == {"ok": True, "id": 13}
        second.close()
        other.close()
        gateway.wait_until(lambda: gateway.service.claims.count("llama-run3") == 0)
        gateway.wait_until(lambda: gateway.service.claims.count("default") == 0)


def test_a_process_the_jobs_allow_lists_do_not_admit_is_refused() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the client runs under another uid (CI runs as root)")
    from tests.test_localapi_access import NOBODY, run_as

    directory = Path(tempfile.mkdtemp(prefix="wangate-jobs-"))
    directory.chmod(0o711)  # nobody must reach the socket file
    path = directory / "gw.sock"
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, directory, ignore_errors=True)
        cleanup.enter_context(
            GatewayThread(path, jobs=JOBS, socket_mode=0o666, allow_uids=[NOBODY])
        )

        def join(job: str | None) -> str:
            with wangate.Client(path, job=job) as gw:
                return gw.job

        assert run_as(NOBODY, NOBODY, [], lambda: join("llama-run3")) == {"result": "llama-run3"}
        refused = run_as(NOBODY, NOBODY, [], lambda: join("closed"))
        assert (refused["error"], refused["code"]) == ("GatewayError", "job_denied")
        assert refused["message"] == (
            f"job 'closed' admits users 4242424; this process runs as uid {NOBODY} gids "
            f"{NOBODY} [job_denied]"
        )
        assert join("closed") == "closed"  # root is always admitted


# ------------------------------------------------------------------ socket file


def test_socket_file_mode_is_0660_and_removed_on_close(sock_path: Path) -> None:
    old_umask = os.umask(0o000)  # a permissive umask must not leak into the socket's mode
    try:
        with GatewayThread(sock_path):
            mode = os.stat(sock_path).st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o660
            assert [p.name for p in sock_path.parent.iterdir()] == ["gw.sock"]
    finally:
        os.umask(old_umask)
    assert not sock_path.exists()


def test_stale_socket_is_replaced(sock_path: Path) -> None:
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(os.fspath(sock_path))
    dead.close()  # the file stays, nobody listens
    with GatewayThread(sock_path), wangate.Client(sock_path) as gw:
        assert gw.site == "bj"


def test_live_socket_and_other_files_are_not_replaced(sock_path: Path) -> None:
    with GatewayThread(sock_path), pytest.raises(GatewayError) as info:
        GatewayThread(sock_path).__enter__()
    assert info.value.code == "socket_in_use"
    assert "already running" in str(info.value)
    sock_path.write_text("keep me")
    with pytest.raises(GatewayError) as info:
        GatewayThread(sock_path).__enter__()
    assert info.value.code == "socket_in_use"
    assert sock_path.read_text() == "keep me"
