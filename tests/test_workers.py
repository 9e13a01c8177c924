"""Worker processes with real daemons: a worker killed mid-transfer, 1 GiB through
workers, status and paths per worker ([workers] count, wangate.workers)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.test_localapi_segments import segment_count, send_then_change_bytes
from wangate.errors import MessageFailed, RecvTimeout, WangateError
from wangate.loopback import LoopbackSites, SiteProcess, process_cpu_s, write_site_configs
from wangate.rows import PathRow
from wangate.shm import RECV_NAME, SEND_NAME
from wangate.workers.sending import STRIPE_NAME
from wangate.workers.worker import BULK_NICENESS

pytestmark = pytest.mark.timeout(300)

MiB = 1 << 20


def workers_of(site: SiteProcess) -> dict[int, dict[str, Any]]:
    with site.client() as gw:
        return {w["index"]: w for w in gw.status()["workers"]}


def poll(what: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := what()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.02)
    return result


@pytest.mark.parametrize("side", ["bj", "sh"])
def test_a_worker_killed_mid_transfer_is_restarted_and_the_message_arrives_once(
    side: str,
) -> None:
    # worker 0 carries critical messages; 1 and 2 share the bulk stripes
    with LoopbackSites(2, 2, workers=3) as lab:
        array = np.random.default_rng(3).integers(0, 1 << 32, 32 * MiB, dtype=np.uint32)
        before = workers_of(lab[side])
        assert [before[i]["role"] for i in range(3)] == ["critical", "bulk", "bulk"]
        with lab["bj"].client() as bj, lab["sh"].client() as sh:
            msg_id = bj.send("sh", "big", array, step=4)  # 128 MiB: 32 stripes

            def some_arrived() -> bool:
                peer = sh.status()["peers"]["bj"]
                return bool(peer["bytes_received"] > 0 and peer["messages_held"] == 0)

            poll(some_arrived)  # mid-transfer: stripes arrived, the message is not whole
            os.kill(before[1]["pid"], signal.SIGKILL)
            after = poll(lambda: (w := workers_of(lab[side]))[1]["restarts"] == 1 and w)
            assert after[1]["pid"] not in (0, before[1]["pid"])
            assert os.path.exists(f"/proc/{after[1]['pid']}")
            assert after[2]["pid"] == before[2]["pid"] and after[2]["restarts"] == 0
            got = sh.recv("big", source="bj", step=4, timeout=200)
            assert got.dtype == np.uint32 and np.array_equal(got, array)
            bj.wait("sh", msg_id, timeout=60)
            # delivered once: no second copy comes
            with pytest.raises(RecvTimeout):
                sh.recv("big", source="bj", timeout=2.0)
            assert sh.status()["peers"]["bj"]["messages_held"] == 0
            # and the restarted worker carries traffic again
            small = np.arange(1000, dtype=np.float32)
            for step in range(6):
                bj.send("sh", "small", small, step=step)
            for step in range(6):
                assert np.array_equal(sh.recv("small", source="bj", step=step, timeout=60), small)


def test_paths_and_status_show_each_worker() -> None:
    with LoopbackSites(2, 2, workers=2) as lab, lab["bj"].client() as bj:
        rows = PathRow.from_dicts(bj.paths())
        assert sorted((r.worker, r.path, r.state) for r in rows) == [
            (0, "fiber-a", "up"), (0, "fiber-b", "up"), (1, "fiber-a", "up"), (1, "fiber-b", "up"),
        ]  # fmt: skip
        ports = {(r.worker, r.path): int(r.local.rsplit(":", 1)[1]) for r in rows}
        assert ports[(1, "fiber-a")] == ports[(0, "fiber-a")] + 1  # bj listens: port + worker
        status = bj.status()
        assert [w["index"] for w in status["workers"]] == [0, 1]
        assert {w["role"] for w in status["workers"]} == {"critical", "bulk"}
        assert all(
            w["pid"] > 0 and w["cpu_s"] > 0 and w["restarts"] == 0 for w in status["workers"]
        )
        assert status["peers"]["sh"]["state"] == "up"
        # the site's CPU counts its workers too (read later, so at least as much; the
        # readings are in clock ticks, and their float sum may round a tick's worth up)
        own = process_cpu_s(lab["bj"].process.pid)  # type: ignore[union-attr]
        parts = own + sum(w["cpu_s"] for w in status["workers"])
        assert lab.cpu_seconds(lab["bj"]) >= parts - 1e-9
        # the bulk worker runs at a lower CPU priority than the critical one
        nice = {w["role"]: _niceness(w["pid"]) for w in status["workers"]}
        assert nice["bulk"] == nice["critical"] + BULK_NICENESS


def _niceness(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of proc(5), counted after "pid (comm)"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_gibibyte_through_workers_arrives_identical() -> None:
    arr = np.arange(256 * MiB, dtype=np.uint32)  # 1 GiB, every word distinct
    arr[::4096] ^= 0xA5A5A5A5
    result: dict[str, np.ndarray] = {}
    with LoopbackSites(2, 1, workers=3) as lab:

        def receive() -> None:
            with lab["sh"].client() as gw:
                result["got"] = gw.recv("gib", source="bj", step=0, timeout=800)

        receiver = threading.Thread(target=receive)
        receiver.start()
        with lab["bj"].client() as gw:
            msg_id = gw.send("sh", "gib", arr, step=0)
            receiver.join()
            gw.wait("sh", msg_id, timeout=60)
        got = result["got"]
        assert got.dtype == np.uint32 and got.shape == arr.shape
        assert np.array_equal(got, arr)
        # both bulk workers carried part of it
        with lab["bj"].client() as gw:
            sent = {r["worker"]: r["sent_bytes"] for r in gw.paths() if r["worker"] in (1, 2)}
        assert sent[1] > 256 * MiB and sent[2] > 256 * MiB, sent


def test_a_worker_that_cannot_listen_stops_the_start_naming_its_port(tmp_path: Path) -> None:
    bj = write_site_configs(tmp_path, 2, 1, mtu=1500, workers=2)[0]
    host, port = bj.config_path.read_text().split("listen = [")[1].split('"')[1].rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind((host, int(port) + 1))  # worker 1's port
        result = subprocess.run(
            [sys.executable, "-m", "wangate", "run", "-c", str(bj.config_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert (
        f"worker 1: {bj.config_path}: site.listen[0]: cannot listen on {host}:{int(port) + 1}: "
        "Address already in use"
    ) in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "wangate: worker 1 exited while starting (end of file; exit code 2); its log lines "
        "above say why"
    )
    assert not bj.socket_path.exists()


def test_wait_through_workers_times_out_while_untaken_then_returns() -> None:
    arr = np.arange(2 * MiB, dtype=np.uint32)  # 8 MiB: two stripes
    with LoopbackSites(2, 1, workers=2) as lab, lab["bj"].client() as bj:
        msg_id = bj.send("sh", "w", arr, step=0)
        # no trainer at sh has taken it: the coordinator waits for news, then gives up
        with pytest.raises(RecvTimeout, match=f"message {msg_id} to sh is still in flight"):
            bj.wait("sh", msg_id, timeout=0.5)
        with lab["sh"].client() as sh:
            assert np.array_equal(sh.recv("w", source="bj", step=0, timeout=60), arr)
        bj.wait("sh", msg_id, timeout=60)


def test_a_segment_payload_reaches_the_workers_uncopied_and_a_change_fails_it() -> None:
    # partial messages go soon: the one whose last stripe fails is dropped within 2 s
    idle = "[limits]\npartial_message_idle_s = 2\n"
    with LoopbackSites(2, 1, workers=2, extra_toml=idle) as lab:
        bj_pid, sh_pid = (lab[name].process.pid for name in ("bj", "sh"))  # type: ignore[union-attr]
        array = np.random.default_rng(5).integers(0, 1 << 32, 16 * MiB, dtype=np.uint32)
        with lab["bj"].client() as bj, lab["sh"].client() as sh:
            msg_id = bj.send("sh", "whole", array, step=1)  # 64 MiB, from a segment
            # in flight (no trainer took it): the coordinator staged no copy of a stripe,
            # the workers send from the trainer's segment
            assert segment_count(bj_pid, STRIPE_NAME) == 0
            got = sh.recv("whole", source="bj", step=1, timeout=120)
            assert np.array_equal(got, array)
            bj.wait("sh", msg_id, timeout=60)
            del got
        # the trainer's bytes changed after hand-over: the stripe's checksum catches it
        send_then_change_bytes(lab)
        poll(lambda: segment_count(sh_pid, RECV_NAME) == 0, 30)  # the partial was dropped
        assert segment_count(bj_pid, SEND_NAME) == 0


def test_a_streaming_recv_of_a_message_waiting_whole_confirms_it_to_the_sender() -> None:
    arr = np.arange(2 * MiB, dtype=np.uint32)  # 8 MiB: two stripes
    with LoopbackSites(2, 1, workers=2) as lab, lab["bj"].client() as bj:
        msg_id = bj.send("sh", "whole", arr, step=0)
        with lab["sh"].client() as sh:
            poll(lambda: sh.status()["inbox"]["queued"] == 1)  # complete, waiting for a recv
            incoming = sh.recv("whole", source="bj", step=0, stream=True, timeout=60)
            assert incoming.done and np.array_equal(incoming.result(timeout=0), arr)
        bj.wait("sh", msg_id, timeout=30)  # the completing stripe was confirmed


def test_sites_with_different_worker_counts_fail_sends_naming_the_count() -> None:
    # bj's worker 0 reaches sh (one process) on the listen port itself; its workers 1
    # and 2 dial ports + 1 and + 2, where nothing listens
    counts = {"bj": "[workers]\ncount = 3\n", "sh": "[workers]\ncount = 1\n"}
    lab = LoopbackSites(2, 1, workers=3, extra_toml=counts)  # ports for 3 workers each
    try:
        for site in lab.sites:  # not lab.start(): it waits for every worker's path
            site.process = lab.launch(site, log_mode="wb")

        def peer_state() -> str | None:
            with contextlib.suppress(WangateError, OSError), lab["bj"].client() as gw:
                return str(gw.status()["peers"]["sh"]["state"])
            return None

        poll(lambda: peer_state() == "up")
        array = np.arange(1000, dtype=np.float32)
        with lab["bj"].client() as bj, lab["sh"].client() as sh:
            critical = bj.send("sh", "key", array, critical=True)
            with pytest.raises(MessageFailed) as refused:
                bj.wait("sh", critical, timeout=30)
            assert str(refused.value) == (
                f"message {critical} (tag 'key', step 0) to sh failed: peer sh rejected it: "
                "it is a stripe of a gateway with worker processes ([workers] count >= 2) and "
                "this gateway runs none: both sites of a pair must set the same [workers] count"
            )
            bulk = bj.send("sh", "grad", array)
            with pytest.raises(MessageFailed) as unreachable:
                bj.wait("sh", bulk, timeout=30)
            assert str(unreachable.value).endswith(
                "(only worker 0 of 3 reaches sh: does sh run the same [workers] count?)"
            )
            peer = sh.status()["peers"]["bj"]
            assert (peer["messages_received"], peer["messages_held"]) == (0, 0)
    finally:
        lab.stop()


def test_a_restarted_receiver_with_workers_fails_what_its_inbox_held_and_sends_none_again() -> None:
    # acked whole, never taken: a new instance knows nothing of them, so each fails at
    # its sender naming the restart, and no stripe goes again to the new instance
    with LoopbackSites(2, 1, workers=2) as lab:
        arrays = {
            step: np.full(size, step, dtype=np.uint32)
            for step, size in enumerate([1000, 2 * MiB, 1000, 2 * MiB])  # 8 MiB: two stripes
        }
        with lab["bj"].client() as bj:
            ids = {step: bj.send("sh", "held", array, step=step) for step, array in arrays.items()}
            poll(lambda: bj.status()["peers"]["sh"]["messages_held"] == len(ids))
        lab.kill("sh")
        lab.restart("sh")
        with lab["bj"].client() as bj, lab["sh"].client() as sh:
            for step, msg_id in ids.items():
                with pytest.raises(MessageFailed) as failed:
                    bj.wait("sh", msg_id, timeout=30)
                assert str(failed.value) == (
                    f"message {msg_id} (tag 'held', step {step}) to sh failed: "
                    "peer sh restarted with it in its inbox, before a trainer took it"
                )
            with pytest.raises(RecvTimeout):
                sh.recv("held", timeout=3.0)  # none of them reached the new instance
            assert sh.status()["inbox"]["queued"] == 0
            # traffic resumes with the new instance
            after = np.arange(2 * MiB, dtype=np.uint32)
            msg_id = bj.send("sh", "after", after, step=9)
            assert np.array_equal(sh.recv("after", source="bj", step=9, timeout=60), after)
            bj.wait("sh", msg_id, timeout=30)
