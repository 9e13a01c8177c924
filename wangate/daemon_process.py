"""Settings of a process that runs a gateway's event loop (the daemon, each worker).

The collector: every datagram in flight is a small tracked object that lives about
one round trip, so with CPython's default first threshold (700 allocations) a busy
gateway ran a collection every few hundred datagrams, each walking the window in
flight, and full ones walked everything loaded at start-up: about 3 % of a sending
daemon's CPU. What start-up made (modules, config, TLS material) never becomes garbage,
so it is moved out of the collector's sight (``gc.freeze``), and the first threshold is
raised so that a collection comes once per tens of thousands of allocations. Cycles are
still collected, in larger batches (bench/RESULTS.md, "CPU per byte now").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import Final

# allocations (net of frees) of tracked objects between young collections
YOUNG_COLLECTION_THRESHOLD: Final = 50_000


def install_event_loop_policy() -> None:
    """uvloop where it is installed (it is a dependency; a bare checkout may lack it)."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def tune_collector() -> None:
    """Call once start-up has loaded what the process keeps for its lifetime."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)
