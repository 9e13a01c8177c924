"""SIGHUP reload: peers and paths change live, a bad file changes nothing."""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.daemons import NotifySocket, start_daemon, stop, wait_serving
from wangate.config import load_config, parse_config
from wangate.errors import GatewayError, WangateError
from wangate.loopback import SiteProcess, write_site_configs
from wangate.reload import Reloader, ReloadPlan, plan_reload

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    listener = NotifySocket()
    yield listener
    listener.close()


# ------------------------------------------------------------------ the plan (pure)


def site_configs(tmp_path: Path) -> list[SiteProcess]:
    return write_site_configs(tmp_path, 3, 2, mtu=1500)


def peer_blocks(text: str) -> tuple[str, dict[str, str]]:
    """The text before the first [[peers]] and each peer's block by name."""
    head, *blocks = text.split("[[peers]]\n")
    return head, {block.split('"')[1]: block for block in blocks}


def without_path(block: str, path: str) -> str:
    head, *paths = block.split("[[peers.paths]]\n")
    kept = [p for p in paths if not p.startswith(f'name = "{path}"')]
    assert len(kept) == len(paths) - 1
    return "[[peers.paths]]\n".join([head, *kept])


def compose(head: str, blocks: list[str]) -> str:
    return head + "".join("[[peers]]\n" + block for block in blocks)


def test_the_plan_adds_and_removes_peers_and_paths_and_names_what_needs_a_restart(
    tmp_path: Path,
) -> None:
    gz = site_configs(tmp_path)[2]
    full_text = gz.config_path.read_text()
    head, blocks = peer_blocks(full_text)
    running = parse_config(compose(head, [blocks["sh"]]), gz.config_path)
    new_text = compose(
        head.replace("[tls]", "[limits]\npartial_message_idle_s = 30\n\n[tls]")
        + '[compression]\ndefault = "fp16"\n\n',
        [blocks["bj"], without_path(blocks["sh"], "fiber-b")],
    )
    new = parse_config(new_text, gz.config_path)
    plan = plan_reload(running, new)
    assert [p.name for p in plan.peers_added] == ["bj"]
    assert plan.peers_removed == ()
    assert plan.paths_removed == (("sh", "fiber-b"),)
    assert plan.paths_added == ()
    assert plan.restart_needed == ("limits.partial_message_idle_s",)
    assert plan.changes == ["peer bj added", "path sh/fiber-b removed"]
    # what runs: the new peers and compression, the running limits until a restart
    assert plan.effective.peers == new.peers
    assert plan.effective.compression.default == "fp16"
    assert plan.effective.limits == running.limits
    # and back: the peer goes, the path comes back
    back = plan_reload(plan.effective, running)
    assert back.peers_removed == ("bj",)
    assert [(peer, path.name) for peer, path in back.paths_added] == [("sh", "fiber-b")]


def test_a_changed_path_is_removed_and_added_again(tmp_path: Path) -> None:
    gz = site_configs(tmp_path)[2]
    text = gz.config_path.read_text()
    running = parse_config(text, gz.config_path)
    new = parse_config(text.replace("mtu = 1500", "mtu = 1400", 1), gz.config_path)
    plan = plan_reload(running, new)
    assert plan.paths_removed == (("bj", "fiber-a"),)
    assert [(peer, path.name, path.mtu) for peer, path in plan.paths_added] == [
        ("bj", "fiber-a", 1400)
    ]
    assert plan.restart_needed == ()


class FakeGateway:
    """Stands in for the daemon: records the plans it is given."""

    def __init__(self, config_path: Path) -> None:
        self.config = load_config(config_path)
        self.plans: list[ReloadPlan] = []

    def apply_reload(self, plan: ReloadPlan) -> None:
        self.plans.append(plan)
        self.config = plan.effective

    def status_counts(self) -> tuple[int, int, int, int, int]:
        return (1, 2, 3, 4, 5)


def test_a_bad_file_is_reported_and_nothing_is_applied(tmp_path: Path) -> None:
    gz = site_configs(tmp_path)[2]
    gateway = FakeGateway(gz.config_path)
    reloader = Reloader(gateway, gz.config_path)
    assert reloader.status_line() == "peers up 1/2, paths up 3/4, 5 messages in flight"
    good = gz.config_path.read_text()
    gz.config_path.write_text(good.replace("mtu = 1500", "mtu = 1", 1))
    assert reloader.reload() is None
    assert gateway.plans == []
    expected = f"{gz.config_path}: peers[0].paths[0].mtu: 1 is out of range (1280..65535)"
    assert reloader.last_error == expected
    assert reloader.status_line() == (
        f"peers up 1/2, paths up 3/4, 5 messages in flight; reload failed: {expected}"
    )
    gz.config_path.write_text(good.replace("[tls]", "[metrics]\nlisten = '127.0.0.1:9'\n\n[tls]"))
    plan = reloader.reload()
    assert plan is not None and gateway.plans == [plan]
    assert reloader.status_line() == (
        "peers up 1/2, paths up 3/4, 5 messages in flight; restart needed for metrics.listen"
    )


# ------------------------------------------------------------- a real daemon reloads


def poll(what: Callable[[], bool], message: Callable[[], str], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if what():
                return
        except (WangateError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(message())
        time.sleep(0.05)


def connected(site: SiteProcess) -> dict[tuple[str, str], bool]:
    """Each listed path and whether it is connected (up, or degraded by its quality)."""
    with site.client() as gw:
        return {(row["peer"], row["path"]): row["state"] != "down" for row in gw.paths()}


@pytest.fixture
def three_sites(tmp_path: Path) -> Iterator[list[SiteProcess]]:
    sites = site_configs(tmp_path)
    yield sites
    for site in sites:
        if site.process is not None:
            stop(site.process)


def test_reload_adds_a_peer_that_carries_messages_removes_a_path_and_keeps_a_bad_file_out(
    three_sites: list[SiteProcess], notify: NotifySocket
) -> None:
    bj, sh, gz = three_sites
    head, blocks = peer_blocks(gz.config_path.read_text())
    # gz starts without bj (bj knows gz, but gz is the one that dials)
    gz.config_path.write_text(compose(head, [blocks["sh"]]))
    bj.process, sh.process = start_daemon(bj), start_daemon(sh)
    gz.process = start_daemon(gz, {"NOTIFY_SOCKET": notify.name})
    for site in three_sites:
        wait_serving(site, site.process)
    up = {("sh", "fiber-a"): True, ("sh", "fiber-b"): True}
    poll(lambda: connected(gz) == up, lambda: str(connected(gz)))

    reloaded = compose(
        head.replace("[tls]", "[limits]\npartial_message_idle_s = 30\n\n[tls]"),
        [blocks["bj"], without_path(blocks["sh"], "fiber-b")],
    )
    gz.config_path.write_text(reloaded)
    gz.process.send_signal(signal.SIGHUP)
    after = {("bj", "fiber-a"): True, ("bj", "fiber-b"): True, ("sh", "fiber-a"): True}
    poll(lambda: connected(gz) == after, lambda: str(connected(gz)))
    poll(lambda: not connected(sh)[("gz", "fiber-b")], lambda: str(connected(sh)))
    # the added peer carries a message, both ways
    array = np.arange(50_000, dtype=np.float32)
    with gz.client() as gw:
        gw.send("bj", "added", array, step=7)
    with bj.client() as gw:
        assert gw.recv("added", source="gz", step=7, timeout=30).tobytes() == array.tobytes()
        gw.send("gz", "back", array[:10], step=8)
    with gz.client() as gw:
        assert gw.recv("back", source="bj", step=8, timeout=30).tobytes() == array[:10].tobytes()
    log = gz.log_path.read_text()
    assert f"configuration {gz.config_path} reloaded: peer bj added; path sh/fiber-b removed" in log
    assert "changes to limits.partial_message_idle_s take effect only after a restart" in log
    status_after = (
        "STATUS=peers up 2/2, paths up 3/3, 0 messages in flight; "
        "restart needed for limits.partial_message_idle_s"
    )
    notify.wait_for(lambda: status_after in [line for _, line in notify.lines("STATUS=")])
    reloading = [m for _, m in notify.messages() if m.startswith("RELOADING=1\n")]
    assert len(reloading) == 1
    assert reloading[0].split("\n")[1].startswith("MONOTONIC_USEC=")

    # a bad file: logged with file and key, the daemon keeps serving what it ran
    gz.config_path.write_text(reloaded.replace("mtu = 1500", "mtu = 1", 1))
    gz.process.send_signal(signal.SIGHUP)
    error = f"{gz.config_path}: peers[0].paths[0].mtu: 1 is out of range (1280..65535)"
    poll(lambda: error in gz.log_path.read_text(), lambda: gz.log_path.read_text()[-2000:])
    assert f"reload failed, still running the previous configuration: {error}" in (
        gz.log_path.read_text()
    )
    assert gz.process.poll() is None
    assert connected(gz) == after
    with gz.client() as gw:
        gw.send("bj", "still", array[:100], step=9)
    with bj.client() as gw:
        assert gw.recv("still", source="gz", step=9, timeout=30).tobytes() == (
            array[:100].tobytes()
        )
    notify.wait_for(lambda: any("; reload failed: " + error in m for _, m in notify.messages()))

    # the peer removed again: its paths close, sends to it are refused
    gz.config_path.write_text(compose(head, [without_path(blocks["sh"], "fiber-b")]))
    gz.process.send_signal(signal.SIGHUP)
    only_sh = {("sh", "fiber-a"): True}
    poll(lambda: connected(gz) == only_sh, lambda: str(connected(gz)))
    bj_paths = {("sh", "fiber-a"): True, ("sh", "fiber-b"): True}
    bj_paths |= {("gz", "fiber-a"): False, ("gz", "fiber-b"): False}
    poll(lambda: connected(bj) == bj_paths, lambda: str(connected(bj)))
    with gz.client() as gw, pytest.raises(GatewayError, match="unknown peer 'bj'") as info:
        gw.send("bj", "gone", array[:10])
    assert info.value.code == "unknown_peer"
    assert "peer bj removed" in gz.log_path.read_text()

    # SIGTERM: a clean exit that removes the socket file
    assert stop(gz.process) == 0
    assert not gz.socket_path.exists()


def test_effective_config_keeps_every_restart_section(tmp_path: Path) -> None:
    gz = site_configs(tmp_path)[2]
    config = load_config(gz.config_path)
    renamed = dataclasses.replace(
        config, site=dataclasses.replace(config.site, socket=tmp_path / "other.sock")
    )
    plan = plan_reload(config, renamed)
    assert plan.restart_needed == ("site.socket",)
    assert plan.effective.site.socket == gz.socket_path
