"""Received segments taken back for reuse: a trainer's client returns the segment of a
message once its array is gone, and the gateway writes a later message of the same
job and size into it instead of a fresh one (proto/localapi.md, "Shared-memory
segments"). Real daemons, real clients, real descriptors."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wangate
from wangate.loopback import LoopbackSites
from wangate.shm import map_delivered, new_segment, when_unmapped

from .test_localapi_segments import assert_only_kept_segments

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20
JOBS = "\n[jobs.a]\n\n[jobs.b]\n"


def test_a_mapping_is_reported_gone_once_unless_the_process_forked() -> None:
    gone: list[str] = []
    fd, writable = new_segment(8192, "wangate-test")
    writable.close()
    try:
        first = map_delivered(fd, 64, 4096)
        when_unmapped(first, lambda: gone.append("first"))
        second = map_delivered(fd, 64, 4096)
        when_unmapped(second, lambda: gone.append("second"))
        array = np.frombuffer(first, dtype=np.uint8)
        del first
        gc.collect()
        assert gone == []  # the array still maps it
        del array
        gc.collect()
        assert gone == ["first"]
        child = os.fork()
        if child == 0:
            os._exit(0)  # the child held the mapping too, for as long as it lived
        os.waitpid(child, 0)
        del second
        gc.collect()
        assert gone == ["first"]  # after a fork: never returned
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    with LoopbackSites(
        2, 1, directory=tmp_path_factory.mktemp("reuse"), extra_toml=JOBS, verbose=False
    ) as sites:
        sites.wait_all_paths_up()
        yield sites


def counts(lab: LoopbackSites) -> dict[str, Any]:
    with lab["sh"].client() as client:
        segments: dict[str, Any] = client.status()["segments"]
    return segments


def wait_for(lab: LoopbackSites, key: str, value: int) -> None:
    deadline = time.monotonic() + 30
    while counts(lab)[key] != value:
        assert time.monotonic() < deadline, (key, value, counts(lab))
        time.sleep(0.02)


@pytest.mark.single_process  # with workers: test_with_workers_nothing_is_lent_...
def test_a_returned_segment_holds_the_next_message_of_its_job_only(lab: LoopbackSites) -> None:
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(MiB // 2).astype(np.float32) for _ in range(3)]  # 2 MiB
    with lab["bj"].client("a") as bj, lab["sh"].client("a") as sh:
        bj.send("sh", "g", arrays[0], step=0)
        got = sh.recv("g", source="bj", step=0, timeout=60)
        assert got.tobytes() == arrays[0].tobytes()
        assert counts(lab) | {"pooled_bytes": 0} == {
            "made": 1,
            "reused": 0,
            "live": 1,
            "lent": 1,
            "pooled": 0,
            "pooled_bytes": 0,
        }
        del got
        gc.collect()
        # the next recv returns it; the message it waits for arrives after that
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(sh.recv, "g", source="bj", step=1, timeout=60)
            wait_for(lab, "pooled", 1)
            bj.send("sh", "g", arrays[1], step=1)
            got = waiting.result()
            del waiting  # it holds the array too
        assert got.tobytes() == arrays[1].tobytes()  # bit for bit, over the old bytes
        assert counts(lab) | {"pooled_bytes": 0} == {
            "made": 1,
            "reused": 1,
            "live": 1,
            "lent": 1,
            "pooled": 0,
            "pooled_bytes": 0,
        }
        got[0] = 7.0  # the trainer's array is still its own copy-on-write view
        assert got[0] == 7.0
        del got
        gc.collect()
        with pytest.raises(wangate.RecvTimeout):
            sh.recv("g", source="bj", step=2, timeout=0)  # returns it, takes nothing
        pooled = counts(lab)
        assert (pooled["pooled"], pooled["lent"]) == (1, 0)
        # the same size in job b: a fresh segment, job a's stays pooled
        with lab["bj"].client("b") as bj_b, lab["sh"].client("b") as sh_b:
            bj_b.send("sh", "g", arrays[2], step=0)
            got = sh_b.recv("g", source="bj", step=0, timeout=60)
            assert got.tobytes() == arrays[2].tobytes()
            after = counts(lab)
            assert (after["made"], after["reused"]) == (2, 1)
            del got
    # job a's, unused, is let go after POOL_IDLE_S; the daemon then holds none
    wait_for(lab, "pooled", 0)
    assert assert_only_kept_segments(lab, "sh") == 0


TRAINER_THAT_DIES = textwrap.dedent(
    """
    import sys, time, wangate
    gw = wangate.Client(sys.argv[1], job="a")
    array = gw.recv("dies", source="bj", timeout=60)
    print(int(array[-1]), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.single_process
def test_what_a_killed_trainer_held_is_never_reused(lab: LoopbackSites) -> None:
    before = counts(lab)
    child = subprocess.Popen(
        [sys.executable, "-c", TRAINER_THAT_DIES, os.fspath(lab["sh"].socket_path)],
        stdout=subprocess.PIPE,
    )
    with lab["bj"].client("a") as bj:
        bj.send("sh", "dies", np.arange(MiB, dtype=np.int32), step=0)
    assert child.stdout is not None
    assert child.stdout.readline() == f"{MiB - 1}\n".encode()
    assert counts(lab)["lent"] == 1
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    wait_for(lab, "lent", 0)
    after = counts(lab)
    assert after["pooled"] == before["pooled"]  # forgotten, not pooled
    assert assert_only_kept_segments(lab, "sh") == after["pooled"]


def test_with_workers_nothing_is_lent_and_messages_arrive_as_ever(tmp_path: Path) -> None:
    """A worker writes into the segment through a writable mapping of its own, which
    the seal of a handed-over segment would refuse: worker assemblies are not lent."""
    arrays = [np.full(MiB // 2, n, dtype=np.float32) for n in range(2)]
    with LoopbackSites(2, 1, directory=tmp_path, workers=2, verbose=False) as sites:
        sites.wait_all_paths_up()
        with sites["bj"].client() as bj, sites["sh"].client() as sh:
            for step, array in enumerate(arrays):
                bj.send("sh", "w", array, step=step)
                got = sh.recv("w", source="bj", step=step, timeout=60)
                assert got.tobytes() == array.tobytes()
                del got
                gc.collect()
            after = counts(sites)
        assert (after["made"], after["reused"], after["lent"], after["pooled"]) == (2, 0, 0, 0)
