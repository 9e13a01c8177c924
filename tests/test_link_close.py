"""A path goes down as soon as the peer's CONNECTION_CLOSE arrives, not three PTOs later.

aioquic reports a peer's close only when its draining period ends (RFC 9000 §10.2.2);
during it the connection sends nothing, so data the session gave it was lost. Real
gateways, real QUIC on loopback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aioquic.quic.connection import QuicConnectionState

from tests.daemons import poll_until
from wangate.config import load_config
from wangate.daemon import Gateway
from wangate.loopback import write_site_configs
from wangate.net.link import LinkError, PathLink

pytestmark = pytest.mark.timeout(60)


async def _peer_closes(directory: Path) -> None:
    bj_site, sh_site = write_site_configs(directory, 2, 1, mtu=1500)
    bj = Gateway(load_config(bj_site.config_path))
    sh = Gateway(load_config(sh_site.config_path))
    await bj.start()
    await sh.start()
    try:
        path = sh.config.peer("bj").paths[0].name
        await poll_until(lambda: path in sh.peers["bj"].links and path in bj.peers["sh"].links)
        ours = sh.peers["bj"].links[path]
        downs: list[tuple[str, QuicConnectionState]] = []
        driver = sh.peers["bj"]
        link_down = driver.link_down

        def record(link: PathLink, reason: str) -> None:
            if link is ours:
                downs.append((reason, link._quic._state))
            link_down(link, reason)

        driver.link_down = record  # type: ignore[method-assign]
        bj.peers["sh"].links[path].refuse(LinkError.DUPLICATE, "closed for the test")
        await poll_until(lambda: bool(downs))
        assert downs == [("connection closed: closed for the test", QuicConnectionState.DRAINING)]
    finally:
        await sh.close()
        await bj.close()


def test_the_peers_close_takes_the_path_down_at_once(tmp_path: Path) -> None:
    asyncio.run(_peer_closes(tmp_path))
