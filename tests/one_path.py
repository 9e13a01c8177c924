"""Two gateways in this process joined by one real path: bj listens, sh only dials.

For tests that look inside the two ends of one connection (its links and channels)
while it carries real packets over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from wangate.config import load_config
from wangate.config.schema import PathConfig
from wangate.daemon import Gateway
from wangate.loopback import write_site_configs
from wangate.net.link import PathLink


@dataclass
class OnePath:
    bj: Gateway
    sh: Gateway
    path: PathConfig
    dialed: PathLink  # sh's end
    accepted: PathLink  # bj's end


@asynccontextmanager
async def one_path(directory: Path, timeout_s: float = 10.0) -> AsyncIterator[OnePath]:
    bj_site, sh_site = write_site_configs(directory, 2, 1, mtu=1500)
    bj = Gateway(load_config(bj_site.config_path))
    sh = Gateway(load_config(sh_site.config_path))  # not started: it only dials
    await bj.start()
    try:
        path = sh.config.peer("bj").paths[0]
        dialed = await sh.backend.endpoint.open_link("bj", path)
        await dialed.wait_handshake(timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while path.name not in bj.peers["sh"].links or path.name not in sh.peers["bj"].links:
            assert loop.time() < deadline, "the path never came up"
            await asyncio.sleep(0.01)
        yield OnePath(bj, sh, path, dialed, bj.peers["sh"].links[path.name])
    finally:
        await sh.close()
        await bj.close()
