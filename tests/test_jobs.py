"""Many jobs, one gateway: real daemons, real QUIC, real Unix sockets.

Three loopback sites declare the jobs ``a`` (weight 3) and ``b``; ``stuck`` and
``live`` share a small inbox window between bj and sh. Jobs are namespaces: the same
tags and steps in two jobs never meet; two trainers of one job in one collective get
``collision``; an unknown job is refused by name; a job whose trainers stop reading
holds only its own share of the window.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import wangate
from wangate.loopback import LoopbackSites

pytestmark = pytest.mark.timeout(240)

SITES = ("bj", "sh", "gz")
WINDOW_BYTES = 4 << 20  # [limits] peer_inbox_bytes: every job but one gets half of it
JOBS = """
[collective]
chunk_bytes = 4096
delay_ms = 0

[limits]
peer_inbox_bytes = 4194304
max_message_bytes = 1048576

[jobs.a]
weight = 3

[jobs.b]

[jobs.stuck]

[jobs.live]

[jobs.pair]
sites = ["bj", "sh"]
"""
SLOW_S = 60.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    extra = {"bj": JOBS + "\n[jobs.only-bj]\n", "sh": JOBS, "gz": JOBS}
    sites = LoopbackSites(3, 1, directory=tmp_path_factory.mktemp("jobs"), extra_toml=extra)
    with sites:
        yield sites


def on_every_site(
    lab: LoopbackSites, call: Callable[[wangate.Client, str, str], Any], jobs: tuple[str, ...]
) -> dict[tuple[str, str], Any]:
    """``call(client, site, job)`` for every site and job at once; results or errors."""
    results: dict[tuple[str, str], Any] = {}

    def worker(site: str, job: str) -> None:
        try:
            with lab[site].client(job) as gw:
                results[(site, job)] = call(gw, site, job)
        except BaseException as exc:
            results[(site, job)] = exc

    threads = [threading.Thread(target=worker, args=(s, j)) for s in SITES for j in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SLOW_S * 2)
    return results


def test_two_jobs_with_the_same_tags_and_steps_never_mix(lab: LoopbackSites) -> None:
    """The bug this fixes: two jobs' ``ddp.b0`` at step k blended (102, 201)."""
    value = {"a": 1.0, "b": 100.0}

    def rounds(gw: wangate.Client, site: str, job: str) -> list[tuple[float, float]]:
        assert gw.job == job
        out = []
        for step in range(3):
            array = np.full(6000, value[job], np.float32)
            total = gw.allreduce("ddp.b0", array, step=step, op="sum", timeout=SLOW_S)
            out.append((float(total.min()), float(total.max())))
        gw.send("sh" if site != "sh" else "bj", "plain", np.full(3, value[job]), step=7)
        return out

    results = on_every_site(lab, rounds, ("a", "b"))
    for (site, job), got in results.items():
        assert got == [(3 * value[job], 3 * value[job])] * 3, (site, job, got)
    for job in ("a", "b"):
        with lab["sh"].client(job) as gw:
            arrays = [gw.recv("plain", source="bj", step=7, timeout=SLOW_S) for _ in range(1)]
            arrays += [gw.recv("plain", source="gz", step=7, timeout=SLOW_S)]
            assert [a.tolist() for a in arrays] == [[value[job]] * 3] * 2
        with lab["bj"].client(job) as gw:
            got = gw.recv("plain", source="sh", step=7, timeout=SLOW_S)
            assert got.tolist() == [value[job]] * 3


TRAINER = """
import sys, numpy as np, wangate
gw = wangate.Client(sys.argv[1], job="a")
print("joined", flush=True)
sys.stdin.readline()  # killed here, before it enters step 1
"""


def test_a_job_whose_trainer_is_killed_fails_only_that_jobs_collective(
    lab: LoopbackSites,
) -> None:
    """gz's trainer of job ``a`` is killed: ``a``'s allreduce at bj and sh names gz
    within its timeout, while job ``b``'s allreduce of the same tag and step, at the
    same time on the same three sites, completes exactly."""
    import subprocess
    import sys

    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(lab["gz"].socket_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert trainer.stdout is not None and trainer.stdout.readline() == b"joined\n"
    trainer.kill()
    trainer.wait(10)

    def call(gw: wangate.Client, site: str, job: str) -> Any:
        if job == "a" and site == "gz":
            return None  # its trainer is dead
        array = np.full(3000, 2.0 if job == "b" else 1.0, np.float32)
        timeout = 3.0 if job == "a" else SLOW_S
        started = time.monotonic()
        try:
            total = gw.allreduce("shared", array, step=1, op="sum", timeout=timeout)
        except wangate.CollectiveTimeout as exc:
            return ("timeout", exc.missing, time.monotonic() - started)
        return float(total.min()), float(total.max())

    results = on_every_site(lab, call, ("a", "b"))
    for site in SITES:
        assert results[(site, "b")] == (6.0, 6.0), results
    for site in ("bj", "sh"):
        kind, missing, took_s = results[(site, "a")]
        assert kind == "timeout" and missing == ("gz",), results
        assert took_s < 3.0 + 5.0


def test_a_jobs_collectives_span_its_sites(lab: LoopbackSites) -> None:
    """``pair`` spans bj and sh: an allreduce there needs no ``sites=`` and no gz."""

    def call(gw: wangate.Client, site: str, job: str) -> Any:
        if site == "gz":
            return gw.settings["collective"]["peers"]
        total = gw.allreduce("pairwise", np.full(4, 2.0, np.float32), step=0, timeout=SLOW_S)
        return total.tolist()

    results = on_every_site(lab, call, ("pair",))
    assert results[("bj", "pair")] == results[("sh", "pair")] == [4.0] * 4
    assert results[("gz", "pair")] == ["bj", "sh"]


def test_a_client_that_names_no_job_is_in_default_and_sees_no_other_job(
    lab: LoopbackSites,
) -> None:
    with lab["bj"].client() as plain, lab["bj"].client("a") as in_a:
        assert plain.job == "default" and in_a.job == "a"
        in_a.send("sh", "only-a", np.arange(4), step=1)
        plain.send("sh", "only-a", np.arange(4) * 10, step=1)
    with lab["sh"].client() as plain, lab["sh"].client("a") as in_a:
        assert plain.recv("only-a", source="bj", timeout=SLOW_S).tolist() == [0, 10, 20, 30]
        assert in_a.recv("only-a", source="bj", timeout=SLOW_S).tolist() == [0, 1, 2, 3]
        with pytest.raises(wangate.GatewayError, match="no message 'only-a'"):
            plain.recv("only-a", source="bj", timeout=0.2)


def test_two_trainers_of_one_job_in_one_collective_get_a_collision(lab: LoopbackSites) -> None:
    with lab["bj"].client("a") as first, lab["bj"].client("a") as second:
        first.claim("allreduce/x", 5)
        first.claim("allreduce/x", 5)  # its own claim again: fine
        with pytest.raises(wangate.GatewayError) as caught:
            second.allreduce("x", np.ones(3, np.float32), step=5, timeout=5)
        assert caught.value.code == "collision"
        assert (
            f"collision: allreduce 'x' at step 5 in job 'a' was entered at this site by another "
            f"trainer (pid {_pid()})"
        ) in str(caught.value)
        with pytest.raises(wangate.GatewayError, match="collision: broadcast 'w' at step 0"):
            first.claim("broadcast/w", 0)
            second.broadcast("w", np.ones(2), root="bj", step=0, timeout=5)
        with lab["bj"].client("b") as other_job:
            other_job.claim("allreduce/x", 5)  # another job: another namespace
    with lab["bj"].client("a") as later:
        later.claim("allreduce/x", 5)  # the first connection closed: its claims ended


def _pid() -> int:
    import os

    return os.getpid()


def test_an_unknown_job_is_refused_by_name(lab: LoopbackSites) -> None:
    with pytest.raises(wangate.GatewayError) as caught:
        lab["bj"].client("nope")
    assert caught.value.code == "unknown_job"
    jobs = "default, a, b, stuck, live, pair, only-bj"
    assert f"no job 'nope' in {lab['bj'].config_path} (jobs: {jobs})" in str(caught.value)
    with pytest.raises(wangate.LocalProtocolError, match="job name 'a b' must be"):
        wangate.Client(lab["bj"].socket_path, job="a b")


def test_a_peer_that_does_not_declare_the_job_rejects_its_messages(lab: LoopbackSites) -> None:
    with lab["bj"].client("only-bj") as gw:
        msg_id = gw.send("sh", "nowhere", np.arange(3))
        with pytest.raises(wangate.MessageFailed) as caught:
            gw.wait("sh", msg_id, timeout=SLOW_S)
    assert "no job 'only-bj' here (its jobs: a, b, default, live, pair, stuck)" in str(caught.value)


def test_a_stuck_job_fills_only_its_own_share(lab: LoopbackSites) -> None:
    """``stuck``'s trainers at sh never read; ``live``'s messages keep flowing."""
    piece = np.zeros(256 << 10, np.uint8)  # 256 KiB
    with lab["bj"].client("stuck") as stuck:
        for step in range(12):  # 3 MiB: more than its half of the window
            stuck.send("sh", "pile", piece, step=step)
        with lab["bj"].client("live") as live, lab["sh"].client("live") as reader:
            started = time.monotonic()
            for step in range(24):
                live.send("sh", "flow", piece + 1, step=step)
                got = reader.recv("flow", source="bj", step=step, timeout=SLOW_S)
                assert got.nbytes == piece.nbytes and int(got[0]) == 1
            assert time.monotonic() - started < SLOW_S
        # the live flow can end within 0.1 s, and with worker processes the status is
        # their last report (at most REPORT_INTERVAL_S old while they hold stripes):
        # asked until it shows the stuck job's rest waiting, its share never exceeded
        deadline = time.monotonic() + SLOW_S
        while True:
            mine = stuck.status()["jobs"]["stuck"]["peers"]["sh"]
            assert mine["held_bytes"] <= WINDOW_BYTES // 2 + piece.nbytes + 4096
            if mine["waiting_messages"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert mine["held_bytes"] > 0
        assert mine["waiting_messages"] > 0
    with lab["sh"].client("stuck") as reader:  # it reads at last: nothing was lost
        for step in range(12):
            got = reader.recv("pile", source="bj", step=step, timeout=SLOW_S)
            assert got.nbytes == piece.nbytes


def test_status_and_rows_count_bytes_per_job(lab: LoopbackSites) -> None:
    with lab["gz"].client("b") as gw, lab["sh"].client("b") as reader:
        before = gw.status()["jobs"]["b"]["peers"]["sh"]["bytes_sent"]
        gw.send("sh", "counted", np.zeros(100_000, np.uint8))
        reader.recv("counted", source="gz", timeout=SLOW_S)

        def counted() -> tuple[int, list[dict[str, Any]]]:
            # with worker processes the counts are their last reports: look again
            after = gw.status()["jobs"]["b"]["peers"]["sh"]["bytes_sent"]
            rows = [r for r in gw.paths() if r["peer"] == "sh"]
            assert after - before >= 100_000
            assert sum(r["jobs"]["b"]["bytes_sent"] for r in rows) == after
            return after, rows

        _, rows = _eventually(counted)
        assert rows and all(set(r["jobs"]) >= {"b"} for r in rows)
        received = reader.status()["jobs"]["b"]["peers"]["gz"]["bytes_received"]
        assert received >= 100_000


def test_a_reload_adds_and_removes_a_job(lab: LoopbackSites) -> None:
    site = lab["gz"]
    original = site.config_path.read_text()
    try:
        site.config_path.write_text(original + "\n[jobs.late]\nweight = 2\n")
        assert site.process is not None
        site.process.send_signal(signal.SIGHUP)
        joined = _eventually(lambda: site.client("late"))
        with joined as gw:
            assert gw.job == "late"
            gw.send("gz", "self", np.arange(3))  # within the site
            assert gw.recv("self", timeout=SLOW_S).tolist() == [0, 1, 2]
            site.config_path.write_text(original)
            site.process.send_signal(signal.SIGHUP)

            def refused() -> wangate.GatewayError:
                try:
                    site.client("late").close()
                except wangate.GatewayError as exc:
                    return exc
                raise AssertionError("still admitted")

            error = _eventually(refused)
            assert error.code == "unknown_job"
            with pytest.raises(wangate.GatewayError, match="no job 'late'"):
                gw.send("gz", "self", np.arange(3))
    finally:
        site.config_path.write_text(original)
        site.process.send_signal(signal.SIGHUP)


def _eventually(what: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return what()
        except (wangate.GatewayError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_wangate_jobs_shows_each_jobs_bytes_rate_and_path_share(lab: LoopbackSites) -> None:
    import json
    import subprocess
    import sys

    site = lab["bj"]
    with site.client("a") as gw, lab["sh"].client("a") as reader:
        for step in range(4):
            gw.send("sh", "shown", np.zeros(200_000, np.uint8), step=step)
            reader.recv("shown", source="bj", step=step, timeout=SLOW_S)
        command = [sys.executable, "-m", "wangate", "jobs", "-s", str(site.socket_path)]
        out = subprocess.run(
            [*command, "--json", "--interval", "0.2"], capture_output=True, check=True, timeout=60
        )
        jobs = {job["job"]: job for job in json.loads(out.stdout)}
        assert list(jobs) == ["default", "a", "b", "stuck", "live", "pair", "only-bj"]
        mine = jobs["a"]
        assert mine["weight"] == 3.0 and mine["paths"] is None
        assert (
            mine["bytes_sent"]
            == gw.status()["jobs"]["a"]["peers"]["sh"]["bytes_sent"]
            + (gw.status()["jobs"]["a"]["peers"]["gz"]["bytes_sent"])
        )
        assert mine["bytes_sent"] >= 800_000
        assert set(mine["path_share"]) == {"sh/fiber-a", "gz/fiber-a"}
        assert 0 < mine["path_share"]["sh/fiber-a"] <= 1
        table = subprocess.run(
            [*command, "--interval", "0.1"], capture_output=True, check=True, timeout=60, text=True
        ).stdout
        assert table.splitlines()[0].split()[:4] == ["JOB", "WEIGHT", "SENT", "RECEIVED"]
        assert [line.split()[0] for line in table.splitlines()[1:8]] == list(jobs)


def test_a_connection_stays_in_its_job_and_waits_only_on_its_own_messages(
    lab: LoopbackSites,
) -> None:
    with lab["bj"].client("a") as in_a, lab["bj"].client("b") as in_b:
        msg_id = in_a.send("sh", "mine", np.arange(2))
        with pytest.raises(wangate.GatewayError) as caught:
            in_b.wait("sh", msg_id, timeout=1)
        assert caught.value.code == "unknown_message"
        assert f"no message {msg_id} was sent to sh in job 'b'" in str(caught.value)
    with lab["sh"].client("a") as reader:
        assert reader.recv("mine", source="bj", timeout=SLOW_S).tolist() == [0, 1]


def _exchange(sock: Any, request: Any) -> dict[str, Any]:
    """One request frame out, one reply frame's header back (raw local API)."""
    import struct

    import msgpack

    from wangate.localapi.protocol import encode_request

    sock.sendall(encode_request(request))
    head = b""
    while len(head) < 16:
        head += sock.recv(16 - len(head))
    header_bytes, payload_bytes = struct.unpack("!IQ", head[4:16])
    body = b""
    while len(body) < header_bytes + payload_bytes:
        body += sock.recv(header_bytes + payload_bytes - len(body))
    reply: dict[str, Any] = msgpack.unpackb(body[:header_bytes])
    return reply


def test_a_connections_job_never_changes_and_a_refused_hello_joins_nothing(
    lab: LoopbackSites,
) -> None:
    import socket

    from wangate.localapi.protocol import HelloRequest, StatusRequest

    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(lab["bj"].socket_path))
        assert _exchange(sock, HelloRequest(1, "a"))["job"] == "a"
        assert _exchange(sock, HelloRequest(2, "a"))["job"] == "a"  # the same job again
        switched = _exchange(sock, HelloRequest(3, "b"))
        assert switched["code"] == "bad_request"
        assert switched["error"] == (
            "this connection is in job 'a'; a connection's job never changes "
            "(connect again for job 'b')"
        )
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(lab["bj"].socket_path))
        assert _exchange(sock, HelloRequest(1, "nope"))["code"] == "unknown_job"
        after = _exchange(sock, StatusRequest(2))  # not silently in "default" now
        assert after["code"] == "unknown_job" and "no job 'nope'" in after["error"]
