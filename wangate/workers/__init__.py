"""Worker processes: one gateway host uses several cores (``[workers] count``).

``coordinator`` is the daemon process with workers (``sending`` stages a message's
stripes, ``receiving`` puts arriving stripes together and delivers them, ``merge``
builds ``paths`` and ``status`` from the workers' reports); ``worker`` is one worker
process; ``pool`` starts and watches them; ``channel`` is the control channel between
them; ``stripes`` cuts messages and puts them back together (pure).
proto/workers.md has the protocol; wangate/net/README.md the drivers a worker runs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from wangate.config import Config

if TYPE_CHECKING:  # the daemon imports ``stripes`` from this package
    from wangate.daemon import Gateway


def make_gateway(config: Config) -> Gateway:
    """The daemon for ``config``: one process (count 1), or a coordinator of workers."""
    from wangate.daemon import Gateway

    paths = max((len(peer.paths) for peer in config.peers), default=1)
    count = config.workers.resolved(os.cpu_count(), paths)
    if count < 2:
        return Gateway(config)
    from wangate.workers.coordinator import Coordinator

    return Coordinator(config, count)
