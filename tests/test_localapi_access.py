"""Who may use a gateway's local socket, and how many at once: real daemons, real Unix
sockets, clients under other uids (forked children that drop root, as CI runs as root).

Both sockets are mode 0666 here, so the SO_PEERCRED check is the only gate: bj keeps the
default policy (its own uid, root, and the socket's group, 0) and a cap of 4 local
connections; sh also allows uid 65534.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import select
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wangate
from wangate.localapi.access import AccessPolicy, PeerCredentials, supplementary_groups
from wangate.localapi.protocol import encode_header, error_reply
from wangate.loopback import LoopbackSites, SiteProcess

pytestmark = pytest.mark.timeout(120)

NOBODY = 65534
TEAM_GID = 4242  # sh's job "team" admits this group only
CAP = 4


@pytest.fixture(scope="module")
def lab() -> Iterator[LoopbackSites]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test runs clients under another uid (CI runs as root)")
    directory = Path(tempfile.mkdtemp(prefix="wangate-access-"))
    directory.chmod(0o711)  # another uid must reach the socket files
    sites = LoopbackSites(
        2,
        1,
        directory=directory,
        mtu=1500,
        extra_toml={
            "bj": f"[limits]\nmax_local_connections = {CAP}\n",
            "sh": f"[jobs.team]\nallow_gids = [{TEAM_GID}]\n",
        },
    )
    site_keys = {
        "bj": 'socket_mode = "0666"',
        "sh": f'socket_mode = "0666"\nallow_uids = [{NOBODY}]',
    }
    for name, keys in site_keys.items():
        config = sites[name].config_path
        text = config.read_text()
        config.write_text(
            text.replace(f'socket = "{name}.sock"', f'socket = "{name}.sock"\n{keys}')
        )
    try:
        with sites:
            yield sites
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_as(uid: int, gid: int, groups: list[int], work: Callable[[], Any]) -> dict[str, Any]:
    """Run ``work`` in a forked child that has dropped to ``uid``/``gid``/``groups``;
    its result, or the error it raised (class name, code, message)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        outcome: dict[str, Any]
        try:
            os.close(read_fd)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            outcome = {"result": work()}
        except BaseException as exc:
            outcome = {"error": type(exc).__name__, "code": getattr(exc, "code", None)}
            outcome["message"] = str(exc)
        try:
            os.write(write_fd, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    data = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if select.select([read_fd], [], [], deadline - time.monotonic())[0]:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    break
                data += chunk
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("the child did not finish within 30 s")
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(data)
    return result


@contextlib.contextmanager
def stopped_until(site: SiteProcess, ready_fd: int) -> Iterator[None]:
    """SIGSTOP the site's daemon; SIGCONT it once ``ready_fd`` is readable (or after 10 s)."""
    assert site.process is not None
    pid = site.process.pid
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T")

    def resume() -> None:
        select.select([ready_fd], [], [], 10)
        os.kill(pid, signal.SIGCONT)

    resumer = threading.Thread(target=resume)
    resumer.start()
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
        resumer.join(15)
        os.close(ready_fd)


def refusal_text(path: Path) -> str:
    return (
        f"uid {NOBODY} (gid {NOBODY}, supplementary groups none) may not use the wangate "
        f"gateway at {path}: it admits uids 0 (root) and members of gids 0 (root). Run as "
        "one of those, join one of those groups, or add the uid to [site] allow_uids "
        "(or a group to allow_gids) in the gateway's config"
    )


def cap_text(path: Path) -> str:
    return (
        f"the wangate gateway at {path} already serves {CAP} local connections, its limit "
        "([limits] max_local_connections): close idle clients or raise the limit"
    )


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def round_trip(gw: wangate.Client, site: str, tag: str) -> list[int]:
    array = np.arange(6, dtype=np.int32) * len(tag)
    gw.send(site, tag, array, step=3)
    got = gw.recv(tag, source=site, step=3, timeout=10)
    assert got.dtype == np.int32 and got.tobytes() == array.tobytes()
    return [int(x) for x in got]


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_another_uid_is_refused_and_an_allowed_client_keeps_working(lab: LoopbackSites) -> None:
    path = lab["bj"].socket_path
    with wangate.Client(path, timeout=5) as allowed:
        allowed.ping()

        def sync_client() -> None:
            wangate.Client(path, timeout=5)

        def async_client() -> None:
            asyncio.run(wangate.AsyncClient(path, timeout=5).connect())

        sent_r, sent_w = os.pipe()

        def raw_garbage() -> str:
            # Not even a frame: had the gateway read it, the reply would be bad_magic.
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(os.fspath(path))
                sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
                os.write(sent_w, b"s")
                return read_until_closed(sock).hex()

        expected = {
            "error": "AccessDenied",
            "code": "access_denied",
            "message": refusal_text(path) + " [access_denied]",
        }
        assert run_as(NOBODY, NOBODY, [], sync_client) == expected
        assert run_as(NOBODY, NOBODY, [], async_client) == expected
        reply = encode_header(error_reply(None, "access_denied", refusal_text(path)))
        # The daemon is stopped until the garbage is queued on the connection, so the
        # gateway's check surely comes after bytes were there to read.
        with stopped_until(lab["bj"], sent_r):
            outcome = run_as(NOBODY, NOBODY, [], raw_garbage)
        os.close(sent_w)
        assert outcome == {"result": reply.hex()}
        # the allowed connection, open all along, is still served, and so are new ones
        allowed.ping()
        assert round_trip(allowed, "bj", "after-refusal") == [0, 13, 26, 39, 52, 65]
    with wangate.Client(path, timeout=5) as again, lab["sh"].client() as at_sh:
        again.send("sh", "to-sh", np.arange(5, dtype=np.int32), step=1)
        got = at_sh.recv("to-sh", source="bj", step=1, timeout=10)
        assert got.tolist() == [0, 1, 2, 3, 4]
    log = lab["bj"].log_path
    wait_for(lambda: "refused a local connection (access_denied)" in log.read_text())
    assert f"uid {NOBODY} (gid {NOBODY}" in log.read_text()
    # each daemon says at start whom it admits
    assert f"local API at {path} admits uids 0 (root) and members of gids 0 (root)\n" in (
        log.read_text()
    )
    nobody = pwd.getpwuid(NOBODY).pw_name
    assert (
        f"local API at {lab['sh'].socket_path} admits uids 0 (root), {NOBODY} ({nobody}) "
        "and members of gids 0 (root)\n"
    ) in lab["sh"].log_path.read_text()


def test_membership_of_the_socket_group_admits_another_uid(lab: LoopbackSites) -> None:
    """uid and primary gid 65534, but a supplementary group 0: the socket's group."""
    path = lab["bj"].socket_path

    def work() -> list[Any]:
        with wangate.Client(path, timeout=5) as gw:
            return [gw.site, round_trip(gw, "bj", "member")]

    assert run_as(NOBODY, NOBODY, [0], work) == {"result": ["bj", [0, 6, 12, 18, 24, 30]]}


def test_allow_uids_admits_that_uid(lab: LoopbackSites) -> None:
    path = lab["sh"].socket_path

    def work() -> list[Any]:
        with wangate.Client(path, timeout=5) as gw:
            sent = round_trip(gw, "sh", "allowed")

            async def use_async() -> str:
                async with wangate.AsyncClient(path, timeout=5) as agw:
                    await agw.ping()
                    return agw.site

            return [gw.site, sent, asyncio.run(use_async())]

    assert run_as(NOBODY, NOBODY, [], work) == {"result": ["sh", [0, 7, 14, 21, 28, 35], "sh"]}


def test_a_job_admits_only_its_groups_by_the_kernels_credentials(lab: LoopbackSites) -> None:
    """sh admits uid 65534 to its socket, but its job ``team`` only the group 4242:
    named by hello, the job is refused to 65534 alone and admitted with the group as a
    supplementary one; the default job admits it either way."""
    path = lab["sh"].socket_path

    def join(job: str | None) -> Callable[[], list[Any]]:
        def work() -> list[Any]:
            with wangate.Client(path, timeout=5, job=job) as gw:
                return [gw.job, round_trip(gw, "sh", f"in-{gw.job}")]

        return work

    refused = run_as(NOBODY, NOBODY, [], join("team"))
    assert refused == {
        "error": "GatewayError",
        "code": "job_denied",
        "message": f"job 'team' admits groups {TEAM_GID}; this process runs as uid {NOBODY} "
        f"gids {NOBODY} [job_denied]",
    }
    member = run_as(NOBODY, NOBODY, [TEAM_GID], join("team"))
    assert member == {"result": ["team", [0, 7, 14, 21, 28, 35]]}
    assert run_as(NOBODY, NOBODY, [], join(None)) == {
        "result": ["default", [0, 10, 20, 30, 40, 50]]  # the tag "in-default"
    }
    with lab["sh"].client("team") as root:  # root is always admitted
        assert root.job == "team"


def test_connections_past_the_cap_are_refused_and_a_freed_slot_is_reused(
    lab: LoopbackSites,
) -> None:
    path = lab["bj"].socket_path
    clients = [wangate.Client(path, timeout=5) for _ in range(CAP)]
    try:
        with pytest.raises(wangate.TooManyConnections) as info:
            wangate.Client(path, timeout=5)
        assert str(info.value) == cap_text(path) + " [too_many_connections]"
        assert info.value.code == "too_many_connections"
        assert isinstance(info.value, wangate.GatewayUnavailable)

        async def connect_async() -> None:
            await wangate.AsyncClient(path, timeout=5).connect()

        with pytest.raises(wangate.TooManyConnections) as info:
            asyncio.run(connect_async())
        assert str(info.value) == cap_text(path) + " [too_many_connections]"
        # the first CAP are still served
        for gw in clients:
            gw.ping()
        payload = np.linspace(0, 1, 1000, dtype=np.float32)
        clients[0].send("bj", "cap", payload, step=1)
        assert clients[3].recv("cap", source="bj", step=1, timeout=10).tobytes() == (
            payload.tobytes()
        )
        # a client that leaves frees its slot (once the gateway has seen it go)
        clients.pop(0).close()
        replacement: list[wangate.Client] = []

        def admitted() -> bool:
            try:
                replacement.append(wangate.Client(path, timeout=5))
            except wangate.TooManyConnections:
                return False
            return True

        wait_for(admitted)
        clients += replacement
        assert round_trip(clients[-1], "bj", "reused") == [0, 6, 12, 18, 24, 30]
        with pytest.raises(wangate.TooManyConnections):
            wangate.Client(path, timeout=5)
    finally:
        for gw in clients:
            gw.close()
    log = lab["bj"].log_path
    wait_for(lambda: "refused a local connection (too_many_connections)" in log.read_text())


# ------------------------------------------------------------------ the policy itself


def test_policy_defaults_and_explicit_lists() -> None:
    default = AccessPolicy.build(None, None, socket_gid=4242, own_uid=999)
    assert default.uids == {0, 999} and default.gids == {4242}
    explicit = AccessPolicy.build([1000, 1001], [], socket_gid=4242, own_uid=0)
    assert explicit.uids == {0, 1000, 1001} and explicit.gids == frozenset()
    assert explicit.description.startswith("uids 0 (root), ")
    assert "members of gids" not in explicit.description
    assert explicit.check(PeerCredentials(1, 1001, 5)) is None
    assert explicit.check(PeerCredentials(1, 1002, 5)) == PeerCredentials(1, 1002, 5)


def test_supplementary_groups_are_read_from_proc_only_when_needed(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "4711").mkdir(parents=True)
    (proc / "4711" / "status").write_text(
        "Name:\ttrainer\nUid:\t1000\t1000\t1000\t1000\nGroups:\t27 100 4242 \nVmRSS:\t1 kB\n"
    )
    assert supplementary_groups(4711, os.fspath(proc)) == (27, 100, 4242)
    assert supplementary_groups(4712, os.fspath(proc)) == ()  # gone
    assert supplementary_groups(0, os.fspath(proc)) == ()  # in a pid namespace we cannot see
    policy = AccessPolicy.build(None, None, socket_gid=4242, own_uid=0)
    assert policy.check(PeerCredentials(4711, 1000, 1000), os.fspath(proc)) is None
    refused = policy.check(PeerCredentials(4712, 1000, 1000), os.fspath(proc))
    assert refused == PeerCredentials(4712, 1000, 1000, ())
    # primary gid admits without reading /proc (pid 4712 has no status file)
    assert policy.check(PeerCredentials(4712, 1000, 4242), os.fspath(proc)) is None
    no_groups = AccessPolicy.build([1000], [], socket_gid=4242, own_uid=0)
    assert no_groups.check(PeerCredentials(4711, 1001, 1001), os.fspath(proc)) == (
        PeerCredentials(4711, 1001, 1001, ())  # no group could admit: nothing read
    )


# ------------------------------------------------------------------ what an idle connection costs


def test_an_idle_connection_costs_the_server_a_few_kib(tmp_path: Path) -> None:
    """Python memory the server holds per idle connection (tracemalloc, the server's own
    allocations): it was 256 KiB of read buffer each; `python -m bench.localapi.idle`
    measures the daemon's RSS."""
    import tracemalloc

    from tests.test_localapi_server import GatewayThread, ping_works

    count = 200
    with GatewayThread(tmp_path / "gw.sock") as gateway:
        warm = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        warm.settimeout(10)
        warm.connect(os.fspath(gateway.path))
        assert ping_works(warm)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            socks = []
            for index in range(count):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(10)
                sock.connect(os.fspath(gateway.path))
                assert ping_works(sock, index)  # the server has read from each
                socks.append(sock)
            wait_for(lambda: gateway.server.connection_count == count + 1)
            per_connection = (tracemalloc.get_traced_memory()[0] - before) / count
        finally:
            tracemalloc.stop()
        for sock in [warm, *socks]:
            sock.close()
    # client sockets and the server's connection objects; no 16 KiB staging area is kept
    assert per_connection < 8 * 1024, per_connection
