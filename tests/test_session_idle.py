"""What an idle session wakes up for: one prober per path, a slow route check, no
credit packets of their own; and a dead path or peer still found in the stated times."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from tests.fakelink import LinkProfile, SimulatedPair, make_header
from wangate.core.control import CREDIT_REFRESH_S
from wangate.core.events import PathStateChanged, PeerStateChanged
from wangate.core.frames import ControlStreamDecoder, Credit, ProbeDatagram, decode_datagram
from wangate.core.scheduler import IDLE_SELECT_INTERVAL_S, SELECT_INTERVAL_S
from wangate.core.sending import ANSWERED_PROBE_INTERVAL_S, ANSWERED_PROBE_WAIT_S, PROBE_INTERVAL_S

DELAY_S = 0.010
CLEAN = LinkProfile(delay_s=DELAY_S)


class RecordingPair(SimulatedPair):
    """A simulated pair that notes when each side sent a probe, and what each heard."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.probes: dict[str, list[float]] = {"bj": [], "sh": []}
        self.heard: dict[str, list[float]] = {"bj": [], "sh": []}
        self.credits: dict[str, list[float]] = {"bj": [], "sh": []}
        self.control_writes: dict[str, int] = {"bj": 0, "sh": 0}
        self._decoders = {"bj": ControlStreamDecoder(), "sh": ControlStreamDecoder()}
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _record_sent(self, site: str, data: bytes, path: str) -> None:
        if isinstance(decode_datagram(data), ProbeDatagram):
            self.probes[site].append(self.now)
        super()._record_sent(site, data, path)

    def _record_arrived(self, receiver: str, data: bytes) -> None:
        self.heard[receiver].append(self.now)
        super()._record_arrived(receiver, data)

    def _send_control(self, path: object, sender: str, data: bytes) -> None:
        self.control_writes[sender] += 1
        for frame in self._decoders[sender].feed(data):
            if isinstance(frame, Credit):
                self.credits[sender].append(self.now)
        receiver = "sh" if sender == "bj" else "bj"
        self.heard[receiver].append(self.now + DELAY_S)  # the stream's one-way delay
        super()._send_control(path, sender, data)  # type: ignore[arg-type]


def idle_pair(profile: LinkProfile = CLEAN, seed: int = 1) -> RecordingPair:
    pair = RecordingPair({"a": profile}, seed=seed)
    pair.run_for(2.0)  # the path is validated on both sides
    for site in ("bj", "sh"):
        pair.probes[site].clear()
        pair.heard[site].clear()
        pair.credits[site].clear()
        pair.control_writes[site] = 0
    return pair


def test_an_idle_path_is_probed_from_one_side_at_a_time() -> None:
    pair = idle_pair()
    pair.run_for(10.0)
    # bj (the name that sorts first) probes every interval, exactly; sh answers, and
    # probes once per ANSWERED_PROBE_INTERVAL_S for its own RTT samples
    bj, sh = pair.probes["bj"], pair.probes["sh"]
    gaps = [b - a for a, b in itertools.pairwise(bj)]
    assert gaps == [pytest.approx(PROBE_INTERVAL_S, abs=1e-9)] * len(gaps)
    assert len(bj) == pytest.approx(10.0 / PROBE_INTERVAL_S, abs=1)
    gaps = [b - a for a, b in itertools.pairwise(sh)]
    assert gaps == [pytest.approx(ANSWERED_PROBE_INTERVAL_S, abs=1e-9)] * len(gaps)
    assert len(sh) == pytest.approx(10.0 / ANSWERED_PROBE_INTERVAL_S, abs=1)


def test_each_side_of_an_idle_path_hears_the_other_within_the_answered_wait() -> None:
    pair = idle_pair()
    pair.run_for(10.0)
    for site in ("bj", "sh"):
        heard = sorted(pair.heard[site])
        gaps = [b - a for a, b in itertools.pairwise(heard)]
        # the prober's interval, or the answering side's wait if a probe is late
        assert max(gaps) <= ANSWERED_PROBE_WAIT_S + 2 * DELAY_S + 1e-9
        assert heard[-1] >= pair.now - ANSWERED_PROBE_WAIT_S - 2 * DELAY_S


def test_an_idle_lossy_jittery_path_does_not_flap() -> None:
    lossy = LinkProfile(delay_s=0.040, jitter_s=0.020, drop_rate=0.02)
    pair = idle_pair(lossy, seed=7)
    pair.run_for(120.0)
    for site in ("bj", "sh"):
        downs = [e for e in pair.events_of(site, PathStateChanged) if e.state == "down"]
        assert downs == []
        assert [e.state for e in pair.events_of(site, PeerStateChanged)] in ([], ["up"])


def blackholed(run_s: float) -> tuple[RecordingPair, float]:
    """An idle pair whose path goes silent both ways; the time it did, after ``run_s``."""
    pair = idle_pair()
    pair.run_for(3.0)
    silent_at = pair.now
    pair.set_silent("a", True)
    pair.run_for(run_s)
    return pair, silent_at


def test_a_dead_idle_path_is_down_within_its_silence_timeout_on_both_sides() -> None:
    pair, silent_at = blackholed(2.0)
    for site in ("bj", "sh"):
        (down_at,) = [
            t
            for t, e in pair.events[site]
            if isinstance(e, PathStateChanged) and e.state == "down" and t > silent_at
        ]
        estimator = pair.sessions[site]._paths["a"].sender.estimator
        timeout_s = estimator.silence_timeout_s()
        assert timeout_s == pytest.approx(0.5)  # the 0.5 s floor: a 10 ms path
        # heard last at most one answered wait before the blackhole
        assert silent_at + timeout_s - ANSWERED_PROBE_WAIT_S <= down_at
        assert down_at <= silent_at + timeout_s + 1e-6


def test_an_idle_peer_is_unreachable_after_peer_dead_s() -> None:
    pair, silent_at = blackholed(6.0)
    for site in ("bj", "sh"):
        (gone_at,) = [
            t
            for t, e in pair.events[site]
            if isinstance(e, PeerStateChanged) and e.state == "unreachable"
        ]
        dead_s = pair.sessions[site]._liveness.peer_dead_s
        assert silent_at + dead_s - ANSWERED_PROBE_WAIT_S <= gone_at <= silent_at + dead_s + 1e-6


def test_the_critical_route_is_reconsidered_every_second_while_idle() -> None:
    pair = idle_pair()
    scheduler = pair.sessions["bj"]._scheduler
    pair.run_for(3.0)
    assert scheduler.next_select_at - scheduler.selected_at == pytest.approx(IDLE_SELECT_INTERVAL_S)
    assert pair.now - scheduler.selected_at < IDLE_SELECT_INTERVAL_S


def test_a_message_reconsiders_the_route_at_once_then_every_50_ms_while_sent() -> None:
    pair = idle_pair(LinkProfile(delay_s=DELAY_S, rate_bps=10e6))
    pair.run_for(0.5)
    session = pair.sessions["bj"]
    scheduler = session._scheduler
    assert pair.now - scheduler.selected_at > SELECT_INTERVAL_S  # chosen a while ago
    payload = random.Random(3).randbytes(2 << 20)  # 1.7 s on the wire
    msg_id = pair.submit("bj", make_header("g", payload, critical=False), payload)
    assert scheduler.selected_at == pair.now  # before the first piece was placed
    assert scheduler.next_select_at == pair.now + SELECT_INTERVAL_S
    pair.run_for(1.0)
    assert scheduler.next_select_at - scheduler.selected_at == pytest.approx(SELECT_INTERVAL_S)
    assert pair.now - scheduler.selected_at <= SELECT_INTERVAL_S
    assert pair.run_until(lambda: msg_id in pair.received["sh"], 5.0)
    pair.run_for(2.0)  # confirmed: idle again
    assert scheduler.next_select_at - scheduler.selected_at == pytest.approx(IDLE_SELECT_INTERVAL_S)


def test_a_critical_message_after_idle_is_routed_on_a_fresh_choice() -> None:
    slow = LinkProfile(delay_s=0.010, rate_bps=20e6)
    pair = RecordingPair({"a": slow, "b": replace(slow, delay_s=0.040)}, seed=4)
    pair.run_for(2.5)
    session = pair.sessions["bj"]
    scheduler = session._scheduler
    assert scheduler.selector.current == "a"
    payload = random.Random(1).randbytes(10_000)
    pair.submit("bj", make_header("layer0", payload, critical=True), payload)
    assert scheduler.selected_at == pair.now
    assert scheduler.next_select_at == pair.now + SELECT_INTERVAL_S
    assert session.has_critical_for("a") and not session.has_critical_for("b")


def test_idle_credit_rides_on_other_control_frames_at_most_once_a_second() -> None:
    pair = idle_pair()
    pair.run_for(10.0)
    for site in ("bj", "sh"):
        credits = pair.credits[site]
        gaps = [b - a for a, b in itertools.pairwise(credits)]
        assert all(g >= CREDIT_REFRESH_S for g in gaps)
    # every control write of the answering side carries a probe's ack; credit never
    # makes a write of its own, so there are no more writes than probes answered
    for site, peer in (("bj", "sh"), ("sh", "bj")):
        assert pair.control_writes[site] <= len(pair.probes[peer]) + 1
    # and the side that answers most probes refreshes its credit about once a second
    answerer = max(("bj", "sh"), key=lambda s: pair.control_writes[s])
    assert len(pair.credits[answerer]) >= 8
