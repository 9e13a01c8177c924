"""A message in flight when the peer's dial replaces the connection it went out on.

Both sites dial each path; the connection dialed by the site whose name sorts first is
kept. If the other site's dial came up first, a transfer may already run on it when the
winner replaces it. The sender then goes from the connection's acceptor to its dialer,
whose packets carry the acceptor's connection ID: 4 bytes less room per datagram, so
the repair symbols of the message already cut fit no path any more. Real gateways, real
QUIC and Unix sockets on loopback; in these configs only sh dials, so the test dials
once for bj, late.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tests.daemons import poll_until
from wangate.client import AsyncClient
from wangate.config import load_config
from wangate.daemon import Gateway
from wangate.loopback import write_site_configs
from wangate.net.link import LinkState

pytestmark = pytest.mark.timeout(90)

MESSAGE_BYTES = 48 << 20


async def _replaced_mid_message(directory: Path) -> None:
    bj_site, sh_site = write_site_configs(directory, 2, 1, mtu=1500)
    bj = Gateway(load_config(bj_site.config_path))
    sh = Gateway(load_config(sh_site.config_path))
    await bj.start()  # in these configs sh dials, bj only accepts
    await sh.start()
    try:
        peer, path = "sh", bj.config.peer("sh").paths[0]
        await poll_until(lambda: path.name in bj.peers["sh"].links, 20.0, 0.002)
        first = bj.peers["sh"].links[path.name]
        assert not first.dialed  # sh's dial: bj accepted it, with the longer datagrams
        payload = np.random.default_rng(7).integers(0, 256, MESSAGE_BYTES, dtype=np.uint8)
        async with (
            AsyncClient(bj.config.site.socket) as sender,
            AsyncClient(sh.config.site.socket) as receiver,
        ):
            received = asyncio.ensure_future(receiver.recv("big", source="bj", timeout=60))
            await sender.send("sh", "big", payload)
            session = bj.peers["sh"].view
            await poll_until(lambda: session.status()["source_bytes"] > (1 << 20), 20.0, 0.002)
            # a dial of bj's that started with sh's and completes only now, as at start-up
            host, port = sh.config.site.listen[0]
            dialed = await bj.backend.endpoint.open_link(
                peer, dataclasses.replace(path, remote=(host, port))
            )
            await dialed.wait_handshake(10.0)
            await poll_until(lambda: bj.peers["sh"].links.get(path.name) is dialed, 20.0, 0.002)
            assert first.state is LinkState.CLOSED
            assert session.status()["source_bytes"] < MESSAGE_BYTES  # still on its way
            got = await received
        assert np.array_equal(got, payload)
    finally:
        await sh.close()
        await bj.close()


def test_a_message_outlives_the_connection_it_started_on(tmp_path: Path) -> None:
    asyncio.run(_replaced_mid_message(tmp_path))
