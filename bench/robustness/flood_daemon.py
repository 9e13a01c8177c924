"""``python -m wangate`` with one thing changed, for side-by-side runs in the flood bench.

    python -m bench.robustness.flood_daemon [--tuned-gc] [--aioquic-serve] -- run -c site.toml

--tuned-gc       once listening, start-up objects frozen and full collections 100
                 times rarer (what the daemon did before the flood bench's measurements;
                 without it the collector is as Python sets it)
--aioquic-serve  peers are accepted by aioquic's own ``serve()``: no address
                 validation, no half-open caps (the listener before the flood bench's change)
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from aioquic.asyncio.server import serve

from wangate import cli, daemon
from wangate.net import aioquic_compat as compat


async def _aioquic_serve(
    host: str, port: int, *, configuration: Any, create_protocol: Any, **_: Any
) -> Any:
    server = await serve(
        host,
        port,
        configuration=configuration,
        create_protocol=lambda connection, stream_handler=None: create_protocol(connection),
    )
    server.transport = compat.transport_of(server)  # what the daemon reads of a listener
    return server


def _tuned_gc() -> None:
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 1000)


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    options, rest = argv[:split], argv[split + 1 :]
    if "--tuned-gc" in options:
        start = daemon.Gateway.start

        async def start_then_tune(gateway: daemon.Gateway) -> None:
            await start(gateway)
            _tuned_gc()

        daemon.Gateway.start = start_then_tune  # type: ignore[method-assign]
    if "--aioquic-serve" in options:
        daemon.listen_for_peers = _aioquic_serve  # type: ignore[assignment]
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
