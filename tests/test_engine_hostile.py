"""Forged packets aimed at a live path's data plane, on real gateways over loopback.

bj listens, sh dials one path; once it is up, a forger that knows the path's 8-byte
connection ID (it sits in clear in every packet) sprays the socket with packets carrying
it: random bytes, truncations, flipped headers. Each one is dropped at the cost of a
header check or an AEAD, is counted, and moves nothing: the path stays up and keeps
carrying the real peer's packets. Both ends are aimed at: bj's listening socket (read
datagram by datagram, shared by its connections) and sh's own socket (read in batches by
its data plane).
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
from pathlib import Path

import pytest

from tests.one_path import one_path
from wangate.net.aioquic_compat import transport_of
from wangate.net.drain import DrainingTransport

FORGED = 3000


async def _forge(directory: Path, side: str) -> None:
    forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    async with one_path(directory) as link:
        target_link = link.accepted if side == "accepted" else link.dialed
        other = link.dialed if side == "accepted" else link.accepted
        assert target_link.channel is not None
        cid = target_link.channel.recv_cid
        transport = transport_of(target_link)
        assert isinstance(transport, DrainingTransport)
        # both sockets are read in batches by the data plane: the dialer's own by its
        # channel, the listener's (shared) by its ListenerReader
        assert transport.reader is not None
        await asyncio.sleep(0.3)
        before = target_link.channel.stats()
        rng = random.Random(5)
        target = target_link.local_address.rsplit(":", 1)
        address = (target[0], int(target[1]))
        sizes = [rng.choice((29, 64, 1200, 1440)) if i % 3 else rng.randrange(1, 29)
                 for i in range(FORGED)]  # fmt: skip
        for i, size in enumerate(sizes):
            first = 0x40 | rng.randrange(0, 64)  # a short header, any bits
            packet = bytes([first]) + cid + os.urandom(max(0, size - 9))
            forger.sendto(packet[:size], address)
            if i % 200 == 0:
                await asyncio.sleep(0.005)  # let the loop read them
        await asyncio.sleep(0.5)
        after = target_link.channel.stats()
        forged_seen = (after["not_opened"] - before["not_opened"]) + (
            after["replayed"] - before["replayed"]
        )
        # under 29 bytes (header 13, tag 16) a packet is not the data plane's: aioquic
        # drops it; every other one was dropped by the channel, and counted
        assert forged_seen == sum(size >= 29 for size in sizes) > 1900
        assert after["packets_received"] > before["packets_received"]  # the peer's still open
        assert target_link.state.value == "up" and other.state.value == "up"
        assert other.channel is not None and other.channel.stats()["not_opened"] == 0
    forger.close()


@pytest.mark.parametrize("side", ["accepted", "dialed"])
def test_forged_packets_with_a_live_connection_id_are_dropped_and_counted(
    tmp_path: Path, side: str
) -> None:
    asyncio.run(_forge(tmp_path, side))
