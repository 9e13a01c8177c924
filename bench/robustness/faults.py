"""Faults as a trainer sees them: what each call returned or raised, and after how long.

    .venv/bin/python -m bench robustness faults --runs 3
    .venv/bin/python -m bench robustness faults --runs 3 --tree REV   # and REV's daemons

Real daemons on loopback (``wangate.loopback.LoopbackSites``), real SIGKILL. With
``--tree`` each run is done again with that tree's daemons (bench/tree.py); the trainer
side is always this tree's ``wangate.Client``.

Scenarios (two sites, ``peer_dead_s`` at its default unless said):

- ``kill``: sh's daemon is SIGKILLed while bj sends it 1 MB messages and a bj trainer
  waits in ``recv(source="sh")``: when the recv and the sends fail, how long any send
  blocks, when ``status`` says so and when no path row says "up".
- ``kill_listener``: the same with the roles swapped: bj, the site that only listens,
  is killed while sh sends.
- ``held``: 10 messages confirmed to bj but not taken at sh; sh is SIGKILLed and
  restarted: how many bj learns failed (``wait``, ``status``), and when.
- ``deadline``: a send with ``deadline_s=0.5`` while the peer's window is full.
- ``cold``: cold start of 2 sites with 3 paths: time until every path is up, and
  connections closed within 8 s of start (the connect race tore paths down).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import tree as trees
from bench.tree import Tree
from wangate.errors import WangateError
from wangate.loopback import LoopbackSites

OBSERVE_S = 20.0


def _poll(condition: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    return None


def _what(outcome: object) -> str:
    return type(outcome).__name__ if isinstance(outcome, BaseException) else "ok"


def kill_scenario(directory: Path, sender_site: str = "bj", victim: str = "sh") -> dict[str, Any]:
    result: dict[str, Any] = {}
    with LoopbackSites(2, 2, directory=directory, mtu=1500, verbose=False) as lab:
        recv_outcome: list[tuple[float, object]] = []

        def recv() -> None:
            with lab[sender_site].client() as gw:
                try:
                    gw.recv("from-victim", source=victim, timeout=OBSERVE_S)
                    recv_outcome.append((time.monotonic(), "ok"))
                except WangateError as exc:
                    recv_outcome.append((time.monotonic(), exc))

        threading.Thread(target=recv, daemon=True).start()

        def take() -> None:
            with contextlib.suppress(WangateError), lab[victim].client() as gw:
                while True:
                    gw.recv("grad", timeout=OBSERVE_S)

        threading.Thread(target=take, daemon=True).start()
        calls: list[tuple[float, float, object]] = []
        stop = threading.Event()

        def send() -> None:
            array = np.arange(250_000, dtype=np.float32)
            with lab[sender_site].client() as gw:
                step = 0
                while not stop.is_set():
                    started = time.monotonic()
                    outcome: object
                    try:
                        outcome = gw.send(victim, "grad", array, step=step)
                    except WangateError as exc:
                        outcome = exc
                    calls.append((started, time.monotonic(), outcome))
                    step += 1

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        _poll(lambda: len(calls) >= 5, 20)
        killed_at = lab.kill(victim)
        seen_state: float | None = None
        paths_not_up: float | None = None
        with lab[sender_site].client() as gw:
            while time.monotonic() < killed_at + OBSERVE_S:
                now = time.monotonic()
                if (
                    seen_state is None
                    and gw.status()["peers"][victim].get("state") == "unreachable"
                ):
                    seen_state = now - killed_at
                if paths_not_up is None and all(r["state"] != "up" for r in gw.paths()):
                    paths_not_up = now - killed_at
                if seen_state is not None and paths_not_up is not None and recv_outcome:
                    break
                time.sleep(0.05)
        stop.set()
        sender.join(timeout=OBSERVE_S)
        after = [c for c in calls if c[1] > killed_at]
        failed = [c for c in after if isinstance(c[2], BaseException)]
        result["recv"] = (
            f"{_what(recv_outcome[0][1])} at {recv_outcome[0][0] - killed_at:.2f} s"
            if recv_outcome
            else f"no answer in {OBSERVE_S:g} s"
        )
        result["first_send_error"] = (
            f"{_what(failed[0][2])} at {failed[0][1] - killed_at:.2f} s"
            if failed
            else f"none in {OBSERVE_S:g} s"
        )
        result["sends_accepted_after_kill"] = sum(
            1 for c in after if not isinstance(c[2], BaseException)
        )
        result["longest_send_s"] = round(
            max((c[1] - max(c[0], killed_at) for c in after), default=0), 2
        )
        result["status_unreachable_s"] = None if seen_state is None else round(seen_state, 2)
        result["no_path_up_s"] = None if paths_not_up is None else round(paths_not_up, 2)
    return result


def held_scenario(directory: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with LoopbackSites(2, 1, directory=directory, mtu=1500, verbose=False) as lab:
        with lab["bj"].client() as gw:
            ids = [gw.send("sh", "held", np.full(1000, s, np.float32), step=s) for s in range(10)]
            _poll(lambda: gw.status()["peers"]["sh"].get("messages_sent", 0) >= 10, 20)
        lab.kill("sh")
        up_at = lab.restart("sh", 30)
        with lab["bj"].client() as gw:
            outcomes: list[str] = []
            for msg_id in ids:
                try:
                    gw.wait("sh", msg_id, timeout=10)
                    outcomes.append("taken")
                except WangateError as exc:
                    outcomes.append(type(exc).__name__)
            reported_s = time.monotonic() - up_at
            failures = gw.status()["peers"]["sh"]["recent_failures"]
        result["wait"] = ", ".join(f"{outcomes.count(o)} {o}" for o in sorted(set(outcomes)))
        result["reported_after_restart_s"] = round(reported_s, 2)
        result["status_failures"] = len(failures)
    return result


def deadline_scenario(directory: Path) -> dict[str, Any]:
    small = "[limits]\npeer_inbox_bytes = 1048576\nmax_message_bytes = 1048576\n"
    with LoopbackSites(2, 1, directory=directory, mtu=1500, extra_toml=small, verbose=False) as lab:
        with lab["bj"].client() as gw:
            for step in range(6):
                gw.send("sh", "fill", np.zeros(65536, np.float32), step=step)
            _poll(lambda: gw.status()["peers"]["sh"]["messages_waiting"] >= 1, 20)
        outcome: list[object] = []
        started = time.monotonic()

        def late() -> None:
            with lab["bj"].client() as gw:
                try:
                    outcome.append(
                        gw.send("sh", "late", np.ones(200_000, np.float32), deadline_s=0.5)
                    )
                except WangateError as exc:
                    outcome.append(exc)

        thread = threading.Thread(target=late, daemon=True)
        thread.start()
        thread.join(OBSERVE_S)
        took_s = time.monotonic() - started
        if not outcome:
            return {"send": f"still blocked after {took_s:.0f} s"}
        return {"send": f"{_what(outcome[0])} after {took_s:.2f} s"}


def cold_scenario(directory: Path) -> dict[str, Any]:
    lab = LoopbackSites(2, 3, directory=directory, mtu=1500)
    started = time.monotonic()
    with lab:
        up_s = time.monotonic() - started
        time.sleep(max(0.0, started + 8 - time.monotonic()))  # past the 5 s dial timeout
        log = lab["sh"].log_path.read_text() + lab["bj"].log_path.read_text()
        with lab["sh"].client() as gw:
            rows = gw.paths()
    return {
        "all_up_s": round(up_s, 2),
        "closed_within_8s": log.count(": connection closed"),
        "never_retrieved": log.count("never retrieved"),
        "up_at_8s": sum(r["state"] != "down" for r in rows),
    }


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "kill": kill_scenario,  # the dialing site dies
    "kill_listener": lambda directory: kill_scenario(directory, "sh", "bj"),
    "held": held_scenario,
    "deadline": deadline_scenario,
    "cold": cold_scenario,
}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench robustness faults")
    parser.add_argument("--runs", type=int, default=3)
    trees.add_argument(parser)
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = parser.parse_args(argv)
    compared = trees.trees(args)
    for name in args.scenarios:
        rows: dict[Tree, list[dict[str, Any]]] = {tree: [] for tree in compared}
        for _ in range(args.runs):
            for tree in compared:
                with (
                    tempfile.TemporaryDirectory(prefix="wangate-faults-") as directory,
                    tree.active(),
                ):
                    try:
                        rows[tree].append(SCENARIOS[name](Path(directory)))
                    except (WangateError, OSError, AssertionError) as exc:
                        rows[tree].append({"error": f"{type(exc).__name__}: {exc}"})
        for tree in compared:
            print(f"## {name} ({tree.label})")
            _report(rows[tree])
        sys.stdout.flush()


def _report(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print("  " + "; ".join(f"{k}={v}" for k, v in row.items()))
    numeric = {k for row in rows for k, v in row.items() if isinstance(v, int | float)}
    for key in sorted(numeric):
        values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
        print(f"  {key}: median {statistics.median(values):g}, max {max(values):g}")
