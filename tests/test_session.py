"""PeerSession end to end over seeded fake links under a fake clock (no I/O).

Messages go in at one session and must come out at the other exactly once and intact,
whatever the links do (drop, reorder, duplicate, delay, blackhole, close), with only
the lost bytes sent again.
"""

from __future__ import annotations

import contextlib
import random
import struct
import zlib
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakelink import (
    SITES,
    LinkProfile,
    SimulatedPair,
    SimulationStuck,
    make_header,
    other,
)
from wangate.core.events import (
    MessageDelivered,
    MessageDropped,
    MessageReceived,
    MessageTaken,
    PathStateChanged,
    RouteChanged,
    SendFailed,
)
from wangate.core.frames import (
    DGRAM_REPAIR,
    DGRAM_SHARD,
    Ack,
    ControlStreamDecoder,
    Credit,
    Hello,
    ShardDatagram,
    decode_datagram,
    encode_control,
    encode_probe,
    encode_shard,
    shard_header_bytes,
)
from wangate.core.message import MessageHeader
from wangate.core.outbound import CodingPolicy
from wangate.core.paths import MIN_RTO_S
from wangate.core.session import PeerSession
from wangate.errors import LocalProtocolError, RemoteProtocolError

SHARD_PAYLOAD_BYTES = 1200 - 20  # a 20-byte shard header: messages of 16 KiB to 1 GiB
LOSSY = LinkProfile(
    delay_s=0.030,
    jitter_s=0.002,
    drop_rate=0.20,
    reorder_rate=0.05,
    reorder_delay_s=0.015,
    duplicate_rate=0.05,
    rate_bps=40e6,
)
Sent = dict[int, tuple[MessageHeader, bytes]]


def send_many(
    pair: SimulatedPair, site: str, sizes: list[int], seed: int, *, critical_every: int = 7
) -> Sent:
    """Submit messages of ``sizes`` (every ``critical_every``-th one critical)."""
    rng = random.Random(seed)
    sent: Sent = {}
    for i, size in enumerate(sizes):
        payload = rng.randbytes(size)
        critical = i % critical_every == critical_every - 1
        header = make_header(
            f"{site}.grad{i}", payload, step=i, critical=critical, meta=rng.randbytes(i % 5)
        )
        sent[pair.submit(site, header, payload)] = (header, payload)
    return sent


def all_done(pair: SimulatedPair, site: str, sent: Sent) -> bool:
    delivered = {e.msg_id for e in pair.events_of(site, MessageDelivered)}
    return set(sent) <= delivered and set(sent) <= set(pair.received[other(site)])


def assert_exactly_once_intact(pair: SimulatedPair, site: str, sent: Sent) -> None:
    peer = other(site)
    assert dict(pair.received_count[peer]) == dict.fromkeys(sent, 1)
    for msg_id, (header, payload) in sent.items():
        assert pair.received[peer][msg_id] == (header, payload)
    delivered = [e.msg_id for e in pair.events_of(site, MessageDelivered)]
    assert sorted(delivered) == sorted(sent)
    assert pair.events_of(site, SendFailed) == []
    assert pair.events_of(peer, MessageDropped) == []


def body_bytes(header: MessageHeader, payload: bytes) -> int:
    return len(header.encode()) + len(payload)


# ------------------------------------------------------------------ delivery


def test_every_size_arrives_once_and_only_lost_bytes_are_sent_again() -> None:
    pair = SimulatedPair({"a": LOSSY, "b": LOSSY}, seed=11)
    sizes = [0, 1, 2, 1000, SHARD_PAYLOAD_BYTES, SHARD_PAYLOAD_BYTES + 1, 65_536, 1 << 20, 3 << 20]
    sent = send_many(pair, "bj", sizes, seed=1)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)
    wire = pair.wire["bj"]
    for msg_id, (header, payload) in sent.items():
        size = body_bytes(header, payload)
        repaired = wire.repaired_bytes(msg_id, size)
        assert repaired >= 0
        if size > 4 * SHARD_PAYLOAD_BYTES and not header.critical:  # critical: duplicates
            assert repaired < size / 2, f"message {msg_id} of {size} B: {repaired} B resent"
    repaired_total = sum(wire.repaired_bytes(i, body_bytes(*m)) for i, m in sent.items())
    dropped_total = sum(wire.payload_dropped.values())
    assert dropped_total > 0
    # reordering makes a few losses spurious; never more than a fraction on top
    assert repaired_total <= 1.3 * dropped_total + 20 * SHARD_PAYLOAD_BYTES
    # what the session counts as repairs was sent again (the rest: duplicates of critical)
    assert 0 < pair.sessions["bj"].status()["repair_bytes"] <= repaired_total


def test_without_reordering_exactly_the_lost_bytes_are_sent_again() -> None:
    clean_order = LinkProfile(delay_s=0.025, drop_rate=0.15, rate_bps=30e6)
    pair = SimulatedPair({"a": clean_order, "b": clean_order}, seed=3)
    # bulk only: critical pieces may be sent twice on purpose (to a backup path)
    sent = send_many(pair, "bj", [200_000, 700_000, 5, 40_000], seed=2, critical_every=1000)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)
    wire = pair.wire["bj"]
    for msg_id, message in sent.items():
        assert wire.repaired_bytes(msg_id, body_bytes(*message)) == wire.payload_dropped[msg_id]


def test_many_small_messages_both_directions_at_once() -> None:
    pair = SimulatedPair({"a": LOSSY, "b": LOSSY, "c": LOSSY}, seed=5)
    rng = random.Random(9)
    sent = {
        site: send_many(pair, site, [rng.randrange(0, 300) for _ in range(400)], seed=i)
        for i, site in enumerate(SITES)
    }
    assert pair.run_until(
        lambda: all(all_done(pair, site, sent[site]) for site in SITES), max_time_s=30
    )
    for site in SITES:
        assert_exactly_once_intact(pair, site, sent[site])


def test_large_messages_both_directions_use_every_path() -> None:
    pair = SimulatedPair(
        {
            "fast": LinkProfile(delay_s=0.02, drop_rate=0.05, rate_bps=80e6),
            "slow": LinkProfile(delay_s=0.06, drop_rate=0.10, jitter_s=0.004, rate_bps=20e6),
        },
        seed=8,
    )
    sent = {site: send_many(pair, site, [1 << 20, 300_000, 2 << 20], seed=7) for site in SITES}
    assert pair.run_until(
        lambda: all(all_done(pair, site, sent[site]) for site in SITES), max_time_s=30
    )
    for site in SITES:
        assert_exactly_once_intact(pair, site, sent[site])
        by_path = pair.wire[site].payload_by_path
        # pulled by capacity: the 4x faster path carries clearly more
        assert by_path["fast"] > 2 * by_path["slow"] > 0


def test_paths_with_different_datagram_sizes_repair_each_others_losses() -> None:
    pair = SimulatedPair(
        {
            "jumbo": LinkProfile(delay_s=0.02, drop_rate=0.15, rate_bps=60e6),
            "small": LinkProfile(delay_s=0.03, drop_rate=0.15, rate_bps=30e6),
        },
        seed=12,
        datagram_bytes={"jumbo": 8952 - 40, "small": 1200},
    )
    sent = {site: send_many(pair, site, [2 << 20, 9_000, 70_000], seed=3) for site in SITES}
    assert pair.run_until(
        lambda: all(all_done(pair, site, sent[site]) for site in SITES), max_time_s=30
    )
    for site in SITES:
        assert_exactly_once_intact(pair, site, sent[site])
        assert min(pair.wire[site].payload_by_path.values()) > 100_000


def test_critical_message_overtakes_queued_bulk() -> None:
    pair = SimulatedPair({"a": LinkProfile(delay_s=0.02, rate_bps=20e6)}, seed=1)
    bulk = bytes(2 << 20)
    bulk_id = pair.submit("bj", make_header("bulk", bulk), bulk)
    pair.run_for(0.05)
    urgent = b"first layer"
    urgent_id = pair.submit("bj", make_header("key", urgent, critical=True), urgent)
    assert pair.run_until(lambda: urgent_id in pair.received["sh"], max_time_s=1)
    assert bulk_id not in pair.received["sh"]
    assert pair.received["sh"][urgent_id][0].critical


# --------------------------------------------------------------------- paths


def test_path_closed_mid_transfer_completes_on_the_others() -> None:
    pair = SimulatedPair({"a": LOSSY, "b": LOSSY, "c": LOSSY}, seed=21)
    sent = send_many(pair, "bj", [2 << 20, 500_000], seed=4)
    pair.run_for(0.15)
    assert len(pair.received["sh"]) == 0
    pair.close_path("b", "connection lost")
    carried_by_b = pair.wire["bj"].payload_by_path["b"]
    assert carried_by_b > 0
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)
    assert pair.wire["bj"].payload_by_path["b"] == carried_by_b
    for site in SITES:
        downs = [e for e in pair.events_of(site, PathStateChanged) if e.state == "down"]
        assert downs == [PathStateChanged("b", "down", "connection lost")]


def test_a_closed_path_sends_nothing_and_sets_no_timer() -> None:
    session = PeerSession("bj", "sh", max_message_bytes=1 << 20, inbox_window_bytes=1 << 20, now=0)
    session.path_up("a", datagram_bytes=1200, now=0.0)
    session.path_up("b", datagram_bytes=1200, now=0.0)
    session.path_down("b", 0.05, "closed")
    for now in (0.45, 5.0, 50.0):
        assert session.datagram_to_send("b", now) is None
        session.handle_timer(now)
        session.datagram_to_send("a", now)  # the open path's keep-alive probe
        timer = session.get_timer()
        assert timer is not None and timer > now


def test_closed_path_never_wedges_the_clock() -> None:
    pair = SimulatedPair({"a": LOSSY, "b": LOSSY}, seed=2)
    pair.close_path("b")
    try:
        pair.run_for(3.0)
    except SimulationStuck as exc:  # pragma: no cover - the failure being guarded against
        pytest.fail(str(exc))
    sent = send_many(pair, "sh", [100_000], seed=1)
    assert pair.run_until(lambda: all_done(pair, "sh", sent), max_time_s=10)


def test_reopened_path_carries_data_again() -> None:
    pair = SimulatedPair({"a": LOSSY, "b": LOSSY}, seed=6)
    pair.close_path("b")
    pair.run_for(1.0)
    pair.open_path("b")
    sent = send_many(pair, "bj", [1 << 20], seed=1)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=10)
    assert_exactly_once_intact(pair, "bj", sent)
    assert pair.wire["bj"].payload_by_path["b"] > 100_000


def test_a_path_reconnected_with_less_room_still_repairs_messages_in_progress() -> None:
    """When both sites dial at once, one link replaces the other, and a site that had
    accepted the old one now sends on its own dial: 4 bytes less room per datagram
    (the acceptor's connection ID). Repair symbols cut for the old link fit no path."""
    path = LinkProfile(delay_s=0.02, drop_rate=0.05, rate_bps=20e6)
    pair = SimulatedPair(
        {"a": path}, seed=5, coding=CodingPolicy(k=16, min_repair=0), datagram_bytes=1200
    )
    sent = send_many(pair, "bj", [1 << 20, 300_000], seed=2)
    pair.run_for(0.2)
    assert len(pair.received["sh"]) == 0
    pair.close_path("a", "replaced by the peer's dial")
    pair.datagram_bytes["a"] = 1196
    pair.open_path("a")
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=20)
    assert_exactly_once_intact(pair, "bj", sent)


def test_done_and_taken_lost_with_a_closed_connection_go_again_on_another_path() -> None:
    pair = SimulatedPair(
        {
            "a": LinkProfile(delay_s=0.01, rate_bps=50e6),
            "b": LinkProfile(delay_s=0.03, rate_bps=50e6),
        },
        seed=4,
    )
    sent = send_many(pair, "bj", [50_000], seed=1)
    (msg_id,) = sent
    assert pair.run_until(lambda: msg_id in pair.received["sh"], max_time_s=5)
    # sh said "done" and "taken" on its end-to-end path: the connection closes before
    # they arrive, and with it what its stream still held
    pair.close_path("a", "connection lost")
    assert pair.events_of("bj", MessageTaken) == []
    assert pair.run_until(lambda: bool(pair.events_of("bj", MessageTaken)), max_time_s=5)
    assert pair.events_of("bj", MessageTaken) == [MessageTaken(msg_id)]
    assert_exactly_once_intact(pair, "bj", sent)


@pytest.mark.parametrize(
    "coding",
    [CodingPolicy(k=0), CodingPolicy(k=16, min_repair=0, max_repair=16)],
    ids=["ranges", "fec"],
)
def test_bytes_acknowledged_that_never_arrived_are_named_at_the_poke_and_sent_again(
    coding: CodingPolicy,
) -> None:
    """Whatever makes the sender count bytes acknowledged that the receiver lacks (here
    an acknowledgement for a shard that never arrived: sh sees a probe in its place),
    the sender's "done?" is answered with the missing range, and only it goes again:
    the message is whole a round trip after the poke, not dropped at its idle timeout."""
    pair = SimulatedPair({"a": LinkProfile(delay_s=0.010, rate_bps=50e6)}, seed=8, coding=coding)
    swapped: list[tuple[int, int]] = []

    def probe_instead_of_the_fifth_shard(data: bytes) -> bytes:
        datagram = decode_datagram(data)
        if (
            isinstance(datagram, ShardDatagram)
            and not swapped
            and datagram.offset >= 4 * len(datagram.data) > 0
        ):
            swapped.append((datagram.offset, datagram.offset + len(datagram.data)))
            return encode_probe(datagram.path_seq, datagram.sent_stamp)
        return data

    pair.tamper = probe_instead_of_the_fifth_shard
    started_at = pair.now
    sent = send_many(pair, "bj", [60_000], seed=3)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=10)
    assert_exactly_once_intact(pair, "bj", sent)
    ((start, end),) = swapped
    sh, bj = pair.sessions["sh"].status(), pair.sessions["bj"].status()
    assert (sh["ranges_missing_sent"], bj["ranges_resent"]) == (1, 1)
    assert bj["repair_bytes"] == (end - start) + 1  # the range, and the poke's byte 0
    assert bj["fec_bytes"] == 0
    # the poke goes DONE_TIMEOUT_S (1 s) after the last ack, checked every 0.25 s
    assert 1.0 < pair.now - started_at < 1.0 + 0.25 + 0.2


def test_frames_about_a_restarted_peers_messages_never_reach_its_new_instance() -> None:
    pair = SimulatedPair({"a": LinkProfile(delay_s=0.02, rate_bps=50e6)}, seed=4)
    (old_id,) = send_many(pair, "bj", [50_000], seed=1)
    assert pair.run_until(lambda: old_id in pair.received["sh"], max_time_s=5)
    pair.restart("bj")  # before sh's "done" and "taken" arrive
    seen = len(pair.events["bj"])
    sent = send_many(pair, "bj", [4 << 20], seed=2)
    assert list(sent) == [old_id]  # the new instance numbers its messages from 1 again
    pair.run_for(0.3)
    assert old_id not in pair.received["sh"]
    settled = [
        e for _, e in pair.events["bj"][seen:] if isinstance(e, MessageDelivered | MessageTaken)
    ]
    assert settled == []
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=10)
    assert pair.received["sh"][old_id] == sent[old_id]


def test_silent_path_is_declared_down_and_its_data_repaired_elsewhere() -> None:
    profile = LinkProfile(delay_s=0.04, drop_rate=0.02, rate_bps=20e6)
    pair = SimulatedPair({"a": profile, "b": profile}, seed=13)
    sent = send_many(pair, "bj", [3 << 20], seed=5)
    pair.run_for(0.3)
    silenced_at = pair.now
    pair.set_silent("b", True)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)
    downs_by_site = {}
    for site in SITES:
        downs = [
            (at, e)
            for at, e in pair.events[site]
            if isinstance(e, PathStateChanged) and e.state == "down"
        ]
        assert len(downs) == 1
        at, event = downs[0]
        downs_by_site[site] = event
        assert event.path == "b" and event.reason.startswith("silent for")
        # the estimator's floor is 0.5 s of silence since the last datagram heard
        assert 0.45 <= at - silenced_at <= 0.7
    wire = pair.wire["bj"]
    (msg_id,) = sent
    repaired = wire.repaired_bytes(msg_id, body_bytes(*sent[msg_id]))
    blackholed = wire.payload_dropped[msg_id]
    assert blackholed > 200_000  # b kept pulling until it was declared down
    # acks on their way when it went silent are lost with it: up to one RTT of data
    # that did arrive is sent again as well
    one_rtt_bytes = profile.rate_bps * 2 * profile.delay_s / 8
    assert blackholed <= repaired <= blackholed + one_rtt_bytes + 20 * SHARD_PAYLOAD_BYTES

    # the path comes back: both sides hear it again and it carries data
    pair.set_silent("b", False)
    carried_before = wire.payload_by_path["b"]
    more = send_many(pair, "bj", [1 << 20], seed=6)
    assert pair.run_until(lambda: all_done(pair, "bj", more), max_time_s=10)
    for site in SITES:
        changes = [e for e in pair.events_of(site, PathStateChanged) if e.path == "b"]
        after_down = changes[changes.index(downs_by_site[site]) + 1 :]
        assert PathStateChanged("b", "up", "heard again") in after_down
        assert after_down[-1].state != "down"
        # what the outage swallowed is not held against the path once it is back
        assert after_down[0] == PathStateChanged("b", "up", "heard again")
        assert not any("burst" in e.reason for e in after_down), after_down
    assert wire.payload_by_path["b"] > carried_before + 100_000


def test_every_path_blackholed_for_seconds_then_back_loses_nothing() -> None:
    pair = SimulatedPair({"a": LOSSY, "b": LOSSY}, seed=37)
    sent = send_many(pair, "bj", [1 << 20, 20_000], seed=9)
    pair.run_for(0.2)
    for name in pair.paths:
        pair.set_silent(name, True)
    pair.run_for(3.0)
    for site in SITES:
        assert {e.path for e in pair.events_of(site, PathStateChanged)} == {"a", "b"}
    assert pair.events_of("bj", SendFailed) == []
    for name in pair.paths:
        pair.set_silent(name, False)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)


def test_thirty_percent_loss_and_a_flapping_path() -> None:
    harsh = LinkProfile(delay_s=0.05, jitter_s=0.005, drop_rate=0.30, rate_bps=30e6)
    pair = SimulatedPair({"a": harsh, "b": harsh}, seed=41)
    sent = {site: send_many(pair, site, [1 << 20, 3_000, 400_000], seed=2) for site in SITES}
    for _ in range(4):
        pair.run_for(0.25)
        pair.close_path("b")
        pair.run_for(0.25)
        pair.open_path("b")
    assert pair.run_until(
        lambda: all(all_done(pair, site, sent[site]) for site in SITES), max_time_s=60
    )
    for site in SITES:
        assert_exactly_once_intact(pair, site, sent[site])


# --------------------------------------------------------------- flow control


def test_receiver_never_holds_more_than_its_window_and_sender_resumes_on_consume() -> None:
    max_message, window = 64 * 1024, 160 * 1024
    pair = SimulatedPair(
        {"a": LOSSY, "b": LOSSY},
        seed=17,
        max_message_bytes=max_message,
        inbox_window_bytes=window,
        auto_consume=False,
    )
    sent = send_many(pair, "bj", [50_000] * 12, seed=3, critical_every=100)
    pair.run_for(3.0)
    held = len(pair.received["sh"])
    bodies = [body_bytes(*m) for m in sent.values()]
    assert held == max(k for k in range(len(bodies)) if sum(bodies[:k]) <= window)
    assert pair.max_held_bytes["sh"] <= window
    stalled_at = pair.now
    pair.run_for(2.0)
    assert len(pair.received["sh"]) == held  # nothing more without consumption
    assert not [e for at, e in pair.events["sh"] if at > stalled_at and hasattr(e, "msg_id")]
    for msg_id in sent:

        def arrived(m: int = msg_id) -> bool:
            return m in pair.received["sh"]

        assert pair.run_until(arrived, max_time_s=5)
        pair.consume("sh", msg_id)
        assert pair.max_held_bytes["sh"] <= window
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=5)
    assert_exactly_once_intact(pair, "bj", sent)
    assert pair.max_held_bytes["sh"] <= window + max_message


def test_message_over_the_local_limit_is_refused_at_submit() -> None:
    pair = SimulatedPair({"a": LOSSY}, max_message_bytes=10_000)
    payload = bytes(10_000)
    with pytest.raises(LocalProtocolError, match="exceeds"):
        pair.submit("bj", make_header("big", payload), payload)
    fits = bytes(10_000 - len(make_header("ok", b"").encode()))
    sent = {pair.submit("bj", make_header("ok", fits), fits): (make_header("ok", fits), fits)}
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=5)


def test_message_over_the_peers_limit_fails_without_touching_the_wire() -> None:
    pair = SimulatedPair({"a": LOSSY}, seed=1)
    pair.sessions["bj"].set_peer_limits(5_000)
    payload = bytes(6_000)
    msg_id = pair.submit("bj", make_header("big", payload), payload)
    assert [e.msg_id for e in pair.events_of("bj", SendFailed)] == [msg_id]
    assert "exceeds peer sh's limit of 5000" in pair.events_of("bj", SendFailed)[0].reason
    sent = send_many(pair, "bj", [4_000], seed=2)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=5)
    assert msg_id not in pair.wire["bj"].payload_sent


def test_bad_checksum_is_dropped_by_the_receiver_and_fails_at_the_sender() -> None:
    pair = SimulatedPair({"a": LOSSY}, seed=4)
    payload = bytes(range(256)) * 40
    good = make_header("grad", payload)
    bad = MessageHeader(good.tag, good.step, False, good.checksum ^ 1, good.meta)
    bad_id = pair.submit("bj", bad, payload)
    sent = send_many(pair, "bj", [30_000], seed=1)
    assert pair.run_until(
        lambda: all_done(pair, "bj", sent) and bool(pair.events_of("bj", SendFailed)),
        max_time_s=10,
    )
    (failed,) = pair.events_of("bj", SendFailed)
    assert failed.msg_id == bad_id and "rejected" in failed.reason and "checksum" in failed.reason
    (dropped,) = pair.events_of("sh", MessageDropped)
    assert dropped.msg_id == bad_id
    assert bad_id not in pair.received["sh"]
    assert bad_id not in {e.msg_id for e in pair.events_of("bj", MessageDelivered)}
    # the dropped message's bytes were handed back as credit
    assert pair.sessions["sh"].granted_bytes == pair.sessions["sh"].inbox_window_bytes + sum(
        body_bytes(*m) for m in sent.values()
    ) + body_bytes(bad, payload)


# -------------------------------------------------------------------- restart


def test_peer_restart_fails_messages_in_progress_and_later_ones_go_through() -> None:
    pair = SimulatedPair(
        {"a": LOSSY, "b": LOSSY},
        seed=19,
        max_message_bytes=5 << 19,
        inbox_window_bytes=3 << 20,
    )
    in_progress = send_many(pair, "bj", [2 << 20], seed=1)
    waiting = send_many(pair, "bj", [2 << 20], seed=2)  # beyond the credit: not started
    pair.run_for(0.2)
    assert not pair.received["sh"]
    assert set(waiting).isdisjoint(pair.wire["bj"].payload_sent)
    pair.restart("sh")
    failed = pair.events_of("bj", SendFailed)
    assert [e.msg_id for e in failed] == list(in_progress)
    assert "restarted" in failed[0].reason
    after = send_many(pair, "bj", [10_000, 1 << 20], seed=3)
    assert pair.run_until(lambda: all_done(pair, "bj", {**waiting, **after}), max_time_s=30)
    for msg_id, (header, payload) in {**waiting, **after}.items():
        assert pair.received["sh"][msg_id] == (header, payload)
    assert set(in_progress).isdisjoint(pair.received["sh"])
    assert set(in_progress).isdisjoint(e.msg_id for e in pair.events_of("bj", MessageDelivered))


def test_credit_stays_within_the_window_across_a_peer_restart() -> None:
    window = 200_000
    pair = SimulatedPair(
        {"a": LOSSY},
        seed=23,
        max_message_bytes=100_000,
        inbox_window_bytes=window,
        auto_consume=False,
    )
    first = send_many(pair, "bj", [90_000], seed=1)
    assert pair.run_until(lambda: set(first) <= set(pair.received["sh"]), max_time_s=5)
    held_before = pair.unconsumed["sh"][next(iter(first))]
    receiver = pair.sessions["sh"]
    receiver.peer_restarted(pair.now)  # bj came back as a new instance
    # the trainer still holds the old message; it takes it after the restart
    receiver.consumed(held_before)
    # whatever the new bj instance may now send, plus what is still held, fits the window
    assert receiver.granted_bytes <= window


# ----------------------------------------------------------- malformed inputs


def _shard(msg_id: int, msg_len: int, offset: int, data: bytes, seq: int = 1 << 40) -> bytes:
    return encode_shard(seq, 0, msg_id, msg_len, offset, data)


MALFORMED_DATAGRAMS = {
    "empty": b"",
    "unknown type": bytes([0x12]) + bytes(41),
    "truncated shard": _shard(900, 100, 0, b"x" * 10)[: shard_header_bytes(100) - 1],
    # type, path_seq u32, stamp u24, msg_id u32, msg_len and offset as 2-byte varints
    "shard past msg_len": struct.pack("!BI3sIHH", DGRAM_SHARD, 0, bytes(3), 900, 0x4064, 0x405F)
    + b"y" * 10,
    "empty shard": _shard(900, 100, 0, b""),
    "message id 0": struct.pack("!BI3sIHH", DGRAM_SHARD, 0, bytes(3), 0, 0x4064, 0x4000) + b"z",
    "long probe": encode_probe(1 << 40, 0) + b"\0",
    "short probe": encode_probe(1 << 40, 0)[:-1],
}


def test_malformed_datagrams_raise_and_the_transfer_goes_on() -> None:
    pair = SimulatedPair({"a": LOSSY, "b": LOSSY}, seed=29)
    sent = send_many(pair, "bj", [500_000, 100], seed=8)
    pair.run_for(0.1)
    for data in MALFORMED_DATAGRAMS.values():
        with pytest.raises(RemoteProtocolError):
            pair.inject_datagram("sh", "a", data)
        pair.run_for(0.01)
    # msg_len changing between shards of one message
    pair.inject_datagram("sh", "b", _shard(900, 100, 0, b"x" * 10))
    with pytest.raises(RemoteProtocolError, match="900"):
        pair.inject_datagram("sh", "b", _shard(900, 200, 10, b"x" * 10))
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)
    assert 900 not in pair.received["sh"]


def test_shard_of_an_oversized_message_is_dropped_and_rejected() -> None:
    pair = SimulatedPair({"a": LOSSY}, seed=1, max_message_bytes=50_000)
    pair.inject_datagram("sh", "a", _shard(777, 60_000, 0, b"q" * 100))
    assert [e.msg_id for e in pair.events_of("sh", MessageDropped)] == [777]
    sent = send_many(pair, "bj", [40_000], seed=1)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=5)


def test_message_with_a_malformed_body_header_is_dropped() -> None:
    pair = SimulatedPair({"a": LinkProfile()}, seed=1)
    body = bytes([3]) + bytes(30)  # message version 3
    pair.inject_datagram("sh", "a", _shard(500, len(body), 0, body))
    (dropped,) = pair.events_of("sh", MessageDropped)
    assert dropped.msg_id == 500 and "version 3" in dropped.reason
    assert pair.received["sh"] == {}


_HELLO_RAW = encode_control(Hello("bj", "a", 1, 1000))


@pytest.mark.parametrize(
    "raw",
    [
        bytes([0x09, 0, 0, 0, 1, 0]),  # unknown control type
        _HELLO_RAW[:5] + bytes([1]) + _HELLO_RAW[6:],  # wire version 1
        _HELLO_RAW[:5] + bytes([2]) + _HELLO_RAW[6:],  # wire version 2: no jobs
        _HELLO_RAW[:-1] + b"!",  # path name "!"
        bytes([0x01, 0, 0, 0, 3, 1, 0, 0]),  # truncated hello
        bytes([0x02, 0, 0, 0, 10]) + bytes(10),  # ack with 0 ranges
        bytes([0x03, 0, 0, 0, 4, 0, 0, 0, 1]),  # credit of 4 bytes
        bytes([0x01, 0, 1, 0, 1]),  # 65 537-byte body announced
    ],
)
def test_malformed_control_frames_raise(raw: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        ControlStreamDecoder().feed(raw)


def test_hello_after_the_path_is_up_raises_and_the_session_goes_on() -> None:
    pair = SimulatedPair({"a": LOSSY}, seed=31)
    sent = send_many(pair, "bj", [200_000], seed=1)
    pair.run_for(0.1)
    with pytest.raises(RemoteProtocolError, match="hello"):
        pair.sessions["sh"].handle_control("a", Hello("bj", "a", 0x1111, 1 << 20), pair.now)
    # acks for sequence numbers never sent, and a lower credit, are ignored
    pair.sessions["bj"].handle_control("a", Ack(0, 0, ((1 << 50, 1 << 51),)), pair.now)
    pair.sessions["bj"].handle_control("a", Credit(1), pair.now)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=10)
    assert_exactly_once_intact(pair, "bj", sent)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=80), max_size=5))
def test_arbitrary_datagrams_only_raise_remote_protocol_error(datagrams: list[bytes]) -> None:
    session = PeerSession("sh", "bj", max_message_bytes=1 << 20, inbox_window_bytes=1 << 20, now=0)
    session.path_up("a", datagram_bytes=1200, now=0.0)
    for data in datagrams:
        for candidate in (data, bytes([DGRAM_SHARD]) + data, bytes([DGRAM_REPAIR]) + data):
            with contextlib.suppress(RemoteProtocolError):
                session.handle_datagram("a", candidate, 0.5)
    session.handle_timer(1.0)
    session.control_to_send("a", 1.0)
    assert session.get_timer() is not None


# ------------------------------------------------------------------- property


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    path_count=st.integers(1, 3),
    drop_rate=st.floats(0.0, 0.2),
    reorder_rate=st.floats(0.0, 0.3),
    duplicate_rate=st.floats(0.0, 0.2),
    jitter_s=st.floats(0.0, 0.01),
    sizes=st.lists(st.integers(0, 200_000), min_size=1, max_size=5),
    both_ways=st.booleans(),
)
def test_any_link_behaviour_delivers_each_message_once_intact(
    seed: int,
    path_count: int,
    drop_rate: float,
    reorder_rate: float,
    duplicate_rate: float,
    jitter_s: float,
    sizes: list[int],
    both_ways: bool,
) -> None:
    rng = random.Random(seed)
    paths = {
        f"p{i}": LinkProfile(
            delay_s=rng.uniform(0.005, 0.08),
            jitter_s=jitter_s,
            drop_rate=drop_rate,
            reorder_rate=reorder_rate,
            duplicate_rate=duplicate_rate,
            rate_bps=rng.uniform(5e6, 100e6),
        )
        for i in range(path_count)
    }
    pair = SimulatedPair(paths, seed=seed)
    senders = SITES if both_ways else ("bj",)
    sent = {site: send_many(pair, site, sizes, seed=seed) for site in senders}
    assert pair.run_until(
        lambda: all(all_done(pair, site, sent[site]) for site in senders), max_time_s=60
    )
    for site in senders:
        assert_exactly_once_intact(pair, site, sent[site])


def test_a_lone_tiny_bulk_message_on_equal_paths_is_sent() -> None:
    # every path must not defer to "the others together": one of them has to take it
    pair = SimulatedPair(
        {
            "p0": LinkProfile(delay_s=0.068, drop_rate=0.125, rate_bps=77e6),
            "p1": LinkProfile(delay_s=0.037, drop_rate=0.125, rate_bps=30e6),
            "p2": LinkProfile(delay_s=0.043, drop_rate=0.125, rate_bps=43e6),
        },
        seed=0,
    )
    sent = send_many(pair, "bj", [0], seed=1)
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=5)


def test_has_critical_for_names_the_critical_route_while_its_data_waits() -> None:
    slow = LinkProfile(delay_s=0.010, rate_bps=2e6)
    pair = SimulatedPair({"a": slow, "b": replace(slow, delay_s=0.040)}, seed=4)
    pair.run_for(2.0)  # probes validate both paths; a is the faster one
    session = pair.sessions["bj"]
    assert session.path_snapshot("a", pair.now)["role"] == "critical"
    payload = random.Random(1).randbytes(64 << 10)
    msg_id = pair.submit("bj", make_header("layer0", payload, critical=True), payload)
    assert session.has_critical_for("a") and not session.has_critical_for("b")
    delivered = lambda: msg_id in pair.received["sh"]  # noqa: E731
    assert pair.run_until(delivered, 5.0)
    assert not session.has_critical_for("a") and not session.has_critical_for("b")


def _blackholed_critical_delay_s() -> tuple[float, float]:
    """A critical message in flight on the route when it goes silent: seconds from the
    route change to delivery, and from submission to the route change."""
    fast = LinkProfile(delay_s=0.010, rate_bps=4e6)  # 64 KiB spends 130 ms on the wire
    pair = SimulatedPair({"a": fast, "b": replace(fast, delay_s=0.030, rate_bps=100e6)}, seed=6)
    pair.run_for(2.0)
    assert pair.sessions["bj"].path_snapshot("a", pair.now)["role"] == "critical"
    payload = random.Random(2).randbytes(64 << 10)
    submitted = pair.now
    msg_id = pair.submit("bj", make_header("layer0", payload, critical=True), payload)
    pair.run_for(0.06)
    pair.set_silent("a", True)
    assert pair.run_until(lambda: msg_id in pair.received["sh"], 5.0)
    delivered = pair.now
    (moved_at, change), *_ = [
        (t, e) for t, e in pair.events["bj"] if isinstance(e, RouteChanged) and t > submitted
    ]
    assert (change.previous, change.current) == ("a", "b")
    assert pair.received["sh"][msg_id][1] == payload
    return delivered - moved_at, moved_at - submitted


def test_critical_data_on_a_route_that_goes_silent_is_repaired_on_the_new_route_at_once() -> None:
    after_move_s, move_s = _blackholed_critical_delay_s()
    assert move_s < 0.5
    assert after_move_s < 0.05  # b's 30 ms one-way and a few ms on its wire


def test_critical_message_does_not_wait_for_bulk_to_be_consumed() -> None:
    max_message, window = 1 << 20, 2 << 20
    pair = SimulatedPair(
        {"a": LOSSY},
        seed=8,
        max_message_bytes=max_message,
        inbox_window_bytes=window,
        auto_consume=False,
    )
    bulk = send_many(pair, "bj", [1_000_000] * 3, seed=4, critical_every=100)
    pair.run_for(3.0)
    assert len(pair.received["sh"]) == 2  # the window is full; the third waits for credit
    rng = random.Random(9)
    first, second = rng.randbytes(200_000), rng.randbytes(1_000_000)
    first_id = pair.submit("bj", make_header("layer0", first, critical=True), first)
    second_id = pair.submit("bj", make_header("layer1", second, critical=True), second)
    assert pair.run_until(lambda: first_id in pair.received["sh"], 2.0)
    assert pair.received["sh"][first_id][1] == first
    pair.run_for(2.0)  # the second does not fit in the slack as well: it waits
    assert second_id not in pair.received["sh"] and len(pair.received["sh"]) == 3
    assert pair.max_held_bytes["sh"] <= window + max_message
    for msg_id in [*list(bulk)[:2], first_id]:
        pair.consume("sh", msg_id)
    everything = {*bulk, second_id}
    assert pair.run_until(lambda: everything <= set(pair.received["sh"]), 10.0)


def test_a_message_past_its_deadline_fails_once_and_is_no_longer_sent() -> None:
    pair = SimulatedPair({"a": LOSSY}, seed=12)
    pair.run_for(1.0)
    pair.set_silent("a", True)  # nothing gets through any more
    payload = random.Random(3).randbytes(50_000)
    session = pair.sessions["bj"]
    submitted = pair.now
    header = make_header("g", payload)
    msg_id = session.submit(header, payload, pair.now, deadline_at=pair.now + 0.5)
    pair.run_until(lambda: bool(pair.events_of("bj", SendFailed)), 2.0)
    (failed_at, failure), *rest = [
        (t, e) for t, e in pair.events["bj"] if isinstance(e, SendFailed)
    ]
    assert rest == [] and failure.msg_id == msg_id
    assert submitted + 0.5 <= failed_at < submitted + 0.5 + 0.01
    assert failure.reason.startswith("deadline of 0.5 s passed before sh confirmed it (")
    # all of it went out before the path went quiet: it may have arrived, and it says so
    assert failure.reason.endswith(
        f"(0 of {body_bytes(header, payload)} bytes acknowledged), after all of it was sent"
        " (a trainer there may have taken it)"
    )
    sent_before = pair.wire["bj"].payload_sent[msg_id]
    pair.set_silent("a", False)
    pair.run_for(2.0)
    assert pair.wire["bj"].payload_sent[msg_id] == sent_before  # given up: never sent again
    assert msg_id not in pair.received["sh"]
    assert session.status()["messages_in_flight"] == 0


def test_a_deadline_also_ends_a_message_still_waiting_for_credit() -> None:
    pair = SimulatedPair(
        {"a": LOSSY},
        seed=13,
        max_message_bytes=64 << 10,
        inbox_window_bytes=64 << 10,
        auto_consume=False,
    )
    first = send_many(pair, "bj", [60_000], seed=5, critical_every=100)
    assert pair.run_until(lambda: set(first) <= set(pair.received["sh"]), 3.0)
    payload = bytes(60_000)  # does not fit until the first is consumed
    msg_id = pair.sessions["bj"].submit(
        make_header("late", payload), payload, pair.now, deadline_at=pair.now + 0.3
    )
    pair.run_for(1.0)
    (failure,) = pair.events_of("bj", SendFailed)
    assert failure.msg_id == msg_id and "(0 of " in failure.reason
    assert pair.sessions["bj"].status()["messages_waiting"] == 0


def test_a_message_confirmed_in_time_does_not_fail() -> None:
    pair = SimulatedPair({"a": LOSSY}, seed=14)
    payload = random.Random(4).randbytes(30_000)
    msg_id = pair.sessions["bj"].submit(
        make_header("g", payload), payload, pair.now, deadline_at=pair.now + 2.0
    )
    assert pair.run_until(lambda: msg_id in pair.received["sh"], 1.5)
    pair.run_for(3.0)
    assert pair.events_of("bj", SendFailed) == []


def test_an_abandoned_message_expires_at_the_receiver_and_its_credit_comes_back() -> None:
    slow = LinkProfile(delay_s=0.010, rate_bps=200e3)  # 60 kB take 2.4 s on the wire
    pair = SimulatedPair(
        {"a": slow}, seed=15, max_message_bytes=64 << 10, inbox_window_bytes=64 << 10
    )
    rng = random.Random(6)
    first, second = rng.randbytes(60_000), rng.randbytes(60_000)
    bj = pair.sessions["bj"]
    first_id = bj.submit(make_header("a", first), first, pair.now, deadline_at=pair.now + 0.5)
    second_id = pair.submit("bj", make_header("b", second), second)  # waits for credit
    abandoned_at = pair.now + 0.5
    pair.run_until(lambda: bool(pair.events_of("bj", SendFailed)), 1.0)
    assert [e.msg_id for e in pair.events_of("bj", SendFailed)] == [first_id]
    pair.run_for(55.0)
    assert second_id not in pair.received["sh"]  # the partial first still holds the window
    assert pair.run_until(lambda: second_id in pair.received["sh"], 20.0)
    assert pair.received["sh"][second_id][1] == second
    (dropped,) = pair.events_of("sh", MessageDropped)
    assert dropped.msg_id == first_id and "no data for 60 s" in dropped.reason
    assert abandoned_at + 60.0 <= pair.now < abandoned_at + 60.0 + 3.0
    assert [e.msg_id for e in pair.events_of("bj", SendFailed)] == [first_id]


def test_a_route_back_from_a_blackhole_is_timed_by_fresh_acks_and_taken_again() -> None:
    fast = LinkProfile(delay_s=0.010, rate_bps=10e6)
    pair = SimulatedPair({"a": fast, "b": replace(fast, delay_s=0.030)}, seed=21)
    sent = send_many(pair, "bj", [(8 << 20) - 64] * 2, seed=3)  # both paths busy throughout
    pair.run_for(0.5)
    assert pair.sessions["bj"].path_snapshot("a", pair.now)["role"] == "critical"
    record = pair.sessions["bj"]._paths["a"]
    sender = record.sender
    assert sender.inflight
    pair.set_silent("a", True)  # acks on their way and written since wait for its end
    pair.run_for(3.0)
    assert not record.usable
    pair.set_silent("a", False)
    back_at = pair.now
    pair.run_for(0.05)
    # The acks that waited out the blackhole are of datagrams given up long ago: they
    # time nothing (they would say 3 s) and are not taken for reordering.
    assert record.usable
    assert sender.estimator.srtt_s < 0.025
    assert sender.estimator.rtt_p99_s < 0.05
    assert sender.rto_floor_s == pytest.approx(MIN_RTO_S)
    assert sender.spurious_losses == 0
    pair.run_for(3.0)
    back = [
        (t, e)
        for t, e in pair.events["bj"]
        if isinstance(e, RouteChanged) and t > back_at and e.current == "a"
    ]
    assert back, "the critical route never came back to a"
    assert back[0][0] - back_at < 2.5  # validation, then the challenger's dwell
    assert pair.run_until(lambda: all_done(pair, "bj", sent), max_time_s=30)
    assert_exactly_once_intact(pair, "bj", sent)


def test_a_batch_of_datagrams_is_handled_as_each_alone_and_names_only_the_bad_ones() -> None:
    """``handle_datagrams``: a malformed datagram among good ones costs only itself."""
    bj, sh = _hello_pair()
    payload = bytes(range(256)) * 40
    msg_id = bj.submit(MessageHeader("t", 3, False, zlib.crc32(payload), b""), payload, 0.0)
    sent = []
    while (datagram := bj.datagram_to_send("a", 0.001)) is not None:
        sent.append(datagram)
    assert len(sent) >= 3
    batch = [sent[0], b"\xff" * 40, *sent[1:], bytes([DGRAM_SHARD]) + b"\x00" * 5]
    errors = sh.handle_datagrams("a", batch, 0.02)
    assert [type(e) for e in errors] == [RemoteProtocolError, RemoteProtocolError]
    received = [e for e in iter(sh.next_event, None) if isinstance(e, MessageReceived)]
    assert [(e.msg_id, bytes(e.payload)) for e in received] == [(msg_id, payload)]
    with pytest.raises(LocalProtocolError, match="not up"):
        sh.handle_datagrams("b", sent, 0.03)


def _hello_pair() -> tuple[PeerSession, PeerSession]:
    def up(site: str, peer: str) -> PeerSession:
        session = PeerSession(
            site, peer, max_message_bytes=1 << 22, inbox_window_bytes=1 << 22, now=0
        )
        session.path_up("a", datagram_bytes=1200, now=0.0)
        return session

    bj, sh = up("bj", "sh"), up("sh", "bj")
    for sender, receiver in ((bj, sh), (sh, bj)):
        for frame in ControlStreamDecoder().feed(sender.control_to_send("a", 0.0)):
            receiver.handle_control("a", frame, 0.0)
    return bj, sh


def test_datagrams_pulled_as_a_batch_are_those_pulled_one_by_one() -> None:
    payloads = [bytes([n]) * 30_000 for n in (1, 2)]
    one_by_one, batched = _hello_pair()[0], _hello_pair()[0]
    for session in (one_by_one, batched):
        for step, payload in enumerate(payloads):
            header = MessageHeader("t", step, step == 1, zlib.crc32(payload), b"")
            session.submit(header, payload, 0.0)
    expected = list(iter(lambda: one_by_one.datagram_to_send("a", 0.001), None))
    got = batched.datagrams_to_send("a", 0.001, 7)
    got += batched.datagrams_to_send("a", 0.001, 1000)
    assert len(expected) > 7
    assert got == expected
    assert batched.datagrams_to_send("a", 0.001, 5) == []
