"""Jobs sharing one sender session over the simulated link: weights, a cap on bytes held
at the peer, paths a job may use, and the per-job counters (reads that change nothing)."""

from __future__ import annotations

from dataclasses import replace

from tests.fakelink import LinkProfile, SimulatedPair, make_header
from tests.test_session_reads import fingerprint
from wangate.core.events import MessageDelivered, SendFailed
from wangate.core.jobs import JobPolicy

PAYLOAD = bytes(64 * 1024)


def submit(pair: SimulatedPair, job: str, count: int, *, critical: bool = False) -> list[int]:
    """``count`` messages of ``job`` from bj; their ids (tags say the job: "job.i")."""
    ids = []
    for i in range(count):
        payload = PAYLOAD[:200] if critical else PAYLOAD
        header = replace(make_header(f"{job}.{i}", payload, critical=critical), job=job)
        ids.append(pair.submit("bj", header, payload))
    return ids


def body_bytes(job: str, i: int) -> int:
    """The body of ``submit``'s i-th bulk message of ``job``: header, tag, payload."""
    header = replace(make_header(f"{job}.{i}", PAYLOAD), job=job)
    return len(header.encode()) + len(PAYLOAD)


def delivered(pair: SimulatedPair) -> dict[int, int]:
    """Body bytes of each message bj's peer confirmed, by id."""
    return {e.msg_id: e.body_bytes for e in pair.events_of("bj", MessageDelivered)}


def test_two_jobs_weighted_three_to_one_share_a_saturated_path_three_to_one() -> None:
    pair = SimulatedPair({"a": LinkProfile(rate_bps=40e6)}, seed=3)
    pair.sessions["bj"].set_jobs({"x": JobPolicy(weight=3.0), "y": JobPolicy(weight=1.0)})
    x, y = submit(pair, "x", 60), submit(pair, "y", 60)
    pair.run_for(0.8)  # ~4 MB at 5 MB/s: both still have work
    done = delivered(pair)
    x_bytes = sum(done.get(i, 0) for i in x)
    y_bytes = sum(done.get(i, 0) for i in y)
    assert set(x) - set(done) and set(y) - set(done)  # both backlogged to the end
    assert 3 * 0.85 <= x_bytes / y_bytes <= 3 * 1.15
    stats = pair.sessions["bj"].job_stats()
    assert set(stats) == {"x", "y"}
    sent = stats["x"].bytes_sent_by_path["a"] / stats["y"].bytes_sent_by_path["a"]
    assert 3 * 0.85 <= sent <= 3 * 1.15
    assert pair.run_until(lambda: set(x + y) <= set(delivered(pair)), max_time_s=5)
    assert pair.events_of("bj", SendFailed) == []


def test_a_capped_job_whose_trainer_never_takes_holds_its_cap_and_the_other_flows() -> None:
    cap = 200_000  # three messages of 64 KiB and their headers
    pair = SimulatedPair({"a": LinkProfile(rate_bps=40e6)}, seed=4, auto_consume=False)
    session = pair.sessions["bj"]
    session.set_jobs({"x": JobPolicy(max_inflight_bytes=cap), "y": JobPolicy()})
    x, y = submit(pair, "x", 20), submit(pair, "y", 20)

    def take_y() -> bool:
        """sh's trainers take y's messages as they come, never x's."""
        for msg_id, (header, _) in list(pair.received["sh"].items()):
            if header.tag.startswith("y.") and msg_id in pair.unconsumed["sh"]:
                pair.consume("sh", msg_id)
        stats = session.job_stats()["x"]
        assert stats.held_bytes <= cap
        return set(y) <= set(delivered(pair))

    assert pair.run_until(take_y, max_time_s=5)
    pair.run_for(0.5)
    stats = session.job_stats()["x"]
    held = [i for i in x if i in pair.received["sh"]]
    assert held == x[:3] and set(delivered(pair)) & set(x) == set(held)
    assert stats.held_bytes == sum(pair.unconsumed["sh"][i] for i in held) <= cap
    assert (stats.messages_in_flight, stats.waiting_messages, stats.messages_started) == (0, 17, 3)
    assert stats.waiting_bytes == sum(body_bytes("x", i) for i in range(3, 20))
    y_stats = session.job_stats()["y"]
    assert (y_stats.held_bytes, y_stats.messages_started, y_stats.waiting_messages) == (0, 20, 0)
    assert pair.events_of("bj", SendFailed) == []

    def take_x() -> bool:  # the trainer comes back: x goes on, cap by cap
        for msg_id in [i for i in x if i in pair.unconsumed["sh"]]:
            pair.consume("sh", msg_id)
        assert session.job_stats()["x"].held_bytes <= cap
        return set(x) <= set(delivered(pair)) and not pair.unconsumed["sh"]

    assert pair.run_until(take_x, max_time_s=5)
    assert session.job_stats()["x"].held_bytes == 0


def test_a_job_limited_to_one_path_sends_nothing_on_the_others() -> None:
    paths = {"a": LinkProfile(delay_s=0.010, rate_bps=40e6), "b": LinkProfile(rate_bps=40e6)}
    pair = SimulatedPair(paths, seed=5)
    session = pair.sessions["bj"]
    session.set_jobs({"x": JobPolicy(paths=frozenset({"b"}))})
    pair.run_for(1.5)  # the critical route settles on the faster path
    assert session.path_snapshot("a", pair.now)["role"] == "critical"
    ids = submit(pair, "x", 10) + submit(pair, "x", 3, critical=True)
    ids += submit(pair, "y", 10) + submit(pair, "y", 3, critical=True)
    assert pair.run_until(lambda: set(ids) <= set(delivered(pair)), max_time_s=5)
    stats = session.job_stats()
    assert set(stats["x"].bytes_sent_by_path) == {"b"}  # its critical too: not the route
    assert stats["x"].bytes_sent_by_path["b"] >= 10 * len(PAYLOAD)
    assert stats["x"].datagrams_sent_by_path["b"] >= 10 * len(PAYLOAD) // 1200
    assert stats["y"].bytes_sent_by_path["a"] > 0
    assert pair.events_of("bj", SendFailed) == []


def test_a_job_whose_paths_are_down_waits_and_a_reload_lets_it_use_the_others() -> None:
    pair = SimulatedPair({"a": LinkProfile(), "b": LinkProfile()}, seed=6)
    session = pair.sessions["bj"]
    session.set_jobs({"x": JobPolicy(paths=frozenset({"b"}))})
    pair.close_path("b")
    x = submit(pair, "x", 4) + submit(pair, "x", 1, critical=True)
    y = submit(pair, "y", 4)
    assert pair.run_until(lambda: set(y) <= set(delivered(pair)), max_time_s=5)
    pair.run_for(1.0)
    stats = session.job_stats()["x"]
    assert stats.bytes_sent_by_path == {} and stats.messages_in_flight == 5
    assert set(x).isdisjoint(delivered(pair)) and pair.events_of("bj", SendFailed) == []
    assert not session.has_critical_for("a")  # x's critical may not use it
    before = fingerprint(session)
    session.job_stats()
    assert fingerprint(session) == before  # a read
    session.set_jobs({"x": JobPolicy()}, pair.now)
    assert session.has_critical_for("a")
    assert pair.run_until(lambda: set(x) <= set(delivered(pair)), max_time_s=5)
    assert set(session.job_stats()["x"].bytes_sent_by_path) == {"a"}
