"""Faults with real daemons: a peer SIGKILLed mid-transfer, restarted, a sender SIGSTOPped
mid-transfer, and a send whose deadline passes while it waits for room
(proto/delivery.md)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wangate import (
    AsyncClient,
    DeadlineExceeded,
    MessageFailed,
    PeerUnreachable,
    RecvTimeout,
    WangateError,
)
from wangate.core.liveness import PEER_QUIET_S
from wangate.loopback import LoopbackSites

pytestmark = pytest.mark.timeout(120)

PEER_DEAD_S = 2
LIVENESS = f"[limits]\npeer_dead_s = {PEER_DEAD_S}\n"
RESTART_REASON = "peer sh restarted with it in its inbox, before a trainer took it"


def poll(condition: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not met within {timeout_s} s"
        time.sleep(0.02)


def peer_status(lab: LoopbackSites, site: str, peer: str) -> dict[str, Any]:
    with lab[site].client() as gw:
        status: dict[str, Any] = gw.status()["peers"][peer]
        return status


@pytest.mark.single_process  # one row per path; what one session has in flight
def test_a_killed_peer_fails_sends_and_recvs_within_peer_dead_s(tmp_path: Path) -> None:
    with LoopbackSites(2, 2, directory=tmp_path, mtu=1500, extra_toml=LIVENESS) as lab:
        assert peer_status(lab, "bj", "sh")["state"] == "up"
        errors: dict[str, tuple[float, BaseException]] = {}

        def recv(name: str, source: str | None) -> None:
            with lab["bj"].client() as gw:
                try:
                    gw.recv(f"from-{name}", source=source, timeout=60)
                except WangateError as exc:
                    errors[name] = (time.monotonic(), exc)

        waiters = [
            threading.Thread(target=recv, args=("source", "sh")),
            threading.Thread(target=recv, args=("any", None)),  # only sh could send it
        ]
        for thread in waiters:
            thread.start()
        with lab["bj"].client() as gw:
            poll(lambda: gw.status()["inbox"]["waiting_recvs"] == 2, what="recvs waiting")

        # mid-transfer: sh's trainer takes messages while bj sends 1 MB ones
        taken: list[int] = []

        def take_at_sh() -> None:
            with contextlib.suppress(WangateError), lab["sh"].client() as gw:
                while True:
                    taken.append(gw.recv("grad", source="bj", timeout=30).size)

        threading.Thread(target=take_at_sh, daemon=True).start()
        array = np.arange(250_000, dtype=np.float32)
        calls: list[tuple[float, float, object]] = []  # (started, returned, id or error)
        stop = threading.Event()

        def send_forever() -> None:
            with lab["bj"].client() as gw:
                step = 0
                while not stop.is_set():
                    started = time.monotonic()
                    outcome: object
                    try:
                        outcome = gw.send("sh", "grad", array, step=step)
                    except WangateError as exc:
                        outcome = exc
                    calls.append((started, time.monotonic(), outcome))
                    step += 1

        sender = threading.Thread(target=send_forever)
        sender.start()
        poll(lambda: len(taken) >= 3, what="transfer under way")
        killed_at = lab.kill("sh")

        poll(lambda: len(errors) == 2, timeout_s=PEER_DEAD_S + 5, what="recvs failed")
        first_failure = poll(
            lambda: next((c for c in calls if isinstance(c[2], WangateError)), None),
            what="a send failed",
        )
        poll(lambda: sum(isinstance(c[2], PeerUnreachable) for c in calls) >= 20, what="sends")
        stop.set()
        sender.join(timeout=10)
        for thread in waiters:
            thread.join(timeout=10)

        for name in ("source", "any"):
            at, error = errors[name]
            assert isinstance(error, PeerUnreachable), error
            assert killed_at < at <= killed_at + PEER_DEAD_S + 1
        assert str(errors["source"][1]).startswith(
            "recv 'from-source' from sh: peer sh is unreachable (silent for "
        )
        assert str(errors["any"][1]).startswith(
            "recv 'from-any': every peer that could send it is unreachable (sh silent for "
        )
        assert isinstance(first_failure[2], PeerUnreachable)
        assert first_failure[1] <= killed_at + PEER_DEAD_S + 1
        assert str(first_failure[2]).startswith("peer sh is unreachable: silent for ")
        # no call blocks behind the dead peer: every one after the first failure is quick
        after = [c for c in calls if c[0] >= first_failure[1]]
        assert after and all(isinstance(c[2], PeerUnreachable) for c in after)
        assert max(c[1] - c[0] for c in after) <= 1.0  # answered at once (a loaded host: 1 s)
        assert max(c[1] - c[0] for c in calls if c[0] >= killed_at) <= PEER_DEAD_S + 1
        # and nothing piles up behind it: once it is quiet for a second, sends wait, and
        # none is accepted after it was declared unreachable
        accepted = [c[1] for c in calls if not isinstance(c[2], WangateError)]
        assert max(accepted) < min(killed_at + PEER_QUIET_S + PEER_DEAD_S, first_failure[1])

        status = peer_status(lab, "bj", "sh")
        assert status["state"] == "unreachable"
        assert status["state_reason"].startswith("silent for ")
        assert status["paths_up"] == []
        assert status["messages_in_flight"] == 0 and status["messages_waiting"] == 0
        for failure in status["recent_failures"]:
            assert failure["tag"] == "grad"
            assert failure["reason"].startswith("peer sh unreachable: silent for ")
        with lab["bj"].client() as gw:
            rows = gw.paths()
        assert [(r["path"], r["state"], r["peer_state"]) for r in rows] == [
            ("fiber-a", "down", "unreachable"),
            ("fiber-b", "down", "unreachable"),
        ]

        # it comes back: traffic resumes by itself
        lab.restart("sh")
        assert peer_status(lab, "bj", "sh")["state"] in ("restarted", "up")
        with lab["bj"].client() as gw, lab["sh"].client() as sh:
            msg_id = gw.send("sh", "again", array, step=7)
            assert np.array_equal(sh.recv("again", source="bj", timeout=10), array)
            gw.wait("sh", msg_id, timeout=10)


@pytest.mark.single_process  # counts the log lines of one process
def test_a_restarted_receiver_reports_the_messages_its_inbox_held(tmp_path: Path) -> None:
    with LoopbackSites(2, 1, directory=tmp_path, mtu=1500, extra_toml=LIVENESS) as lab:
        with lab["bj"].client() as gw:
            taken_id = gw.send("sh", "taken", np.ones(10, dtype=np.float32))
            with lab["sh"].client() as sh:
                assert sh.recv("taken", timeout=10).tolist() == [1.0] * 10
            gw.wait("sh", taken_id, timeout=10)  # a trainer took it: delivered
            ids = [
                gw.send("sh", "held", np.full(1000, step, dtype=np.float32), step=step)
                for step in range(10)
            ]
            poll(lambda: gw.status()["peers"]["sh"]["messages_held"] == 10, what="confirmed")
            assert gw.status()["peers"]["sh"]["messages_sent"] == 11

        lab.kill("sh")
        lab.restart("sh")
        with lab["bj"].client() as gw:
            poll(lambda: gw.status()["peers"]["sh"]["state"] == "restarted", what="restart seen")
            for step, msg_id in enumerate(ids):
                with pytest.raises(MessageFailed) as failed:
                    gw.wait("sh", msg_id, timeout=10)
                assert str(failed.value) == (
                    f"message {msg_id} (tag 'held', step {step}) to sh failed: {RESTART_REASON}"
                )
            gw.wait("sh", taken_id, timeout=0)  # its outcome is still known

            async def wait_async() -> None:
                async with AsyncClient(lab["bj"].socket_path) as client:
                    await client.wait("sh", taken_id, timeout=0)
                    with pytest.raises(MessageFailed, match=f"^message {ids[4]} .*step 4"):
                        await client.wait("sh", ids[4], timeout=5)

            asyncio.run(wait_async())
            status = gw.status()["peers"]["sh"]
            assert status["messages_held"] == 0
            assert status["recent_failures"] == [
                {"msg_id": msg_id, "tag": "held", "step": step, "reason": RESTART_REASON}
                for step, msg_id in enumerate(ids)
            ]
            # traffic resumes with the new instance
            array = np.arange(5000, dtype=np.float32)
            msg_id = gw.send("sh", "after", array, step=3)
            with lab["sh"].client() as sh:
                assert np.array_equal(sh.recv("after", source="bj", timeout=10), array)
                with pytest.raises(RecvTimeout):
                    sh.recv("held", timeout=0)  # the old inbox is gone, as reported
            gw.wait("sh", msg_id, timeout=10)
        log = lab["bj"].log_path.read_text()
        # one line for the burst, not one per message
        assert log.count(RESTART_REASON) == 1
        assert f"10 messages to sh failed (ids {ids[0]}..{ids[-1]}, tags 'held')" in log


@pytest.mark.single_process  # compares one session's queue before and after
def test_a_deadline_passing_while_waiting_for_room_sends_nothing(tmp_path: Path) -> None:
    small = "[limits]\npeer_inbox_bytes = 1048576\nmax_message_bytes = 1048576\n"
    with LoopbackSites(2, 1, directory=tmp_path, mtu=1500, extra_toml=small) as lab:
        fill = np.zeros(64 * 1024, dtype=np.float32)  # 256 KiB; sh's trainer takes nothing
        with lab["bj"].client() as gw:
            for step in range(6):
                gw.send("sh", "fill", fill, step=step)
            poll(lambda: gw.status()["peers"]["sh"]["messages_waiting"] >= 1, what="backlog")
            before = gw.status()["peers"]["sh"]
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded) as exceeded:
                gw.send("sh", "late", np.ones(200_000, dtype=np.float32), deadline_s=0.5)
            waited_s = time.monotonic() - started
            assert 0.5 <= waited_s < 3
            assert str(exceeded.value).startswith(
                "send 'late' (step 0) to sh: deadline of 0.5 s passed while waiting for room ("
            )
            assert str(exceeded.value).endswith("bytes already queued for it); nothing was sent")
            after = gw.status()["peers"]["sh"]
            assert after["messages_waiting"] == before["messages_waiting"]
            assert after["recent_failures"] == []
            assert after["state"] in ("up", "degraded"), after["state_reason"]  # slow, not dead
        with lab["sh"].client() as sh:
            for step in range(6):
                assert sh.recv("fill", source="bj", step=step, timeout=10).nbytes == fill.nbytes
            with pytest.raises(RecvTimeout):
                sh.recv("late", timeout=1)


@pytest.mark.single_process  # the coordinator would be stopped, not the sending session
def test_a_sender_stopped_mid_transfer_judges_its_path_after_reading_its_acks(
    tmp_path: Path,
) -> None:
    # SIGSTOP holds the sending daemon for 0.3 s: past its retransmission timeout, short
    # of the receiver's silence timeout. When it runs again its overdue timer fires first
    # (uvloop), with the receiver's acks still unread: the timer waits for one read.
    with LoopbackSites(2, 1, directory=tmp_path, mtu=1500) as lab:
        array = np.random.default_rng(5).integers(0, 256, 64 << 20, dtype=np.uint8)
        received: list[object] = []

        def take_at_sh() -> None:
            with lab["sh"].client() as gw:
                try:
                    received.append(gw.recv("big", source="bj", timeout=60))
                except WangateError as exc:
                    received.append(exc)

        taker = threading.Thread(target=take_at_sh)
        taker.start()
        with lab["bj"].client() as gw:
            msg_id = gw.send("sh", "big", array, step=1)
            poll(lambda: peer_status(lab, "sh", "bj")["bytes_received"] > 4 << 20, what="flow")
            process = lab["bj"].process
            assert process is not None
            process.send_signal(signal.SIGSTOP)
            time.sleep(0.3)
            process.send_signal(signal.SIGCONT)
            gw.wait("sh", msg_id, timeout=60)
        taker.join(timeout=60)
        (got,) = received
        assert isinstance(got, np.ndarray) and got.tobytes() == array.tobytes()
        # Up again within a few keep-alive probes: an ack of a datagram sent before the
        # stop times the path at 0.3 s and may hold it degraded (srtt over 30 ms) for two
        # more RTT samples; datagrams wrongly declared lost would hold it degraded (loss
        # over its window) for far longer than this.
        status = poll(
            lambda: (now := peer_status(lab, "bj", "sh"))["state"] == "up" and now,
            timeout_s=2.0,
            what="bj's peer sh up again",
        )
        assert status["late_timers"] >= 1


@pytest.mark.single_process  # the coordinator's trainers would not wait on the stopped one
def test_a_send_that_waited_out_its_gateways_stall_does_not_find_the_peer_unreachable(
    tmp_path: Path,
) -> None:
    # bj's daemon is held up (SIGSTOP) longer than peer_dead_s while a trainer's send
    # waits in its socket. When it runs again, sh's probes wait unread beside that send:
    # the silence was bj's own, and the send goes through.
    dead = "[limits]\npeer_dead_s = 1\n"
    with LoopbackSites(2, 1, directory=tmp_path, mtu=1500, extra_toml=dead) as lab:
        process = lab["bj"].process
        assert process is not None
        with lab["bj"].client() as gw, lab["sh"].client() as sh:
            sent: list[object] = []

            def send() -> None:
                try:
                    sent.append(gw.send("sh", "after", np.arange(1000, dtype=np.float32)))
                except WangateError as exc:
                    sent.append(exc)

            process.send_signal(signal.SIGSTOP)
            sender = threading.Thread(target=send)
            try:
                sender.start()
                time.sleep(1.5)  # past peer_dead_s: sh finds bj unreachable meanwhile
            finally:
                process.send_signal(signal.SIGCONT)
            sender.join(timeout=30)
            (msg_id,) = sent
            assert isinstance(msg_id, int), msg_id
            got = sh.recv("after", source="bj", timeout=30)
            assert got.tobytes() == np.arange(1000, dtype=np.float32).tobytes()
            gw.wait("sh", msg_id, timeout=30)
