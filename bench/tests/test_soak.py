"""The fault soak: its checker's classes on hand-made outcomes, the schedule's
determinism, the payloads; and a short real run in the lab (``netns``, skipped without
root and /dev/net/tun)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from bench.robustness.soak import checker, plan, schedule
from bench.robustness.soak.checker import Sent, Take
from bench.robustness.soak.trainers import Receiver
from wangate.lab import netns


def _sent(step: int, outcome: str | None, reason: str = "", msg_id: int | None = 1) -> Sent:
    return Sent("bj>sh", step, 1000 + step, outcome=outcome, reason=reason, msg_id=msg_id)


def test_every_outcome_falls_in_its_class() -> None:
    ok, bad = Take("bj>sh", 0, True), Take("bj>sh", 0, False, "bytes differ from offset 7")
    restarted = f"{checker.RESTARTED} (in its inbox)"
    cases = [
        (_sent(0, "taken"), [ok], "intact"),
        (_sent(0, "unknown", "sender's gateway lost"), [ok], "intact_sender_lost"),
        (_sent(0, "failed", restarted), [ok], "taken_reported_failed"),
        (_sent(0, "failed", "peer unreachable"), [ok], "taken_and_failed"),
        (_sent(0, "failed", checker.ALL_SENT), [ok], "taken_reported_failed"),
        (_sent(0, "failed", checker.DEADLINE_ALL_SENT), [ok], "taken_reported_failed"),
        (_sent(0, "failed", "deadline passed"), [ok], "taken_and_failed"),
        (_sent(0, "failed", "peer unreachable at send", None), [], "failed"),
        (_sent(0, "unknown", "sender's gateway lost"), [], "failed"),
        (_sent(0, "taken"), [ok, ok], "duplicate"),
        (_sent(0, "taken"), [bad], "corrupt"),
        (_sent(0, "taken"), [ok, bad], "corrupt"),
        (_sent(0, "taken"), [], "phantom"),
        (_sent(0, None), [], "unaccounted"),
        (_sent(0, None), [ok], "unaccounted"),
    ]
    for sent, takes, expected in cases:
        assert checker.classify(sent, takes) == expected, (sent, takes)


def test_check_counts_each_class_and_names_each_violation() -> None:
    sent = [
        _sent(0, "taken"),
        _sent(1, "taken"),
        _sent(2, "failed", "deadline passed"),
        _sent(3, "failed", "peer unreachable at send", None),
        _sent(4, "failed", "peer unreachable at send", None),
        _sent(5, "taken"),  # taken twice
        _sent(6, "taken"),  # damaged
        _sent(7, None),  # never resolved, never taken
        _sent(8, "unknown", "sender's gateway lost"),
        _sent(9, "failed", f"{checker.RESTARTED} (in its inbox)"),
    ]
    takes = [
        Take("bj>sh", 0, True),
        Take("bj>sh", 1, True),
        Take("bj>sh", 5, True),
        Take("bj>sh", 5, True),
        Take("bj>sh", 6, False, "bytes differ from offset 100"),
        Take("bj>sh", 8, True),
        Take("bj>sh", 9, True),
        Take("bj>sh", 42, True),  # no such message
        Take("bj>sh", None, False, "no header"),
    ]
    verdict = checker.check(sent, takes)
    assert verdict.sent == 10 and verdict.accepted == 8 and verdict.takes == 9
    assert verdict.classes == {
        "intact": 2,
        "intact_sender_lost": 1,
        "taken_reported_failed": 1,
        "failed": 3,
        "taken_and_failed": 0,
        "duplicate": 1,
        "corrupt": 3,  # step 6, step 42, the take without a header
        "phantom": 0,
        "unaccounted": 1,
    }
    assert verdict.failed_by_reason == {"deadline passed": 1, "peer unreachable at send": 2}
    assert verdict.taken_failed_by_reason == {f"{checker.RESTARTED} (in its inbox)": 1}
    assert verdict.taken_intact == 4  # steps 0, 1, 8, 9
    assert verdict.bytes_taken == 1000 + 1001 + 1008 + 1009
    assert [(v["class"], v["step"]) for v in verdict.violations] == [
        ("duplicate", 5),
        ("corrupt", 6),
        ("unaccounted", 7),
        ("corrupt", None),
        ("corrupt", 42),
    ]
    assert verdict.violations[1]["takes"][0]["detail"] == "bytes differ from offset 100"
    assert not verdict.ok
    assert checker.check(sent[:5], takes[:2]).ok


def test_reasons_name_the_failure() -> None:
    reason = checker.reason_of
    inbox = "message 3 (tag 'x', step 1) to sh failed: peer sh restarted with it in its inbox"
    assert reason("MessageFailed", "message_failed", inbox, "wait") == (
        "receiver restarted (in its inbox)"
    )
    assert reason("MessageFailed", "", "peer sh restarted mid-message", "wait") == (
        "receiver restarted (mid-message)"
    )
    assert reason("MessageFailed", "", "peer sh unreachable: silent for 5.0 s", "wait") == (
        "peer unreachable"
    )
    all_sent = (
        "peer sh unreachable: silent for 5.0 s, after all of it was sent (a trainer there "
        "may have taken it)"
    )
    assert reason("MessageFailed", "", all_sent, "wait") == "peer unreachable (all of it sent)"
    assert reason("MessageFailed", "", "deadline of 3 s passed before sh", "wait") == (
        "deadline passed"
    )
    late = (
        "deadline of 0.5 s passed before sh confirmed it (0 of 9 bytes acknowledged), after "
        "all of it was sent (a trainer there may have taken it)"
    )
    assert reason("MessageFailed", "", late, "wait") == "deadline passed (all of it sent)"
    assert reason("PeerUnreachable", "peer_unreachable", "", "send") == "peer unreachable at send"
    assert reason("DeadlineExceeded", "deadline", "", "send") == "deadline at send"
    assert reason("GatewayUnavailable", "unavailable", "", "wait") == "sender's gateway lost"
    assert reason("GatewayError", "over_budget", "", "send") == "send: over_budget"


def test_rss_is_flat_below_both_bounds() -> None:
    assert checker.rss_flat(100.0, 119.9)
    assert not checker.rss_flat(100.0, 120.0)  # 20 MiB
    assert not checker.rss_flat(40.0, 50.0)  # 25 %
    assert checker.rss_flat(40.0, 30.0)
    rss = {"bj": {"start_mib": 60.0, "end_mib": 90.0}, "sh": {"start_mib": 60.0, "end_mib": 61.0}}
    assert checker.rss_violations(rss) == [
        {"class": "rss", "site": "bj", "start_mib": 60.0, "end_mib": 90.0}
    ]


def test_the_same_seed_gives_the_same_schedule() -> None:
    topology = plan.Topology(3, 2)
    first = schedule.draw_schedule(1, 180.0, topology, workers=2)
    assert first == schedule.draw_schedule(1, 180.0, topology, workers=2)
    assert first != schedule.draw_schedule(2, 180.0, topology, workers=2)
    assert {f.kind for f in first} == set(schedule.KINDS)
    assert "kill_worker" not in {f.kind for f in schedule.draw_schedule(1, 180.0, topology)}
    for fault in first:
        assert fault.ends_s <= 180.0 - schedule.END_MARGIN_S
        if fault.kind == "blackhole":
            assert 0.5 <= fault.duration_s <= 5.0 and fault.target in topology.path_names()
        if fault.kind == "stop":
            assert 0.5 <= fault.duration_s <= 3.0 and fault.target in topology.site_names
    process = [f for f in first if f.kind in schedule.PROCESS_KINDS]
    for before, after in itertools.pairwise(process):  # one at a time
        assert after.at_s >= before.ends_s + schedule.SETTLE_S[before.kind] - 1e-6
    entries = schedule.timeline(first, topology)
    holes = [f for f in first if f.kind == "blackhole"]
    assert len(entries) == 2 * sum(f.kind in schedule.LINK_KINDS for f in first)
    assert {"at_s": holes[0].at_s, "path": holes[0].target, "set": {"blackhole": True}} in entries


def test_message_plan_and_payload_are_a_function_of_seed_flow_and_step() -> None:
    specs = [plan.message_spec(1, "bj>sh", step) for step in range(2000)]
    assert specs == [plan.message_spec(1, "bj>sh", step) for step in range(2000)]
    sizes = [s.size for s in specs]
    assert min(sizes) >= plan.MIN_BYTES and max(sizes) <= plan.MAX_BYTES
    assert any(s > plan.MiB for s in sizes) and any(s.critical for s in specs)
    assert all(s.size <= 256 * plan.KiB for s in specs if s.critical)
    data = plan.payload(1, specs[3])
    assert data.size == specs[3].size and plan.identify(data) == (3, plan.flow_crc("bj>sh"))
    assert not np.array_equal(data, plan.payload(2, specs[3]))


def test_the_receiver_check_finds_damage() -> None:
    receiver = Receiver.__new__(Receiver)
    receiver.flow, receiver.seed = "bj>sh", 1
    spec = plan.message_spec(1, "bj>sh", 5)
    data = plan.payload(1, spec).copy()
    assert receiver.check(data) == Take("bj>sh", 5, True)
    data[-1] ^= 1
    assert receiver.check(data) == Take(
        "bj>sh", 5, False, f"bytes differ from offset {spec.size - 1}"
    )
    other = plan.payload(1, plan.message_spec(1, "sh>bj", 5))
    assert receiver.check(other).intact is False
    assert receiver.check(np.zeros(4, np.uint8)) == Take(
        "bj>sh", None, False, "no header (uint8, (4,))"
    )


_problem = netns.environment_problem()


@pytest.mark.netns
@pytest.mark.timeout(120)
@pytest.mark.skipif(_problem is not None, reason=f"WAN lab unavailable: {_problem}")
def test_a_short_soak_holds_its_invariants(tmp_path: Path) -> None:
    from bench.robustness.soak.run import Options, run_soak
    from bench.tree import THIS

    opts = Options(seed=3, seconds=20.0, warmup_s=4.0, drain_s=30.0, sites=2, paths=2)
    record = run_soak(opts, THIS, tmp_path / "soak", lambda text: None)
    assert record["violations"] == [], record["violations"]
    verdict = record["verdict"]
    assert verdict["sent"] > 20 and verdict["taken_intact"] > 10
    assert [f["kind"] for f in record["faults"]] == [f.kind for f in opts.faults()]
    assert all(r["end_mib"] > 0 for r in record["rss"].values())
