"""The WAN lab: emulated multi-path links between sites in network namespaces.

Why it lives in ``wangate`` rather than in ``bench/``: it is a tool for whoever runs a
gateway, not only for whoever measures one. Bring a scenario's WAN up between
namespaces (``python -m wangate.lab up SCENARIO --gateway '...'``: its paths' rate,
delay, loss, bursts and a timeline of changes) and try a config against it before
deploying; ``selftest`` says whether the emulator keeps its settings on this machine;
``forge``, ``flood`` and ``traffic`` send hostile packets at a listener while checked
messages flow. The tests use it for the same reasons, and so do the benchmarks: one
lab, imported by both, so that the tests import nothing of ``bench``.

Nothing the daemon, the client or the CLI loads imports it (tests/test_import_graph.py
checks that no module outside this package does), so it costs a gateway nothing.
The shipped scenarios (``scenarios/``, named by subject) are the WAN shapes the
benchmarks measure; a scenario of one's own is a TOML file of the same schema.
"""

from wangate.lab.gilbert import GilbertElliott, GilbertElliottParams
from wangate.lab.lab import Lab, PathAddress, cleanup
from wangate.lab.link import LinkEmulator, LinkParams, LinkStats
from wangate.lab.scenario import Scenario, load_scenario, parse_scenario

__all__ = [
    "GilbertElliott",
    "GilbertElliottParams",
    "Lab",
    "LinkEmulator",
    "LinkParams",
    "LinkStats",
    "PathAddress",
    "Scenario",
    "cleanup",
    "load_scenario",
    "parse_scenario",
]
