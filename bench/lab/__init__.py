"""The WAN lab: emulated multi-path links between sites in network namespaces."""

from bench.lab.gilbert import GilbertElliott, GilbertElliottParams
from bench.lab.lab import Lab, PathAddress, cleanup
from bench.lab.link import LinkEmulator, LinkParams, LinkStats
from bench.lab.scenario import Scenario, load_scenario, parse_scenario

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
