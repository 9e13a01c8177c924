"""Lab site addresses: a TCP connection between two sites' addresses crosses exactly
the emulated link between them, with the congestion control the lab set."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from wangate.errors import WangateError
from wangate.lab import netns, siteroutes
from wangate.lab.lab import Lab
from wangate.lab.scenario import load_scenario

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]
_problem = netns.environment_problem()
if _problem:
    pytestmark.append(pytest.mark.skip(reason=_problem))

PORT = 5601
SIZE = 300_000

SERVER = f"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], {PORT})); s.listen(1); print("listening", flush=True)
c, peer = s.accept(); n = 0
while chunk := c.recv(65536):
    n += len(chunk)
print(peer[0], n, flush=True)
"""

CLIENT = f"""
import socket, sys
c = socket.create_connection((sys.argv[1], {PORT}))
c.sendall(bytes({SIZE})); print(c.getsockname()[0], flush=True)
sys.stdin.readline(); c.close()
"""


def _available() -> list[str]:
    return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()


def _transfer(lab: Lab, src: str, dst: str) -> tuple[str, str, int, list[str]]:
    """SIZE bytes from src's address to dst's; (client address, peer seen by the
    server, bytes received, congestion control of src's connection while open)."""
    server = lab.run_in(
        dst,
        [sys.executable, "-c", SERVER, siteroutes.site_address(lab, dst)],
        stdout=subprocess.PIPE,
    )
    assert server.stdout is not None and server.stdout.readline() == b"listening\n"
    client = lab.run_in(
        src,
        [sys.executable, "-c", CLIENT, siteroutes.site_address(lab, dst)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert client.stdout is not None and client.stdin is not None
    local = client.stdout.readline().decode().strip()
    in_use = siteroutes.congestion_in_use(lab, src)
    client.stdin.write(b"\n")
    client.stdin.close()
    assert client.wait(timeout=30) == 0
    peer, received = server.stdout.readline().decode().split()
    assert server.wait(timeout=30) == 0
    return local, peer, int(received), in_use


def test_site_addresses_route_over_the_direct_link() -> None:
    with Lab(load_scenario("coll_3"), run_id="t" + secrets.token_hex(2)) as lab:
        assert siteroutes.add_site_addresses(lab) == {
            "bj": "10.78.0.1",
            "sh": "10.78.0.2",
            "gz": "10.78.0.3",
        }
        before = lab.link_stats()
        local, peer, received, _ = _transfer(lab, "bj", "gz")
        after = lab.link_stats()
        assert (local, peer, received) == ("10.78.0.1", "10.78.0.1", SIZE)

        def moved(path: str) -> int:
            delivered = after[path]["a_to_b"]["delivered_bytes"]
            return int(delivered - before[path]["a_to_b"]["delivered_bytes"])

        assert moved("bj-gz") >= SIZE  # payload plus headers, bj -> gz
        assert moved("bj-sh") == 0 and moved("sh-gz") == 0


def test_congestion_control_per_namespace_or_per_route() -> None:
    allowed = siteroutes.allowed_congestion_controls()
    restricted = [cc for cc in _available() if cc not in allowed]
    with Lab(load_scenario("coll_3"), run_id="t" + secrets.token_hex(2)) as lab:
        siteroutes.add_site_addresses(lab)
        cases = [(allowed[-1], "sysctl")] + ([(restricted[0], "route")] if restricted else [])
        for algorithm, how in cases:
            assert siteroutes.set_congestion_control(lab, algorithm) == how
            _, _, received, in_use = _transfer(lab, "sh", "gz")
            assert received == SIZE
            assert in_use == [algorithm]
        with pytest.raises(WangateError, match="not available"):
            siteroutes.set_congestion_control(lab, "no-such-cc")
