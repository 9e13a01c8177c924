"""The engine's congestion controller and pacer (wg_cc.c, wg_pacer.c) against the Python
they port (``net/congestion.py``, ``net/pacing.py``): both driven by the same calls, in
the order aioquic's QuicPacketRecovery makes them, over a simulated path (bottleneck,
drop-tail queue, random loss, app-limited phases, RTT and rate changes, outages that
end in persistent congestion), compared after every call."""

from __future__ import annotations

import functools
import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.tls import Epoch
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.engine import _engine
from wangate.errors import LocalProtocolError
from wangate.net.congestion import BW_WINDOW_ROUNDS, WangateCongestionControl
from wangate.net.pacing import BurstablePacer

FLOAT_ATTRS = ("btl_bw_bps", "random_loss", "loss_baseline", "sending_rate_bps", "pacing_gain")
INT_ATTRS = (
    "congestion_window", "bytes_in_flight", "round_count", "congestion_events",
    "delivered_bytes", "min_window", "min_target_window", "initial_window",
)  # fmt: skip
CongestionModel, Pacer = _engine.CongestionModel, _engine.Pacer
PACER_FLOATS = ("bucket_max", "bucket_time", "evaluation_time", "pacing_rate_bytes")
MAX_ACK_DELAY_S = 0.025  # aioquic's default
K_TIME_THRESHOLD = 9 / 8  # RFC 9002 §6.1.2
K_PACKET_THRESHOLD = 3  # RFC 9002 §6.1.1
PERSISTENT_CONGESTION_FACTOR = 3  # RFC 9002 §7.6.1


def _same_float(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-12)


class Twin:
    """WangateCongestionControl and BurstablePacer beside CongestionModel and Pacer:
    every call goes to both, and ``check`` after each one compares what they show."""

    def __init__(self, mss: int) -> None:
        self.mss = mss
        self.py = WangateCongestionControl(max_datagram_size=mss)
        self.c = CongestionModel(mss)
        self.py_pacer = BurstablePacer(max_datagram_size=mss, rate_source=self.py)
        self.c_pacer = Pacer(mss)
        self.packets: dict[int, QuicSentPacket] = {}
        self.srtt: float | None = None  # aioquic's smoothed RTT, as the pacer is given it
        self.calls = 0
        self.inexact = 0  # float pairs equal within 1e-12 but not bit for bit
        self.states: set[str] = set()
        self.max_samples = 0  # the C filter's most samples held
        self.max_py_samples = 0  # the Python deque's

    # ------------------------------------------------------------ comparison

    def _float(self, name: str, a: float | None, b: float | None) -> None:
        assert _same_float(a, b), f"call {self.calls}: {name}: python {a!r}, C {b!r}"
        if a != b:
            self.inexact += 1

    def check(self) -> None:
        py, c = self.py, self.c
        self.calls += 1
        assert py.state == c.state, f"call {self.calls}: state {py.state} != {c.state}"
        for name in INT_ATTRS:
            a, b = getattr(py, name), getattr(c, name)
            assert a == b, f"call {self.calls}: {name}: python {a}, C {b}"
        assert py.filled_pipe == c.filled_pipe
        for name in FLOAT_ATTRS:
            self._float(name, getattr(py, name), getattr(c, name))
        self._float("min_rtt_s", py.min_rtt_s, c.min_rtt_s)
        self._float("srtt_s", py.srtt_s, c.srtt_s)
        for srtt in (self.srtt if self.srtt is not None else 0.05, 0.0005, 0.3):
            self._float(f"pacing_rate_bytes({srtt})", py.pacing_rate_bytes(srtt),
                        c.pacing_rate_bytes(srtt))  # fmt: skip
        pp, cp = self.py_pacer, self.c_pacer
        for name in PACER_FLOATS:
            self._float(f"pacer.{name}", getattr(pp, name), getattr(cp, name))
        self._float("pacer.packet_time", pp.packet_time, cp.packet_time)
        assert pp.burst == cp.burst
        self.states.add(py.state)
        self.max_samples = max(self.max_samples, c.bw_samples)
        self.max_py_samples = max(self.max_py_samples, len(py._bw_samples))
        assert c.bw_samples <= BW_WINDOW_ROUNDS + 1

    # ---------------------------------------------------------- the calls

    def sent(self, pn: int, size: int, now: float) -> None:
        packet = QuicSentPacket(
            epoch=Epoch.ONE_RTT,
            in_flight=True,
            is_ack_eliciting=True,
            is_crypto_packet=False,
            packet_number=pn,
            packet_type=QuicPacketType.ONE_RTT,
            sent_time=now,
            sent_bytes=size,
        )
        self.packets[pn] = packet
        self.py.on_packet_sent(packet=packet)
        self.c.on_packet_sent(pn, size, now)
        self.check()

    def acked(self, pn: int, now: float) -> None:
        self.py.on_packet_acked(now=now, packet=self.packets.pop(pn))
        self.c.on_packet_acked(pn, now)
        self.check()

    def lost(self, pns: list[int], now: float, array: bool = False) -> None:
        self.py.on_packets_lost(now=now, packets=[self.packets.pop(pn) for pn in pns])
        if array:
            self.c.on_packets_lost_array(pns, now)
        else:
            self.c.on_packets_lost(pns, now)
        self.check()

    def expired(self, pns: list[int]) -> None:
        self.py.on_packets_expired(packets=[self.packets.pop(pn) for pn in pns])
        self.c.on_packets_expired(pns)
        self.check()

    def forget(self, pn: int) -> None:
        """The controller loses a packet still in flight (its _Sent entry, its ``tracked``)."""
        del self.py._sent[(Epoch.ONE_RTT, pn)]
        self.c.forget(pn)
        self.check()

    def rtt(self, rtt: float, now: float) -> None:
        self.py.on_rtt_measurement(now=now, rtt=rtt)
        self.c.on_rtt_measurement(rtt, now)
        self.check()

    def persistent_congestion(self) -> None:
        self.py.on_persistent_congestion()
        self.c.on_persistent_congestion()
        self.check()

    def update_rate(self) -> None:
        assert self.srtt is not None
        self.py_pacer.update_rate(self.py.congestion_window, self.srtt)
        self.c_pacer.update_rate(self.c, self.c.congestion_window, self.srtt)
        self.check()

    def next_send_time(self, now: float) -> float | None:
        a, b = self.py_pacer.next_send_time(now), self.c_pacer.next_send_time(now)
        self._float("next_send_time", a, b)
        self.check()
        return a

    def update_after_send(self, now: float) -> None:
        self.py_pacer.update_after_send(now)
        self.c_pacer.update_after_send(now)
        self.check()

    def set_burst(self, on: bool) -> None:
        self.py_pacer.burst = on
        self.c_pacer.burst = on
        self.check()


# ---------------------------------------------------------------- the path


@dataclass
class Path:
    rate_bps: float  # bytes per second at the bottleneck
    rtt_s: float  # propagation, both ways
    loss: float
    buffer_bytes: float
    free_at: float = 0.0  # when the bottleneck has sent what is queued
    outage_until: float = -1.0  # drops everything before this
    outage_start: float = -1.0
    outage_declared: bool = False  # persistent congestion declared for this outage


@dataclass
class Sim:
    """A sender over ``Path`` with aioquic's RTT estimate and loss detection (RFC 9002
    §5, §6.1, §7.6), its receiver acking every second packet or after a delay."""

    seed: int
    phases: bool = True  # random phases: app-limited, RTT, rate, outages, expiry, burst
    twin: Twin = field(init=False)
    rng: random.Random = field(init=False)
    path: Path = field(init=False)
    mss: int = field(init=False)
    now: float = 0.0
    events: list[tuple[float, int, str, Any]] = field(default_factory=list)
    order: int = 0
    next_pn: int = 0
    sent_at: dict[int, float] = field(default_factory=dict)  # in flight, by pn
    largest_acked: int = -1
    rtt_latest: float = 0.0
    rtt_min: float = math.inf
    rtt_var: float = 0.0
    unacked: list[int] = field(default_factory=list)  # at the receiver
    ack_timer: bool = False
    send_at: float | None = None  # the pacer's wake-up, when one is set
    bulk: bool = True
    app_budget: int = 0  # packets the application has while not bulk
    lost_packets: int = 0
    persistent: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.mss = self.rng.choice((1200, 1452))
        self.twin = Twin(self.mss)
        rate = self.rng.choice((125_000.0, 625_000.0, 2_500_000.0))
        rtt = self.rng.choice((0.010, 0.040, 0.100))
        buffer = self.rng.choice((0.1, 1.0, 2.0)) * rate * rtt + 4 * self.mss
        self.path = Path(rate, rtt, self.rng.choice((0.0, 0.01, 0.05)), buffer)

    def push(self, at: float, kind: str, data: Any = None) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, kind, data))

    # ------------------------------------------------------------ sender

    def try_send(self) -> None:
        twin = self.twin
        while twin.py.congestion_window - twin.py.bytes_in_flight >= self.mss:
            if not self.bulk and self.app_budget == 0:
                return
            if self.send_at is not None and self.now < self.send_at:
                return
            at = twin.next_send_time(self.now)
            if at is not None:
                self.send_at = at
                self.push(at, "send")
                return
            self.send_at = None
            self.transmit()
            twin.update_after_send(self.now)

    def transmit(self) -> None:
        pn, self.next_pn = self.next_pn, self.next_pn + 1
        size = self.mss if self.rng.random() < 0.9 else self.rng.randrange(60, self.mss)
        self.twin.sent(pn, size, self.now)
        self.sent_at[pn] = self.now
        if not self.bulk:
            self.app_budget -= 1
        if self.rng.random() < 0.002:
            self.twin.forget(pn)
        path = self.path
        queued = max(0.0, path.free_at - self.now) * path.rate_bps
        if self.now < path.outage_until or queued + size > path.buffer_bytes:
            return  # dropped: found lost by the sender, or never
        path.free_at = max(self.now, path.free_at) + size / path.rate_bps
        if self.rng.random() < path.loss:
            return
        jitter = self.rng.random() * 0.001
        self.push(path.free_at + path.rtt_s / 2 + jitter, "arrive", pn)

    # ----------------------------------------------------------- receiver

    def arrive(self, pn: int) -> None:
        self.unacked.append(pn)
        if len(self.unacked) >= 2:
            self.send_ack(0.0)
        elif not self.ack_timer:
            self.ack_timer = True
            self.push(self.now + self.rng.uniform(0.001, 0.02), "ack_timer")

    def send_ack(self, delay: float) -> None:
        pns, self.unacked = self.unacked, []
        self.push(self.now + self.path.rtt_s / 2, "ack", (pns, delay))

    # ------------------------------------------------- recovery (RFC 9002)

    @property
    def srtt(self) -> float | None:
        return self.twin.srtt

    def on_ack(self, pns: list[int], ack_delay: float) -> None:
        twin = self.twin
        newly = sorted(pn for pn in pns if pn in self.sent_at)
        self.largest_acked = max(self.largest_acked, *pns)
        if not newly:
            return
        for pn in newly:
            twin.acked(pn, self.now)
        largest = newly[-1]
        sent_time = self.sent_at[largest]
        for pn in newly:
            del self.sent_at[pn]
        if largest == self.largest_acked:
            latest = self.now - sent_time
            self.rtt_latest = max(latest, 0.001)
            self.rtt_min = min(self.rtt_min, self.rtt_latest)
            if self.rtt_latest > self.rtt_min + ack_delay:
                self.rtt_latest -= ack_delay
            if twin.srtt is None:
                self.rtt_var, twin.srtt = latest / 2, latest
            else:
                self.rtt_var = 3 / 4 * self.rtt_var + 1 / 4 * abs(self.rtt_min - self.rtt_latest)
                twin.srtt = 7 / 8 * twin.srtt + 1 / 8 * self.rtt_latest
            twin.rtt(latest, self.now)
            twin.update_rate()
        self.detect_loss()

    def detect_loss(self) -> None:
        if self.srtt is None:
            return
        delay = K_TIME_THRESHOLD * max(self.rtt_latest, self.srtt)
        lost = [
            pn
            for pn, at in self.sent_at.items()
            if pn < self.largest_acked
            and (pn <= self.largest_acked - K_PACKET_THRESHOLD or at <= self.now - delay)
        ]
        if lost:
            self.declare_lost(lost)

    def declare_lost(self, lost: list[int]) -> None:
        times = [self.sent_at.pop(pn) for pn in lost]
        self.lost_packets += len(lost)
        self.twin.lost(lost, self.now, array=self.rng.random() < 0.5)
        if self.srtt is not None:
            pto = self.srtt + max(4 * self.rtt_var, 0.001) + MAX_ACK_DELAY_S
            span = max(times) - min(times)
            # an outage: aioquic's probes would keep the lost span growing past 3 PTOs
            path = self.path
            outage = self.now < path.outage_until and not path.outage_declared
            if outage and self.now - path.outage_start > PERSISTENT_CONGESTION_FACTOR * pto:
                path.outage_declared = True
                span = math.inf
            if span > PERSISTENT_CONGESTION_FACTOR * pto:
                self.persistent += 1
                self.twin.persistent_congestion()

    def on_tick(self) -> None:
        """What the loss and probe timers would find: time-threshold losses, and after
        a long silence everything in flight (as a probe timeout's reschedule)."""
        self.detect_loss()
        if self.sent_at and self.srtt is not None:
            pto = self.srtt + max(4 * self.rtt_var, 0.001) + MAX_ACK_DELAY_S
            if self.now - min(self.sent_at.values()) > 4 * pto:
                self.declare_lost(sorted(self.sent_at))
        self.push(self.now + 0.005, "tick")

    # -------------------------------------------------------------- phases

    def on_phase(self) -> None:
        rng, path, twin = self.rng, self.path, self.twin
        choice = rng.random()
        if choice < 0.3:
            self.bulk = not self.bulk
            self.app_budget = 0
        elif choice < 0.45:
            path.rtt_s = min(max(path.rtt_s * rng.choice((0.5, 0.8, 1.25, 2.0)), 0.002), 0.3)
        elif choice < 0.55:
            path.rate_bps *= rng.choice((0.5, 2.0))
        elif choice < 0.62:
            path.outage_start, path.outage_declared = self.now, False
            path.outage_until = self.now + rng.uniform(0.3, 1.5)
        elif choice < 0.72 and self.sent_at:
            some = [pn for pn in sorted(self.sent_at) if rng.random() < 0.3]
            for pn in some:
                del self.sent_at[pn]
            twin.expired(some)
        elif choice < 0.85:
            twin.set_burst(not twin.py_pacer.burst)
        if not self.bulk:
            self.push(self.now, "app")
        self.push(self.now + rng.uniform(0.3, 2.0), "phase")

    def on_app(self) -> None:
        if self.bulk:
            return
        self.app_budget = self.rng.choice((1, 3, 10, 50))
        self.push(self.now + self.rng.uniform(0.01, 0.2), "app")

    def run(self, until_s: float) -> None:
        self.push(0.0, "send")
        self.push(0.005, "tick")
        if self.phases:
            self.push(self.rng.uniform(0.3, 2.0), "phase")
        while self.events and self.events[0][0] <= until_s:
            self.now, _, kind, data = heapq.heappop(self.events)
            if kind == "arrive":
                self.arrive(data)
            elif kind == "ack_timer":
                self.ack_timer = False
                if self.unacked:
                    self.send_ack(self.rng.uniform(0.0, 0.02))
                continue
            elif kind == "ack":
                self.on_ack(*data)
            elif kind == "tick":
                self.on_tick()
            elif kind == "phase":
                self.on_phase()
            elif kind == "app":
                self.on_app()
            elif kind == "rtt":
                self.path.rtt_s = data
            elif kind == "send" and self.send_at is not None and self.now >= self.send_at:
                self.send_at = None
            self.try_send()


SEEDS = list(range(12))


@functools.cache
def _run(seed: int) -> Sim:
    sim = Sim(seed)
    sim.run(14.0)
    return sim


@pytest.mark.parametrize("seed", SEEDS)
def test_the_c_controller_and_pacer_follow_the_python_on_a_simulated_path(seed: int) -> None:
    sim = _run(seed)
    twin = sim.twin
    assert sim.next_pn >= 2000, "thousands of packets"
    assert twin.inexact == 0, "not even the last bit differs"
    assert twin.states >= {"startup", "drain", "probe_bw"}


def test_the_seeds_reach_every_state_loss_and_persistent_congestion() -> None:
    """The scenarios above visit what they are meant to."""
    sims = [_run(seed) for seed in SEEDS]
    assert set().union(*(sim.twin.states for sim in sims)) == {
        "startup", "drain", "probe_bw", "probe_rtt",
    }  # fmt: skip
    assert {sim.path.loss for sim in sims} == {0.0, 0.01, 0.05}
    assert all(sim.lost_packets > 0 and sim.twin.c.congestion_events > 0 for sim in sims)
    assert sum(sim.persistent for sim in sims) >= 3


def test_the_bounded_filter_keeps_the_unbounded_maximum() -> None:
    """Falling samples within a round: the Python's deque keeps them all, the C filter
    one per round, and their maxima (btl_bw_bps, compared after every call) agree."""
    sims = [_run(seed) for seed in SEEDS]
    assert max(sim.twin.max_py_samples for sim in sims) > BW_WINDOW_ROUNDS + 1
    assert max(sim.twin.max_samples for sim in sims) <= BW_WINDOW_ROUNDS + 1


def test_a_lossy_long_path_in_probe_bw_and_probe_rtt() -> None:
    """A steady bulk transfer with 5 % random loss whose RTT rises after 3 s: 10 s on,
    the min RTT expires and ProbeRTT runs."""
    sim = Sim(100, phases=False)
    sim.mss = 1200
    sim.twin = Twin(1200)
    sim.path = Path(625_000.0, 0.040, 0.05, 625_000.0 * 0.040)
    sim.push(3.0, "rtt", 0.050)
    sim.run(16.0)
    assert "probe_rtt" in sim.twin.states
    assert sim.twin.py.state == "probe_bw"
    assert sim.twin.inexact == 0
    assert sim.twin.c.random_loss > 0.01  # the path's loss, as the Python has it too


# -------------------------------------------------------------- the pacer


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(("next", "sent", "rate", "burst", "model_rate")),
            st.floats(0.0, 0.05),
            st.integers(4 * 1200, 2_000_000),
            st.floats(0.0001, 0.5),
        ),
        max_size=60,
    ),
    source=st.booleans(),
)
def test_the_pacer_follows_burstable_pacer(
    ops: list[tuple[str, float, int, float]], source: bool
) -> None:
    """Alone (aioquic's cwnd / srtt) or paced by a controller with a model."""
    model = CongestionModel(1200)
    py_model = WangateCongestionControl(max_datagram_size=1200)
    py = BurstablePacer(max_datagram_size=1200, rate_source=py_model if source else None)
    c = Pacer(1200)
    now = 0.0
    pn = 0
    for kind, dt, cwnd, srtt in ops:
        now += dt
        if kind == "next":
            a, b = py.next_send_time(now), c.next_send_time(now)
            assert _same_float(a, b) and a == b
        elif kind == "sent":
            py.update_after_send(now)
            c.update_after_send(now)
        elif kind == "rate":
            py.update_rate(cwnd, srtt)
            c.update_rate(model if source else None, cwnd, srtt)
        elif kind == "burst":
            py.burst = c.burst = not py.burst
        else:  # give the controllers a model: a packet, its RTT, its ack
            packet = QuicSentPacket(
                epoch=Epoch.ONE_RTT, in_flight=True, is_ack_eliciting=True,
                is_crypto_packet=False, packet_number=pn, packet_type=QuicPacketType.ONE_RTT,
                sent_time=now, sent_bytes=1200,
            )  # fmt: skip
            py_model.on_packet_sent(packet=packet)
            model.on_packet_sent(pn, 1200, now)
            now += srtt
            py_model.on_rtt_measurement(now=now, rtt=srtt)
            model.on_rtt_measurement(srtt, now)
            py_model.on_packet_acked(now=now, packet=packet)
            model.on_packet_acked(pn, now)
            pn += 1
        for name in PACER_FLOATS:
            assert getattr(py, name) == getattr(c, name), name
        assert py.packet_time == c.packet_time
        assert py.burst == c.burst


def test_the_pacer_before_a_rate_and_in_burst() -> None:
    pacer = Pacer(1200)
    assert pacer.packet_time is None and pacer.next_send_time(1.0) is None
    pacer.update_rate(None, 64 * 1200, 0.05)
    sent = 0
    while pacer.next_send_time(1.0) is None:  # the bucket's catch-up first
        pacer.update_after_send(1.0)
        sent += 1
    assert sent == 16  # aioquic's: min(cwnd / 4, 16 datagrams)
    assert pacer.next_send_time(1.0) == pytest.approx(1.0 + 0.05 / 64)
    pacer.burst = True
    assert pacer.next_send_time(1.0) is None
    pacer.update_after_send(1.0)  # sent in a burst: the bucket is kept
    pacer.burst = False
    assert pacer.next_send_time(1.0) is not None


# ----------------------------------------------------------------- misuse


def test_misuse_raises_local_protocol_errors_and_changes_nothing() -> None:
    model = CongestionModel(1200)
    model.on_packet_sent(0, 1200, 0.0)
    model.on_packet_sent(1, 1200, 0.0)
    with pytest.raises(LocalProtocolError):
        model.on_packet_sent(1, 1200, 0.0)
    with pytest.raises(LocalProtocolError):
        model.on_packet_acked(7, 0.1)
    with pytest.raises(LocalProtocolError):
        model.on_packets_lost([0, 7], 0.1)
    with pytest.raises(LocalProtocolError):
        model.on_packets_expired([0, 0])
    with pytest.raises(LocalProtocolError):
        model.forget(9)
    with pytest.raises(LocalProtocolError):
        model.on_packet_sent(2, 0, 0.0)
    with pytest.raises(LocalProtocolError):
        CongestionModel(0)
    with pytest.raises(LocalProtocolError):
        Pacer(1200).update_rate(object(), 1200, 0.1)
    assert model.bytes_in_flight == 2400
    model.on_packets_lost([0, 1], 0.1)  # both still there: the failed batches took nothing
    assert model.bytes_in_flight == 0
    with pytest.raises(LocalProtocolError):
        model.on_packet_acked(0, 0.2)
