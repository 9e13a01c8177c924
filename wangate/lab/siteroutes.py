"""One routable address per lab site, over the emulated links, for TCP baselines.

Every site gets ``10.78.0.<k>/32`` (``k`` = its 1-based place in the scenario) on its
loopback device; every other site reaches it by a host route over the first path of
their direct link (``src`` = its own site address), so a TCP connection between two
site addresses crosses exactly the emulated link between them. Needs a direct link
between every pair of sites (a full mesh), which the collective scenarios have.

TCP congestion control, per namespace: ``net.ipv4.tcp_congestion_control`` when the
algorithm is in the host's ``net.ipv4.tcp_allowed_congestion_control`` (a namespace
other than the host's may set only those); otherwise the kernel refuses (EPERM) and the
host routes between site addresses carry ``congctl NAME`` instead (RTAX_CC_ALGO,
which the kernel applies to every new connection on that route, unrestricted for root).
``congestion_in_use`` reads what live connections really use (``ss -ti``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from wangate.errors import WangateError
from wangate.lab import netns
from wangate.lab.lab import Lab

SITE_NET = "10.78.0"


def site_address(lab: Lab, site: str) -> str:
    return f"{SITE_NET}.{lab.scenario.sites.index(site) + 1}"


def _route_argv(lab: Lab, site: str, peer: str, congctl: str | None) -> list[str]:
    paths = lab.scenario.paths_between(site, peer)
    if not paths:
        raise WangateError(
            f"scenario {lab.scenario.name!r}: no direct link between {site} and {peer}; "
            "site addresses need a full mesh"
        )
    device = lab.tun_name(paths[0], "a" if paths[0].site_a == site else "b")
    argv = ["-n", lab.namespace(site), "route", "replace", f"{site_address(lab, peer)}/32"]
    argv += ["dev", device, "src", site_address(lab, site)]
    if congctl:
        argv += ["congctl", congctl]
    return argv


def add_site_addresses(lab: Lab) -> dict[str, str]:
    """Give every site its address and routes to all others; returns site -> address."""
    for site in lab.scenario.sites:
        netns.ip(
            "-n", lab.namespace(site), "addr", "add", f"{site_address(lab, site)}/32", "dev", "lo"
        )
    for site in lab.scenario.sites:
        for peer in lab.scenario.sites:
            if peer != site:
                netns.ip(*_route_argv(lab, site, peer, None))
    return {site: site_address(lab, site) for site in lab.scenario.sites}


def allowed_congestion_controls() -> list[str]:
    return Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()


def set_congestion_control(lab: Lab, algorithm: str) -> str:
    """Make ``algorithm`` what new TCP connections between site addresses use.

    Returns how: ``"sysctl"`` (per-namespace default) or ``"route"`` (``congctl`` on
    the site routes, for an algorithm the host does not allow namespaces to pick)."""
    if (
        algorithm
        not in Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    ):
        raise WangateError(
            f"TCP congestion control {algorithm!r} is not available on this host "
            f"(load it: modprobe tcp_{algorithm})"
        )
    by_sysctl = algorithm in allowed_congestion_controls()
    for site in lab.scenario.sites:
        if by_sysctl:
            result = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    lab.namespace(site),
                    "sysctl",
                    "-q",
                    "-w",
                    f"net.ipv4.tcp_congestion_control={algorithm}",
                ],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                raise WangateError(f"{site}: setting {algorithm}: {result.stderr.strip()}")
        for peer in lab.scenario.sites:
            if peer != site:
                netns.ip(*_route_argv(lab, site, peer, None if by_sysctl else algorithm))
    return "sysctl" if by_sysctl else "route"


def congestion_in_use(lab: Lab, site: str) -> list[str]:
    """The congestion control of every established TCP connection from ``site`` to
    another site's address (from ``ss -tin``), sorted, deduplicated. (A connection
    to its own address stays on lo and keeps the namespace default.)"""
    out = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            lab.namespace(site),
            "ss",
            "-tin",
            "state",
            "established",
            "dst",
            f"{SITE_NET}.0/24",
            "and",
            "not",
            "dst",
            site_address(lab, site),
        ],
        capture_output=True,
        text=True,
    ).stdout
    names = set()
    for line in out.splitlines():
        words = line.split()
        for index, word in enumerate(words):
            if word.startswith("wscale:") and index > 0:
                names.add(words[index - 1])
    return sorted(names)
