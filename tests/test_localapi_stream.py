"""Streamed delivery: a large message read while it arrives (proto/localapi.md,
"Streamed delivery"). Real daemons, real QUIC, real Unix sockets and descriptors.

Where a test needs the message still in flight, it pauses the sending daemon itself
(SIGSTOP) once the receiver has seen part of it, and resumes it (SIGCONT) after.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import wangate
from wangate.codec import encode_tensor
from wangate.core.message import message_checksum
from wangate.localapi.protocol import SendRequest, encode_request
from wangate.localapi.segments import RECV_NAME, SEND_NAME, SIZE_SEALS, new_segment, seal
from wangate.loopback import LoopbackSites

from .test_localapi_segments import segment_count
from .test_localapi_server import read_reply

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    with LoopbackSites(2, 1, directory=tmp_path_factory.mktemp("sites")) as lab:
        lab.wait_all_paths_up()
        yield lab


def pid_of(sites: LoopbackSites, name: str) -> int:
    process = sites[name].process
    assert process is not None
    return process.pid


class Paused:
    """The daemon ``pid`` stopped (SIGSTOP) for the ``with`` block: it sends nothing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> Paused:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def test_a_large_message_is_read_while_it_arrives(sites: LoopbackSites) -> None:
    array = np.arange(32 * MiB, dtype=np.uint32)  # 128 MiB, every word different
    expected = array.view(np.uint8)
    with sites["bj"].client() as bj, sites["sh"].client() as sh:
        msg_id = bj.send("sh", "big", array, step=3)
        incoming = sh.recv("big", source="bj", step=3, stream=True, timeout=60)
        assert (incoming.source, incoming.tag, incoming.step) == ("bj", "big", 3)
        assert (incoming.dtype, incoming.shape, incoming.size) == (
            np.dtype(np.uint32),
            (32 * MiB,),
            128 * MiB,
        )
        assert incoming.wait(8 * MiB, timeout=60) >= 8 * MiB
        with Paused(pid_of(sites, "bj")):
            # nothing more leaves the sender: the message cannot finish meanwhile
            with pytest.raises(wangate.RecvTimeout, match="streamed message 'big'"):
                incoming.wait(incoming.size, timeout=0.5)
            ready = incoming.ready_bytes
            assert 8 * MiB <= ready < incoming.size and not incoming.done
            view = incoming.array
            assert view is not None
            # the prefix is there to read, byte for byte, before the end
            assert view.view(np.uint8)[:ready].tobytes() == expected[:ready].tobytes()
        got = incoming.result(timeout=120)
        assert incoming.done and incoming.ready_bytes == incoming.size
        assert got.dtype == np.uint32 and np.array_equal(got, array)
        assert np.shares_memory(got, view)  # the array is the segment: no copy
        bj.wait("sh", msg_id, timeout=60)  # the gateway told the sender it was taken
        del got, view, incoming
    gc.collect()
    assert segment_count(os.getpid(), RECV_NAME) == 0
    assert segment_count(pid_of(sites, "sh"), RECV_NAME) == 0
