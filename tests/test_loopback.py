"""LoopbackSites leaves no daemon behind, however it is used (real daemons)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from wangate.errors import LocalProtocolError
from wangate.loopback import LoopbackSites


def every_pid(lab: LoopbackSites) -> list[int]:
    """Each site's daemon and its worker processes."""
    return [pid for site in lab.sites for pid in lab.pids(site)]


def running(pid: int) -> bool:
    """Whether ``pid`` is a live wangate process (not gone, not a zombie, not reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and b"wangate" in cmdline


def assert_gone(pids: list[int]) -> None:
    # a worker goes by its parent-death signal, a moment after its daemon
    deadline = time.monotonic() + 10
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if running(p)] == []


def test_a_second_start_inside_the_block_refuses_and_the_first_set_is_stopped(
    tmp_path: Path,
) -> None:
    with LoopbackSites(2, 1, directory=tmp_path, mtu=1500, workers=1) as lab:
        pids = every_pid(lab)
        assert len(pids) == 2 and all(running(p) for p in pids)
        with pytest.raises(LocalProtocolError, match="already running"):
            lab.start()
        with pytest.raises(LocalProtocolError, match="still running"):
            lab.restart("sh")
        assert every_pid(lab) == pids  # the first set still serves
        with lab["bj"].client() as gw:
            assert gw.paths()[0]["state"] != "down"
    assert_gone(pids)


@pytest.mark.parametrize(
    ("error", "workers"),
    [(RuntimeError, 2), (KeyboardInterrupt, 1)],
    ids=["exception-with-workers", "keyboard-interrupt"],
)
def test_an_exception_inside_the_block_stops_every_daemon(
    tmp_path: Path, error: type[BaseException], workers: int
) -> None:
    pids: list[int] = []
    with pytest.raises(error), LoopbackSites(2, 1, directory=tmp_path, workers=workers) as lab:
        pids = every_pid(lab)
        assert len(pids) == 2 * (1 + (workers if workers > 1 else 0))
        raise error("the script failed")
    assert_gone(pids)
    assert (tmp_path / "bj.log").exists()  # the logs stay to be read


def test_start_without_a_block_then_close(tmp_path: Path) -> None:
    lab = LoopbackSites(2, 1, mtu=1500, workers=1)
    lab.start()
    pids = every_pid(lab)
    assert all(running(p) for p in pids)
    lab.close()
    assert_gone(pids)
    assert not lab.directory.exists()  # it made the directory, it removes it
    lab.close()  # twice is harmless


def test_the_daemons_can_start_again_after_a_stop(tmp_path: Path) -> None:
    lab = LoopbackSites(2, 1, directory=tmp_path, mtu=1500, workers=1)
    with lab:
        first = every_pid(lab)
        assert set(lab.stop().values()) == {0}  # SIGTERM: a clean exit
        assert_gone(first)
        lab.start()
        second = every_pid(lab)
        assert len(second) == 2 and set(second).isdisjoint(first)
    assert_gone(second)


def test_a_lab_nobody_closes_is_stopped_when_the_interpreter_exits(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from wangate.loopback import LoopbackSites
        lab = LoopbackSites(2, 1, directory=Path({str(tmp_path)!r}), mtu=1500, workers=1)
        lab.start()
        print(*(p for site in lab.sites for p in lab.pids(site)), flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2
    assert_gone(pids)


def test_a_free_port_lies_below_the_ephemeral_range_with_room_for_every_worker() -> None:
    """A dialing socket (port 0) can then never take a worker's port before it binds."""
    import socket as socket_module

    from wangate.loopback import _ephemeral_ports, free_udp_port

    low, _ = _ephemeral_ports()
    addresses = ["127.0.10.1", "127.0.10.2"]
    port = free_udp_port(addresses, 3)
    assert port >= 1024 and port + 2 < low
    held = []
    try:
        for address in addresses:
            for offset in range(3):
                sock = socket_module.socket(socket_module.AF_INET, socket_module.SOCK_DGRAM)
                held.append(sock)
                sock.bind((address, port + offset))
    finally:
        for sock in held:
            sock.close()
