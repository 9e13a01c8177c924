"""The engine's loss detection (wg_recovery.c) against aioquic's QuicPacketRecovery.

Both are driven with the same calls over a simulated path (a bottleneck with a queue,
random loss, reordering, delayed, clumped and lost ACKs, idle periods that let PTOs
fire, blackouts long enough for persistent congestion), configured as wangate
configures aioquic: the "wangate" congestion controller and the BurstablePacer paced
by it, the application space after the handshake.  After every call they must agree
exactly: bytes in flight, window, every RTT figure, the loss-detection timer, the PTO
count, which packets were acked and lost, and the pacer's next send time.
"""

from __future__ import annotations

import functools
import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicDeliveryState, QuicSentPacket
from aioquic.quic.rangeset import RangeSet
from aioquic.quic.recovery import QuicPacketRecovery, QuicPacketSpace
from aioquic.tls import Epoch

import wangate.net.congestion as congestion  # registers "wangate" with aioquic
from wangate.engine import _engine
from wangate.errors import LocalProtocolError, RemoteProtocolError
from wangate.net.pacing import BurstablePacer

INITIAL_RTT = 0.1  # aioquic's QuicConfiguration default, which wangate keeps
MAX_ACK_DELAY = 0.025  # the peer's (aioquic's transport parameter default)
ACK_DELAY_EXPONENT = 3
MAX_ACK_RANGES = 32


class Reference:
    """aioquic's recovery for the application space, as a wangate connection has it
    once the handshake is confirmed."""

    def __init__(self, max_datagram_size: int) -> None:
        self.probes = 0
        self.recovery = QuicPacketRecovery(
            congestion_control_algorithm=congestion.CONGESTION_CONTROL_NAME,
            initial_rtt=INITIAL_RTT,
            max_datagram_size=max_datagram_size,
            peer_completed_address_validation=True,
            send_probe=self._send_probe,
        )
        self.recovery.handshake_confirmed = True
        self.recovery.max_ack_delay = MAX_ACK_DELAY
        self.space = QuicPacketSpace(is_application_data=True)
        self.recovery.spaces = [self.space]
        # as wangate.net.pacing.install_burstable_pacer does on a fresh connection
        self.recovery._pacer = BurstablePacer(
            max_datagram_size=max_datagram_size, rate_source=self.recovery._cc
        )
        self.lost: list[int] = []
        self.acked: list[int] = []
        self.persistent = 0
        cc = self.recovery._cc
        original = cc.on_persistent_congestion

        def counted() -> None:
            self.persistent += 1
            original()

        cc.on_persistent_congestion = counted

    def _send_probe(self) -> None:
        self.probes += 1

    def _delivered(self, state: QuicDeliveryState, pn: int) -> None:
        (self.acked if state == QuicDeliveryState.ACKED else self.lost).append(pn)

    def sent(self, pn: int, sent_bytes: int, ack_eliciting: bool, now: float) -> None:
        packet = QuicSentPacket(
            epoch=Epoch.ONE_RTT,
            in_flight=ack_eliciting,
            is_ack_eliciting=ack_eliciting,
            is_crypto_packet=False,
            packet_number=pn,
            packet_type=QuicPacketType.ONE_RTT,
            sent_time=now,
            sent_bytes=sent_bytes,
        )
        packet.delivery_handlers.append((self._delivered, (pn,)))
        self.recovery.on_packet_sent(packet=packet, space=self.space)

    def ack(self, ranges: list[tuple[int, int]], ack_delay: float, now: float) -> None:
        self.lost, self.acked = [], []
        rangeset = RangeSet()
        for smallest, largest in ranges:
            rangeset.add(smallest, largest + 1)
        self.recovery.on_ack_received(
            ack_rangeset=rangeset, ack_delay=ack_delay, now=now, space=self.space
        )

    def timeout(self, now: float) -> int:
        self.lost, self.acked, self.probes = [], [], 0
        self.recovery.on_loss_detection_timeout(now=now)
        return self.probes

    def timer(self) -> float | None:
        return self.recovery.get_loss_detection_time(amplification_limited=False)


def assert_same(ref: Reference, eng: Any, now: float) -> None:
    py = ref.recovery
    assert eng.bytes_in_flight == py.bytes_in_flight
    assert eng.congestion_window == py.congestion_window
    assert eng.smoothed_rtt == py._rtt_smoothed
    assert eng.rtt_min == py._rtt_min
    assert eng.rtt_latest == py._rtt_latest
    assert eng.rtt_variance == py._rtt_variance
    assert eng.pto_count == py._pto_count
    assert eng.get_loss_detection_time() == ref.timer()
    assert eng.loss_time == ref.space.loss_time
    assert eng.get_probe_timeout() == py.get_probe_timeout()
    assert eng.ack_eliciting_in_flight == ref.space.ack_eliciting_in_flight
    assert eng.pacing_rate_bytes == py._pacer.pacing_rate_bytes
    # next_send_time moves the bucket on: both, at the same time
    assert eng.pacer_next_send_time(now) == py._pacer.next_send_time(now)


@dataclass
class Scenario:
    seed: int
    loss: float  # forward random loss
    one_way_s: float = 0.02
    rate_bps: float = 8e6  # bottleneck
    queue_s: float = 0.05  # bottleneck buffer, in time at its rate
    ack_loss: float = 0.03
    reorder: float = 0.03  # a packet delayed by up to 3 one-way delays
    clump: float = 0.02  # an ACK held back with the next ones, released together
    inflate: float = 0.02  # an ACK reporting more delay than max_ack_delay
    duration_s: float = 6.0
    max_datagram_size: int = 1200
    blackouts: list[tuple[float, float]] = field(default_factory=list)
    ring_cap: int = 16  # small, so that the ring doubles several times


@dataclass
class Stats:
    packets: int = 0
    acks: int = 0
    lost: int = 0
    ptos: int = 0
    loss_timers: int = 0
    persistent: int = 0
    rtt_floor: int = 0
    ring_capacity: int = 0


class Simulation:
    """One sender (both recoveries), a path, one receiver that acks as wg_received does
    (every second ack-eliciting packet, else after max_ack_delay; 32 ranges)."""

    def __init__(self, s: Scenario) -> None:
        self.s = s
        self.rng = random.Random(s.seed)
        self.ref = Reference(s.max_datagram_size)
        self.eng = _engine.Recovery(
            s.max_datagram_size, INITIAL_RTT, MAX_ACK_DELAY, ring_cap=s.ring_cap
        )
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.now = 0.0
        self.stats = Stats()
        self.link_free = 0.0
        self.reverse_held: list[tuple[list[tuple[int, int]], int]] = []
        # receiver
        self.ranges = RangeSet()
        self.largest = -1
        self.largest_at = 0.0
        self.unacked = 0
        self.ack_at: float | None = None
        # the application: active (greedy or trickling) and idle periods
        self.periods: list[tuple[float, float, float]] = []  # start, end, gap (0: greedy)
        t = 0.0
        while t < s.duration_s:
            active = self.rng.uniform(0.2, 1.2)
            gap = 0.0 if self.rng.random() < 0.6 else self.rng.uniform(0.001, 0.02)
            self.periods.append((t, t + active, gap))
            t += active + self.rng.uniform(0.05, 1.5)
        for start, _, _ in self.periods:
            self.schedule(start, "send", None)

    def schedule(self, at: float, kind: str, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, data))

    def dark(self, at: float) -> bool:
        return any(a <= at < b for a, b in self.s.blackouts)

    def period(self, now: float) -> tuple[float, float, float] | None:
        for p in self.periods:
            if p[0] <= now < p[1]:
                return p
        return None

    def check(self) -> None:
        assert_same(self.ref, self.eng, self.now)

    # ---------------------------------------------------------------- sender

    def send(self, size: int, ack_eliciting: bool) -> None:
        now = self.now
        pn = self.eng.on_packet_sent(size, ack_eliciting, now)
        self.ref.sent(pn, size, ack_eliciting, now)
        self.stats.packets += 1
        self.stats.ring_capacity = max(self.stats.ring_capacity, self.eng.ring_capacity)
        self.check()
        self.transmit(pn, size, ack_eliciting)

    def try_send(self) -> None:
        p = self.period(self.now)
        if p is None:
            return
        py = self.ref.recovery
        for _ in range(10000):
            if self.rng.random() < 0.08:  # an ACK-only packet for the other direction
                self.send(40, False)
            size = self.s.max_datagram_size
            if self.rng.random() < 0.3:
                size = self.rng.randint(60, size)
            fits = py.bytes_in_flight + size <= py.congestion_window
            assert self.eng.can_send(size) == fits
            if not fits:
                return  # an ACK opens the window again
            at = py._pacer.next_send_time(self.now)
            assert self.eng.pacer_next_send_time(self.now) == at
            if at is not None:
                self.schedule(at, "send", None)
                return
            self.send(size, True)
            py._pacer.update_after_send(self.now)
            self.eng.pacer_update_after_send(self.now)
            self.check()
            if p[2] > 0.0:  # trickling: one packet per gap
                self.schedule(self.now + p[2], "send", None)
                return
        raise AssertionError("the sender never stopped")

    def on_ack(self, ranges: list[tuple[int, int]], encoded: int) -> None:
        ack_delay = (encoded << ACK_DELAY_EXPONENT) / 1000000
        self.ref.ack(ranges, ack_delay, self.now)
        lost = self.eng.on_ack_received(ranges, ack_delay, self.now)
        assert lost == self.ref.lost
        assert self.eng.acked == self.ref.acked
        self.stats.acks += 1
        self.stats.lost += len(lost)
        self.stats.rtt_floor += self.ref.recovery._rtt_latest == 0.001
        self.check()
        self.try_send()

    def on_timer(self) -> None:
        loss_timer = self.ref.space.loss_time is not None
        probes_ref = self.ref.timeout(self.now)
        probes = self.eng.on_loss_detection_timeout(self.now)
        assert probes == probes_ref
        assert self.eng.lost == self.ref.lost
        self.stats.lost += len(self.eng.lost)
        if loss_timer:
            self.stats.loss_timers += 1
        else:
            self.stats.ptos += 1
        self.check()
        for _ in range(probes):
            self.send(30, True)  # a PING, whatever the window (RFC 9002 §7.5)
        self.try_send()

    # ---------------------------------------------------------------- path

    def transmit(self, pn: int, size: int, ack_eliciting: bool) -> None:
        s, now = self.s, self.now
        start = max(now, self.link_free)
        if start - now > s.queue_s:
            return  # the bottleneck's queue is full: tail drop
        self.link_free = start + size * 8 / s.rate_bps
        if self.dark(now) or self.rng.random() < s.loss:
            return
        arrive = self.link_free + s.one_way_s
        if self.rng.random() < s.reorder:
            arrive += self.rng.uniform(0, 3 * s.one_way_s)
        self.schedule(arrive, "arrive", (pn, ack_eliciting))

    def send_ack(self) -> None:
        now = self.now
        encoded = int((now - self.largest_at) * 1000000) >> ACK_DELAY_EXPONENT
        if self.rng.random() < self.s.inflate:
            encoded += self.rng.randint(1, 40000)  # beyond max_ack_delay
        ranges = [(r.start, r.stop - 1) for r in reversed(list(self.ranges))]
        self.unacked, self.ack_at = 0, None
        if self.dark(now) or self.rng.random() < self.s.ack_loss:
            return
        if self.rng.random() < self.s.clump:
            self.reverse_held.append((ranges, encoded))
            return
        at = now + self.s.one_way_s
        for held in self.reverse_held:  # released together, just before this one
            self.schedule(at, "ack", held)
        self.reverse_held = []
        self.schedule(at, "ack", (ranges, encoded))

    def arrive(self, pn: int, ack_eliciting: bool) -> None:
        now = self.now
        if pn in self.ranges:
            return
        if pn > self.largest:
            self.largest, self.largest_at = pn, now
        self.ranges.add(pn)
        if len(self.ranges) > MAX_ACK_RANGES:
            self.ranges.shift()
        if ack_eliciting:
            self.unacked += 1
            if self.unacked >= 2:
                self.send_ack()
            elif self.ack_at is None:
                self.ack_at = now + MAX_ACK_DELAY
                self.schedule(self.ack_at, "ack_timer", self.ack_at)

    # ---------------------------------------------------------------- loop

    def run(self) -> Stats:
        last_timer = None
        while self.events:
            timer = self.ref.timer()
            assert self.eng.get_loss_detection_time() == timer
            if timer is not None and timer <= self.events[0][0]:
                # event loops wake up on time or a little late; a loss timer fired
                # on the dot may find (sent + delay) - delay just below sent and
                # stay armed for the same instant, which a real clock moves past
                late = 0.0 if self.rng.random() < 0.5 else self.rng.uniform(0, 2e-4)
                if timer == last_timer:
                    late = max(late, 1e-6)
                last_timer = timer
                self.now = max(self.now, timer + late)
                self.on_timer()
                continue
            at, _, kind, data = heapq.heappop(self.events)
            if at > self.s.duration_s + 5.0:
                break
            self.now = max(self.now, at)
            if kind == "send":
                self.try_send()
            elif kind == "arrive":
                self.arrive(*data)
            elif kind == "ack_timer":
                if self.ack_at == data:
                    self.send_ack()
            elif kind == "ack":
                self.on_ack(*data)
        self.stats.persistent = self.ref.persistent
        return self.stats


SCENARIOS = [
    Scenario(seed=1, loss=0.0),
    Scenario(seed=2, loss=0.01),
    Scenario(seed=3, loss=0.05),
    Scenario(seed=4, loss=0.0, one_way_s=0.0003, rate_bps=20e6, queue_s=0.01),  # RTT < 1 ms
    Scenario(seed=5, loss=0.01, one_way_s=0.04, ack_loss=0.15, clump=0.1, reorder=0.1),
    Scenario(seed=6, loss=0.05, one_way_s=0.01, rate_bps=3e6, queue_s=0.2),
    Scenario(seed=7, loss=0.01, blackouts=[(1.0, 3.5)], max_datagram_size=1452),
    Scenario(seed=8, loss=0.0, blackouts=[(0.6, 2.0), (3.0, 5.5)], ack_loss=0.0),
]


def drawn(seed: int) -> Scenario:
    """A path drawn at random from `seed`."""
    rng = random.Random(seed)
    start = rng.uniform(0.5, 3.0)
    return Scenario(
        seed=seed,
        loss=rng.choice((0.0, 0.01, 0.05)),
        one_way_s=rng.choice((0.0004, 0.005, 0.02, 0.06)),
        rate_bps=rng.choice((2e6, 5e6, 10e6)),
        queue_s=rng.choice((0.005, 0.03, 0.1)),
        ack_loss=rng.choice((0.0, 0.03, 0.1)),
        reorder=rng.choice((0.0, 0.03, 0.1)),
        clump=rng.choice((0.0, 0.05)),
        duration_s=4.0,
        blackouts=[(start, start + rng.uniform(0.5, 3.0))] if rng.random() < 0.5 else [],
    )


SCENARIOS += [drawn(seed) for seed in range(100, 106)]


@functools.cache
def run(index: int) -> Stats:
    return Simulation(SCENARIOS[index]).run()


@pytest.mark.parametrize(
    "index", range(len(SCENARIOS)), ids=[f"seed{s.seed}-loss{s.loss}" for s in SCENARIOS]
)
def test_same_as_aioquic(index: int) -> None:
    scenario = SCENARIOS[index]
    stats = run(index)
    assert stats.packets > 500
    assert stats.acks > 100
    if scenario.loss or scenario.blackouts:
        assert stats.lost > 0
    assert stats.ring_capacity > scenario.ring_cap  # it grew


def test_the_scenarios_reach_timers_and_persistent_congestion() -> None:
    """The simulated paths do exercise the PTO, the loss timer, persistent congestion
    and the 1 ms RTT floor (else the differential runs above prove less)."""
    total = Stats()
    for index in range(len(SCENARIOS)):
        stats = run(index)
        total.ptos += stats.ptos
        total.loss_timers += stats.loss_timers
        total.persistent += stats.persistent
        total.rtt_floor += stats.rtt_floor
    assert total.ptos > 0
    assert total.loss_timers > 0
    assert total.persistent > 0
    assert total.rtt_floor > 0


# -------------------------------------------------------------------- unit checks


def make(**kwargs: Any) -> Any:
    return _engine.Recovery(1200, INITIAL_RTT, MAX_ACK_DELAY, **kwargs)


def test_first_sample_and_ack_delay() -> None:
    r = make()
    assert r.get_loss_detection_time() is None
    assert r.get_probe_timeout() == 2 * INITIAL_RTT
    for _ in range(3):
        r.on_packet_sent(1200, True, 0.0)
    assert r.bytes_in_flight == 3600
    assert r.get_loss_detection_time() == 2 * INITIAL_RTT  # §6.2.1, no sample yet
    assert r.on_ack_received([(0, 2)], 0.010, 0.100) == []
    assert r.acked == [0, 1, 2]
    assert r.rtt_latest == r.rtt_min == 0.100  # §5.3: not below min_rtt
    assert r.smoothed_rtt == 0.100  # the first sample (§5.3)
    assert r.rtt_variance == 0.050
    assert r.bytes_in_flight == 0
    assert r.get_loss_detection_time() is None
    r.on_packet_sent(1200, True, 0.2)
    r.on_ack_received([(3, 3)], 0.5, 0.35)  # ack delay capped at max_ack_delay
    assert r.rtt_latest == (0.35 - 0.2) - MAX_ACK_DELAY
    assert r.smoothed_rtt == 7 / 8 * 0.1 + 1 / 8 * r.rtt_latest
    assert r.rtt_variance == 3 / 4 * 0.05 + 1 / 4 * abs(0.1 - r.rtt_latest)
    r.on_packet_sent(1200, True, 0.4)
    r.on_ack_received([(4, 4)], 0.0, 0.4)  # floored at 1 ms
    assert r.rtt_latest == 0.001 and r.rtt_min == 0.001


def test_packet_and_time_thresholds() -> None:
    r = make()
    for i in range(6):
        r.on_packet_sent(1000, True, i * 0.001)
    # 5 acked: 0..2 are 3 or more below it (kPacketThreshold), 3 and 4 are not
    assert r.on_ack_received([(5, 5)], 0.0, 0.100) == [0, 1, 2]
    assert r.report["lost_packets"] == 3 and r.report["lost_bytes"] == 3000
    loss_delay = 9 / 8 * max(r.rtt_latest, r.smoothed_rtt)
    assert r.loss_time == 0.003 + loss_delay  # kTimeThreshold for the oldest left
    assert r.get_loss_detection_time() == r.loss_time
    assert r.on_loss_detection_timeout(r.loss_time + 1e-9) == 0  # a loss timer: no probes
    assert r.lost == [3]
    assert r.loss_time == 0.004 + loss_delay


def test_pto_backoff_and_probe() -> None:
    r = make()
    r.on_packet_sent(1200, True, 0.0)
    r.on_packet_sent(1200, True, 0.0)
    r.on_ack_received([(0, 0)], 0.0, 0.05)
    pto = r.get_probe_timeout()
    assert pto == 0.05 + max(4 * 0.025, 0.001) + MAX_ACK_DELAY
    assert r.get_loss_detection_time() == 0.0 + pto
    probes = r.on_loss_detection_timeout(pto)
    assert probes == _engine.WG_PTO_PROBES == 1
    assert r.pto_count == 1
    assert r.lost == [1]  # the oldest ack-eliciting packet, given up on (no congestion)
    assert r.report["expired_packets"] == 1
    assert r.bytes_in_flight == 0
    r.on_packet_sent(30, True, pto)
    assert r.get_loss_detection_time() == pto + 2 * pto  # backed off
    r.on_ack_received([(2, 2)], 0.0, pto + 0.05)
    assert r.pto_count == 0


def test_ack_only_packets_are_not_in_flight() -> None:
    r = make()
    r.on_packet_sent(40, False, 0.0)
    assert r.bytes_in_flight == 0
    assert r.get_loss_detection_time() is None
    r.on_packet_sent(1200, True, 0.0)
    r.on_ack_received([(0, 1)], 0.0, 0.03)
    assert r.acked == [0, 1] and r.bytes_in_flight == 0


def test_old_and_duplicate_acks_change_nothing() -> None:
    r = make()
    for _ in range(4):
        r.on_packet_sent(1200, True, 0.0)
    r.on_ack_received([(0, 3)], 0.0, 0.03)
    before = (r.smoothed_rtt, r.rtt_latest, r.bytes_in_flight)
    assert r.on_ack_received([(0, 3)], 0.0, 0.5) == []
    assert r.acked == []
    assert (r.smoothed_rtt, r.rtt_latest, r.bytes_in_flight) == before


def test_ack_of_a_packet_never_sent() -> None:
    r = make()
    r.on_packet_sent(1200, True, 0.0)
    with pytest.raises(RemoteProtocolError):
        r.on_ack_received([(0, 1)], 0.0, 0.03)
    assert r.bytes_in_flight == 1200  # nothing changed
    with pytest.raises(RemoteProtocolError):
        make().on_ack_received([(0, 0)], 0.0, 0.03)


def test_misuse() -> None:
    r = make()
    r.on_packet_sent(1200, True, 0.0)
    for ranges in ([], [(2, 1)], [(-1, 0)], [(0, 2**62)], [0], "x"):
        with pytest.raises((LocalProtocolError, TypeError)):
            r.on_ack_received(ranges, 0.0, 0.03)
    with pytest.raises(LocalProtocolError):
        r.on_ack_received([(i * 2, i * 2) for i in range(33)], 0.0, 0.03)
    with pytest.raises(LocalProtocolError):
        r.on_ack_received([(0, 0)], -1.0, 0.03)
    with pytest.raises(LocalProtocolError):
        r.on_packet_sent(0, True, 0.0)
    with pytest.raises(LocalProtocolError):
        r.on_packet_sent(1200, True, float("nan"))
    with pytest.raises(LocalProtocolError):
        _engine.Recovery(100, INITIAL_RTT, MAX_ACK_DELAY)
    with pytest.raises(LocalProtocolError):
        _engine.Recovery(1200, 0.0, MAX_ACK_DELAY)
    with pytest.raises(LocalProtocolError):
        make(ring_max=1000)  # not a power of two
    assert r.bytes_in_flight == 1200


def test_overlapping_ranges_merge_as_a_rangeset() -> None:
    r = make()
    for _ in range(6):
        r.on_packet_sent(1200, True, 0.0)
    r.on_ack_received([(4, 5), (0, 1), (1, 2), (3, 3)], 0.0, 0.03)
    assert r.acked == [0, 1, 2, 3, 4, 5]


def test_ring_grows_to_its_bound_then_refuses() -> None:
    r = make(ring_cap=4, ring_max=16)
    assert r.ring_capacity == 4
    for i in range(16):
        assert r.can_send(40)
        assert r.on_packet_sent(40, False, 0.0) == i
    assert r.ring_capacity == 16
    assert not r.can_send(40)
    with pytest.raises(LocalProtocolError):
        r.on_packet_sent(40, False, 0.0)
    r.on_ack_received([(0, 3)], 0.0, 0.01)  # the oldest leave: room again
    assert r.held == 12
    assert r.can_send(40)
    assert r.on_packet_sent(40, False, 0.01) == 16


def test_window_bounds_can_send() -> None:
    r = make()
    cwnd = r.congestion_window
    while r.bytes_in_flight + 1200 <= cwnd:
        assert r.can_send(1200)
        r.on_packet_sent(1200, True, 0.0)
    assert not r.can_send(1200)
