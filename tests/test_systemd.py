"""The daemon under systemd: notify protocol, watchdog, socket activation, the unit files."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import NotifySocket, start_daemon, stop, wait_serving
from wangate.config import load_config
from wangate.daemon import Gateway
from wangate.loopback import write_site_configs
from wangate.reload import Reloader
from wangate.systemd import Notifier, inherited_unix_listener

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    listener = NotifySocket()
    yield listener
    listener.close()


UNITS = Path(__file__).resolve().parent.parent / "systemd"


# --------------------------------------------------------------- notify protocol


def test_a_daemon_reports_ready_status_and_pings_the_watchdog(
    tmp_path: Path, notify: NotifySocket
) -> None:
    bj, sh = write_site_configs(tmp_path, 2, 1, mtu=1500)
    env = {"NOTIFY_SOCKET": notify.name, "WATCHDOG_USEC": "200000"}
    daemon = start_daemon(bj, env)
    peer = None
    try:
        notify.wait_for(lambda: bool(notify.lines("READY=1")))
        ready_message = notify.messages()[0][1]
        assert ready_message == ("READY=1\nSTATUS=peers up 0/1, paths up 0/1, 0 messages in flight")
        # the watchdog is pinged every WATCHDOG_USEC / 2, over and over
        notify.wait_for(lambda: len(notify.lines("WATCHDOG=1")) >= 5)
        # STATUS= follows the daemon's state: the peer comes up
        peer = start_daemon(sh)
        notify.wait_for(
            lambda: (
                ("STATUS=peers up 1/1, paths up 1/1, 0 messages in flight")
                in [line for _, line in notify.lines("STATUS=")]
            )
        )
        assert stop(daemon) == 0
        assert notify.messages()[-1][1] == "STOPPING=1\nSTATUS=shutting down"
        assert not bj.socket_path.exists()
        # the start-up line names the site, then where its trainers connect
        log = bj.log_path.read_text()
        assert f"WARNING wangate: wangate up: site bj, trainers at {bj.socket_path}\n" in log
    finally:
        stop(daemon)
        if peer is not None:
            stop(peer)


def test_a_stuck_event_loop_stops_the_watchdog_pings(tmp_path: Path, notify: NotifySocket) -> None:
    bj, _ = write_site_configs(tmp_path, 2, 1, mtu=1500)
    config = load_config(bj.config_path)
    interval_s = 0.05
    stall: list[float] = []

    async def run() -> None:
        gateway = Gateway(config)
        await gateway.start()
        environ = {"NOTIFY_SOCKET": notify.name, "WATCHDOG_USEC": str(int(interval_s * 2e6))}
        notifier = Notifier(Reloader(gateway, bj.config_path).status_line, environ)
        try:
            notifier.start()
            await asyncio.to_thread(notify.wait_for, lambda: len(notify.lines("WATCHDOG=1")) >= 3)

            def block() -> None:  # the fault: a callback that holds the loop 20 intervals
                stall.append(time.monotonic())
                time.sleep(interval_s * 20)
                stall.append(time.monotonic())

            asyncio.get_running_loop().call_soon(block)
            await asyncio.sleep(0)
            after = lambda: len([at for at, _ in notify.lines("WATCHDOG=1") if at > stall[1]])  # noqa: E731
            await asyncio.to_thread(notify.wait_for, lambda: after() >= 3)
        finally:
            notifier.stop()
            await gateway.close()

    asyncio.run(run())
    pings = [at for at, _ in notify.lines("WATCHDOG=1")]
    assert stall, "the loop was never blocked"
    # no ping while the loop was stuck (15 were due): systemd would kill it. The margin
    # is for a ping sent just before the stall that the reader thread records late.
    during = [at for at in pings if stall[0] + 5 * interval_s < at < stall[1]]
    assert during == []
    assert len([at for at in pings if at < stall[0]]) >= 3
    assert len([at for at in pings if at > stall[1]]) >= 3  # and they resume


def test_the_notifier_is_silent_outside_systemd() -> None:
    notifier = Notifier(lambda: "unused", environ={})
    assert not notifier.enabled and notifier.watchdog_s is None
    assert notifier.send("READY=1") is False
    # a WATCHDOG_USEC meant for another process (WATCHDOG_PID) is not ours
    other = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}
    assert Notifier(lambda: "", environ=other).watchdog_s is None
    own = dict(other, WATCHDOG_PID=str(os.getpid()))
    assert Notifier(lambda: "", environ=own).watchdog_s == 0.5


# ------------------------------------------------------------- socket activation


def test_a_socket_passed_by_systemd_is_served_and_left_in_place(tmp_path: Path) -> None:
    bj, _ = write_site_configs(tmp_path, 2, 1, mtu=1500)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(bj.socket_path))
    listener.listen()
    fd = listener.fileno()

    def as_fd_3() -> None:  # what systemd does before exec: the socket at SD_LISTEN_FDS_START
        if fd != 3:
            os.dup2(fd, 3)  # inheritable
        os.set_inheritable(3, True)

    argv = [sys.executable, "-m", "wangate", "-v", "run", "-c", str(bj.config_path)]
    with bj.log_path.open("wb") as log:
        daemon = subprocess.Popen(
            ["/bin/sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "sh", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=as_fd_3,
            close_fds=False,  # else fd 3 is closed after preexec_fn
        )
    listener.close()  # the daemon's copy is the only one: if it ignored it, nobody answers
    try:
        wait_serving(bj, daemon)
        with bj.client() as gw:
            assert gw.status()["site"] == "bj"
        assert stop(daemon) == 0
        # the file belongs to the socket unit: trainers keep connecting while it restarts
        assert bj.socket_path.exists()
        assert f"using the socket systemd passed for {bj.socket_path}" in bj.log_path.read_text()
    finally:
        stop(daemon)


def test_only_a_socket_for_our_path_and_pid_is_taken(tmp_path: Path) -> None:
    assert inherited_unix_listener(tmp_path / "x.sock", {"LISTEN_FDS": "1"}) is None
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"}
    assert inherited_unix_listener(tmp_path / "x.sock", env) is None


# ------------------------------------------------------------------- unit files


def systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here (CI has it: apt install systemd)")
    return tool


def test_the_service_unit_scores_at_most_2_5_exposure() -> None:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", str(UNITS / "wangate.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for wangate.service: (\d+\.\d+)", result.stdout)
    assert match is not None, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.5, result.stdout


def test_the_units_verify_clean(tmp_path: Path) -> None:
    tool = systemd_analyze()
    # the unit runs /usr/local/bin/wangate (README: how to install it); verify checks that
    # the program exists, so it checks a copy pointing at this installation's wangate
    wangate = Path(sys.executable).parent / "wangate"
    assert wangate.exists()
    text = (UNITS / "wangate.service").read_text()
    assert text.count("ExecStart=/usr/local/bin/wangate run ") == 1
    (tmp_path / "wangate.service").write_text(text.replace("/usr/local/bin/wangate", str(wangate)))
    shutil.copy(UNITS / "wangate.socket", tmp_path / "wangate.socket")
    result = subprocess.run(
        [tool, "verify", str(tmp_path / "wangate.service"), str(tmp_path / "wangate.socket")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_the_units_agree_on_user_group_and_socket() -> None:
    service = (UNITS / "wangate.service").read_text()
    sock = (UNITS / "wangate.socket").read_text()
    sysusers = (UNITS / "wangate.sysusers").read_text()
    assert "User=wangate\n" in service and "Group=wangate\n" in service
    assert "SocketGroup=wangate\n" in sock and "SocketMode=0660\n" in sock
    assert re.search(r"^u wangate ", sysusers, re.M)
    assert "ListenStream=/run/wangate/wangate.sock\n" in sock
    assert "RuntimeDirectory=wangate\n" in service
    assert "ExecReload=/bin/kill -HUP $MAINPID\n" in service
    assert re.search(r"^WatchdogSec=\d+s$", service, re.M)
    assert "Type=notify\n" in service
