"""A dialed path whose handshake completes before anyone waits for it stays up.

aioquic's ``wait_connected()`` only notices a handshake that completes while a waiter
exists; the dialer must not depend on that ordering (it used to lose the race on a
busy loop, and tore a working path down after the dial timeout).
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from tests.daemons import poll_until
from wangate.config import load_config
from wangate.daemon import Gateway
from wangate.loopback import write_site_configs

pytestmark = pytest.mark.timeout(60)


async def _handshake_before_waiting(directory: Path) -> None:
    bj_site, sh_site = write_site_configs(directory, 2, 1, mtu=1500)
    bj = Gateway(load_config(bj_site.config_path))
    sh = Gateway(load_config(sh_site.config_path))  # not started: no dial loop of its own
    await bj.start()
    try:
        path = sh.config.peer("bj").paths[0]
        link = await sh.backend.endpoint.open_link("bj", path)
        # Nobody waits while the handshake runs to completion.
        await poll_until(lambda: link.authenticated)
        # The condition of the race: aioquic's own waiter never hears of it.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(link.wait_connected(), 0.3)
        # The dialer's wait returns at once, and the path is up on both sides.
        await link.wait_handshake(1.0)
        await poll_until(lambda: sh.peers["bj"].links.get(path.name) is link)
        await poll_until(lambda: path.name in bj.peers["sh"].links)
        assert [row.state for row in sh.service.paths()] == ["up"]
        assert link.refused is None
    finally:
        await sh.close()
        await bj.close()


def test_a_handshake_finished_before_the_wait_keeps_the_path(tmp_path: Path) -> None:
    asyncio.run(_handshake_before_waiting(tmp_path))


async def _closed_before_handshake(directory: Path) -> None:
    _, sh_site = write_site_configs(directory, 2, 1, mtu=1500)
    sh = Gateway(load_config(sh_site.config_path))
    loop = asyncio.get_running_loop()
    unretrieved: list[object] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    try:
        link = await sh.backend.endpoint.open_link(
            "bj", sh.config.peer("bj").paths[0]
        )  # nobody listens
        link.close()
        with pytest.raises(ConnectionError):
            await link.wait_handshake(5.0)
        link2 = await sh.backend.endpoint.open_link("bj", sh.config.peer("bj").paths[0])
        link2.close()  # closed and never waited for
        await link2.wait_closed()
        del link, link2
        gc.collect()
        await asyncio.sleep(0)
        assert unretrieved == []
    finally:
        await sh.close()


def test_a_dial_that_fails_leaves_no_unretrieved_exception(tmp_path: Path) -> None:
    asyncio.run(_closed_before_handshake(tmp_path))
