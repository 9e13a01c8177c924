"""A seeded, deterministic simulation of two gateways joined by several WAN paths.

Two ``PeerSession`` objects ("bj" and "sh") are driven exactly as the daemon drives them
(``path_up``, ``control_to_send``, ``datagram_to_send`` pulled while a path can send,
``handle_datagram``, ``handle_control``, ``get_timer``/``handle_timer``, ``consumed``),
but over fake links under a fake clock, so a minute of WAN traffic costs milliseconds.

Each direction of a path is a ``FakeLink``: a rate limit (the path's capacity, which
paces pulls), a one-way delay with jitter, random drop, reordering and duplication of
datagrams, and a "silent" switch (a blackhole). The path's control stream is reliable
and in order but delayed like the path; while the path is silent it delivers nothing
(a QUIC stream would hold its data for retransmission), and it dies with the path when
the path is closed (a QUIC connection gone).

Everything random comes from one ``random.Random(seed)`` per link, so a run is a pure
function of its seeds and parameters.
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from wangate.core.events import Event, MessageReceived
from wangate.core.frames import (
    ControlStreamDecoder,
    Hello,
    ShardDatagram,
    decode_datagram,
    encode_control,
)
from wangate.core.governor import BulkGovernor
from wangate.core.message import MessageHeader, message_checksum
from wangate.core.outbound import CodingPolicy
from wangate.core.session import PeerSession

NO_FEC = CodingPolicy(k=0)  # the range-repair tests count exactly the bytes resent

SITES = ("bj", "sh")
E = TypeVar("E", bound=Event)
CLOCK_TICK_S = 1e-6  # the fake clock's resolution: how far a timer that is due "now" moves
MAX_STUCK_TICKS = 1000  # a timer that stays due after this many ticks is a session bug


class SimulationStuck(AssertionError):
    """A session keeps reporting a deadline that ``handle_timer`` never clears."""


@dataclass(frozen=True)
class LinkProfile:
    """One direction of a path: what the network does to what we send."""

    delay_s: float = 0.020
    jitter_s: float = 0.0  # uniform extra delay in [0, jitter_s): reorders close datagrams
    drop_rate: float = 0.0
    reorder_rate: float = 0.0  # fraction held back an extra ``reorder_delay_s``
    reorder_delay_s: float = 0.010
    duplicate_rate: float = 0.0
    rate_bps: float = 100e6
    # Gilbert-Elliott bursts: P(good -> bad) per datagram and the mean burst length;
    # every datagram sent in the bad state is lost (on top of drop_rate)
    burst_start_rate: float = 0.0
    mean_burst: float = 1.0


@dataclass
class WireStats:
    """What crossed one direction of the wire, by message id (shard payload bytes)."""

    datagrams_sent: int = 0
    datagrams_dropped: int = 0
    payload_sent: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    payload_dropped: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    payload_by_path: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def repaired_bytes(self, msg_id: int, body_bytes: int) -> int:
        """Bytes of a message sent more than once (first sends cover the body once)."""
        return self.payload_sent[msg_id] - body_bytes


class FakeLink:
    """One direction of one path."""

    def __init__(self, profile: LinkProfile, seed: int) -> None:
        self.profile = profile
        self.rng = random.Random(seed)
        self.silent = False
        self.free_at = 0.0  # when the link can put the next datagram on the wire
        self.pull_scheduled = False
        self.control_arrives_at = 0.0  # keeps the control stream in order
        self.held_control: list[bytes] = []  # written while silent
        self.held_in_transit: list[bytes] = []  # written before, due while silent
        self.in_burst = False

    def transmit(self, size_bytes: int, now: float) -> list[float]:
        """Occupy the link with one datagram; its arrival times (none if lost, two if doubled)."""
        p = self.profile
        self.free_at = max(now, self.free_at) + size_bytes * 8 / p.rate_bps
        if p.burst_start_rate:
            if self.in_burst:
                self.in_burst = self.rng.random() >= 1 / p.mean_burst
            else:
                self.in_burst = self.rng.random() < p.burst_start_rate
        if self.silent or self.in_burst or self.rng.random() < p.drop_rate:
            return []
        copies = 2 if self.rng.random() < p.duplicate_rate else 1
        arrivals = []
        for _ in range(copies):
            at = self.free_at + p.delay_s + self.rng.random() * p.jitter_s
            if self.rng.random() < p.reorder_rate:
                at += p.reorder_delay_s
            arrivals.append(at)
        return arrivals

    def control_arrival(self, now: float) -> float:
        p = self.profile
        at = max(now + p.delay_s + self.rng.random() * p.jitter_s, self.control_arrives_at)
        self.control_arrives_at = at
        return at


class SimPath:
    """Both directions of one path, plus the per-side control stream decoders."""

    def __init__(self, name: str, profiles: dict[str, LinkProfile], seed: int) -> None:
        self.name = name
        # links[site] carries what ``site`` sends
        self.links = {site: FakeLink(profiles[site], seed * 2 + i) for i, site in enumerate(SITES)}
        self.decoders = {site: ControlStreamDecoder() for site in SITES}
        self.open = False
        self.generation = 0  # bumped on close: deliveries of an old connection are void


def other(site: str) -> str:
    return SITES[1 - SITES.index(site)]


def make_header(
    tag: str, payload: bytes, *, step: int = 0, critical: bool = False, meta: bytes = b""
) -> MessageHeader:
    return MessageHeader(tag, step, critical, message_checksum(meta, payload), meta)


class SimulatedPair:
    """Two gateways, N paths, a fake clock and an event loop that advances it.

    ``paths`` maps a path name to one ``LinkProfile`` for both directions, or to a pair
    (what bj sends, what sh sends). The clock moves to the next of: a delivery, a pull
    opportunity (a link free to send again), a session timer. A timer that
    ``handle_timer`` never clears raises ``SimulationStuck``.
    """

    def __init__(
        self,
        paths: Mapping[str, LinkProfile | tuple[LinkProfile, LinkProfile]],
        *,
        seed: int = 0,
        max_message_bytes: int = 8 << 20,
        inbox_window_bytes: int = 32 << 20,
        datagram_bytes: int | Mapping[str, int] = 1200,
        auto_consume: bool = True,
        start_s: float = 1000.0,
        coding: CodingPolicy = NO_FEC,
        governor: Callable[[], BulkGovernor] | None = None,
    ) -> None:
        self.now = start_s
        self.coding = coding
        self.governor = governor
        self.tamper: Callable[[bytes], bytes] | None = None
        self.datagram_bytes = (
            dict(datagram_bytes)
            if isinstance(datagram_bytes, Mapping)
            else dict.fromkeys(paths, datagram_bytes)
        )
        self.auto_consume = auto_consume
        self.sessions = {
            site: PeerSession(
                site,
                other(site),
                max_message_bytes=max_message_bytes,
                inbox_window_bytes=inbox_window_bytes,
                now=start_s,
                coding=coding,
                governor=governor() if governor else None,
            )
            for site in SITES
        }
        self.instance_ids = {"bj": 0x1111, "sh": 0x2222}
        self.paths: dict[str, SimPath] = {}
        for i, (name, spec) in enumerate(paths.items()):
            both = spec if isinstance(spec, tuple) else (spec, spec)
            self.paths[name] = SimPath(name, dict(zip(SITES, both, strict=True)), seed * 101 + i)
        self.events: dict[str, list[tuple[float, Event]]] = {site: [] for site in SITES}
        self.received: dict[str, dict[int, tuple[MessageHeader, bytes]]] = {s: {} for s in SITES}
        self.received_count: dict[str, dict[int, int]] = {s: defaultdict(int) for s in SITES}
        self.unconsumed: dict[str, dict[int, int]] = {site: {} for site in SITES}
        # wire[site]: what ``site`` sent; held_bytes[site]: bytes ``site`` holds as receiver
        self.wire = {site: WireStats() for site in SITES}
        self.held_bytes = dict.fromkeys(SITES, 0)
        self.max_held_bytes = dict.fromkeys(SITES, 0)
        self._held_msgs: dict[str, set[int]] = {site: set() for site in SITES}
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._timer_handled_at = dict.fromkeys(SITES, -1.0)
        self._stalled_until = dict.fromkeys(SITES, -1.0)
        self._stuck_ticks = dict.fromkeys(SITES, 0)
        self.steps = 0
        for name in self.paths:
            self.open_path(name)

    # ------------------------------------------------------------------ control

    def open_path(self, name: str) -> None:
        """Connection established: hellos cross, both sessions see ``path_up``."""
        path = self.paths[name]
        path.open = True
        path.decoders = {site: ControlStreamDecoder() for site in SITES}
        for site in SITES:
            session = self.sessions[site]
            hello = Hello(site, name, self.instance_ids[site], session.max_message_bytes)
            (decoded,) = path.decoders[other(site)].feed(encode_control(hello))
            assert isinstance(decoded, Hello) and decoded == hello
            self.sessions[other(site)].set_peer_limits(decoded.max_message_bytes)
        for site in SITES:
            self.sessions[site].path_up(
                name, datagram_bytes=self.datagram_bytes[name], now=self.now
            )
        self._service_all()

    def close_path(self, name: str, reason: str = "closed") -> None:
        """The path's connection is gone: nothing in transit on it arrives any more."""
        path = self.paths[name]
        path.open = False
        path.generation += 1
        for link in path.links.values():
            link.held_control.clear()
            link.held_in_transit.clear()
            link.silent = False
        for site in SITES:
            self.sessions[site].path_down(name, self.now, reason)
        self._service_all()

    def set_silent(self, name: str, silent: bool) -> None:
        """Blackhole both directions of a path (or bring it back)."""
        path = self.paths[name]
        for site, link in path.links.items():
            link.silent = silent
            if not silent and (link.held_in_transit or link.held_control):
                data = b"".join(link.held_in_transit + link.held_control)
                link.held_in_transit.clear()
                link.held_control.clear()
                self._send_control(path, site, data)
        self._service_all()

    def restart(self, site: str) -> None:
        """``site`` comes back as a new instance: fresh session, every path reconnects."""
        old = self.sessions[site]
        for name in self.paths:
            if self.paths[name].open:
                self.close_path(name, "peer restarted")
        self.sessions[site] = PeerSession(
            site,
            other(site),
            max_message_bytes=old.max_message_bytes,
            inbox_window_bytes=old.inbox_window_bytes,
            now=self.now,
            coding=self.coding,
            governor=self.governor() if self.governor else None,
        )
        self.instance_ids[site] += 1
        # the new instance numbers its messages from 1 again, and holds nothing
        self.wire[site] = WireStats()
        for receiver in SITES:
            self.received[receiver].clear()
            self.received_count[receiver].clear()
            self.unconsumed[receiver].clear()
            self._held_msgs[receiver].clear()
            self.held_bytes[receiver] = 0
        self.sessions[other(site)].peer_restarted(self.now)
        for name in self.paths:
            self.open_path(name)

    def stall(self, site: str, duration_s: float) -> None:
        """``site``'s process is held up for ``duration_s`` (a busy host): what arrives
        for it waits, and so do its timers and pulls. It wakes as under uvloop, whose
        loop runs due timers before it polls the sockets: the overdue timer first, then
        what arrived meanwhile, in order; the timer's sends (the driver's pump) go out
        before that."""
        self._stalled_until[site] = self.now + duration_s

        def wake() -> None:
            self._stalled_until[site] = -1.0
            if self._timer_at(site) <= self.now:
                self._timer_handled_at[site] = self.now
                self.sessions[site].handle_timer(self.now)
                self._service(site)

        self._schedule(self.now + duration_s, wake)

    def _held(self, site: str, action: Callable[[], None]) -> bool:
        """Whether ``action`` for ``site`` waits for the end of its stall (then runs)."""
        if self.now < self._stalled_until[site]:
            self._schedule(self._stalled_until[site], action)
            return True
        return False

    def submit(self, site: str, header: MessageHeader, payload: bytes) -> int:
        msg_id = self.sessions[site].submit(header, payload, self.now)
        self._service(site)
        return msg_id

    def consume(self, site: str, msg_id: int) -> None:
        """A trainer at ``site`` took a received message."""
        body_bytes = self.unconsumed[site].pop(msg_id)
        self.held_bytes[site] -= body_bytes
        self.sessions[site].consumed(body_bytes, msg_id)
        self._service(site)

    def inject_datagram(self, site: str, path: str, data: bytes) -> None:
        """Hand ``site`` a datagram as if it came from the peer (raises what the session raises)."""
        try:
            self.sessions[site].handle_datagram(path, data, self.now)
        finally:
            self._service(site)

    # --------------------------------------------------------------- event loop

    def run_until(self, predicate: Callable[[], bool], max_time_s: float) -> bool:
        """Advance the clock until ``predicate()`` holds; False if ``max_time_s`` ran out."""
        deadline = self.now + max_time_s
        while not predicate():
            at = self._next_time()
            if at > deadline:
                self.now = deadline
                return predicate()
            self._step(at)
        return True

    def run_for(self, duration_s: float) -> None:
        self.run_until(lambda: False, duration_s)

    def _next_time(self) -> float:
        times = [self._heap[0][0]] if self._heap else []
        times.extend(self._timer_at(site) for site in SITES)
        return min(times)

    def _timer_at(self, site: str) -> float:
        at = self.sessions[site].get_timer()
        if at is None:
            return float("inf")
        if self.now < self._stalled_until[site]:
            return max(at, self._stalled_until[site])  # its wake handles it
        if at <= self._timer_handled_at[site]:
            # already handled at that time: the fake clock ticks on, as a real one does
            return self._timer_handled_at[site] + CLOCK_TICK_S
        return at

    def _step(self, at: float) -> None:
        self.steps += 1
        self.now = max(self.now, at)
        while self._heap and self._heap[0][0] <= self.now:
            _, _, action = heapq.heappop(self._heap)
            action()
        for site in SITES:
            if self._timer_at(site) <= self.now and self.now >= self._stalled_until[site]:
                self._check_not_stuck(site)
                self._timer_handled_at[site] = self.now
                self.sessions[site].handle_timer(self.now)
                self._service(site)

    def _check_not_stuck(self, site: str) -> None:
        due = self.sessions[site].get_timer()
        if due is not None and due <= self._timer_handled_at[site]:
            self._stuck_ticks[site] += 1
            if self._stuck_ticks[site] > MAX_STUCK_TICKS:
                raise SimulationStuck(
                    f"{site}: get_timer() stays at {due:.6f} after handle_timer at "
                    f"{self._timer_handled_at[site]:.6f}"
                )
        else:
            self._stuck_ticks[site] = 0

    def _schedule(self, at: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, action))

    # ----------------------------------------------------------- moving bytes

    def _service_all(self) -> None:
        for site in SITES:
            self._service(site)

    def _service(self, site: str) -> None:
        """What a ``PeerDriver`` does after an input: events, control bytes, pulls."""
        session = self.sessions[site]
        self._drain_events(site)
        for path in self.paths.values():
            if not path.open:
                continue
            control = session.control_to_send(path.name, self.now)
            if control:
                self._send_control(path, site, control)
            self._pull(path, site)
        self._drain_events(site)

    def _pull(self, path: SimPath, site: str) -> None:
        link = path.links[site]
        if link.pull_scheduled:
            return
        session = self.sessions[site]
        while link.free_at <= self.now:
            data = session.datagram_to_send(path.name, self.now)
            if data is None:
                return
            self._record_sent(site, data, path.name)
            arrivals = link.transmit(len(data), self.now)
            if not arrivals:
                self._record_dropped(site, data)
            generation = path.generation
            for at in arrivals:
                self._schedule(at, self._deliverer(path, site, data, generation))
        link.pull_scheduled = True
        self._schedule(link.free_at, self._puller(path, site))

    def _puller(self, path: SimPath, site: str) -> Callable[[], None]:
        def pull() -> None:
            path.links[site].pull_scheduled = False
            if self.now < self._stalled_until[site]:
                return  # its wake pulls, as a driver's pump runs after its timer
            if path.open:
                self._pull(path, site)
                self._drain_events(site)

        return pull

    def _deliverer(
        self, path: SimPath, sender: str, data: bytes, generation: int
    ) -> Callable[[], None]:
        receiver = other(sender)

        def deliver() -> None:
            if path.generation != generation or not path.open or self._held(receiver, deliver):
                return
            if path.links[sender].silent:  # the blackhole swallows what was in transit too
                self._record_dropped(sender, data)
                return
            arrived = data if self.tamper is None else self.tamper(data)  # a bit flip past AEAD
            self._record_arrived(receiver, arrived)
            self.sessions[receiver].handle_datagram(path.name, arrived, self.now)
            self._service(receiver)

        return deliver

    def _send_control(self, path: SimPath, sender: str, data: bytes) -> None:
        link = path.links[sender]
        if link.silent:
            link.held_control.append(data)
            return
        at = link.control_arrival(self.now)
        generation = path.generation
        receiver = other(sender)
        # a stream delivers bytes in arbitrary pieces: cut the write at a random point
        cut = link.rng.randrange(len(data) + 1)

        def deliver() -> None:
            if path.generation != generation or self._held(receiver, deliver):
                return
            if link.silent:  # lost in the blackhole: the stream sends it again after
                link.held_in_transit.append(data)
                return
            session = self.sessions[receiver]
            for piece in (data[:cut], data[cut:]):
                for frame in path.decoders[receiver].feed(piece):
                    session.handle_control(path.name, frame, self.now)
            self._service(receiver)

        self._schedule(at, deliver)

    def _drain_events(self, site: str) -> None:
        session = self.sessions[site]
        while (event := session.next_event()) is not None:
            self.events[site].append((self.now, event))
            if isinstance(event, MessageReceived):
                self.received_count[site][event.msg_id] += 1
                self.received[site][event.msg_id] = (event.header, bytes(event.payload))
                self.unconsumed[site][event.msg_id] = event.body_bytes
                if self.auto_consume:
                    self.consume(site, event.msg_id)

    # ----------------------------------------------------------- bookkeeping

    def _record_sent(self, site: str, data: bytes, path: str) -> None:
        stats = self.wire[site]
        stats.datagrams_sent += 1
        datagram = decode_datagram(data)
        if isinstance(datagram, ShardDatagram):
            stats.payload_sent[datagram.msg_id] += len(datagram.data)
            stats.payload_by_path[path] += len(datagram.data)

    def _record_dropped(self, site: str, data: bytes) -> None:
        stats = self.wire[site]
        stats.datagrams_dropped += 1
        datagram = decode_datagram(data)
        if isinstance(datagram, ShardDatagram):
            stats.payload_dropped[datagram.msg_id] += len(datagram.data)

    def _record_arrived(self, receiver: str, data: bytes) -> None:
        datagram = decode_datagram(data)
        if isinstance(datagram, ShardDatagram) and datagram.msg_id not in self._held_msgs[receiver]:
            if datagram.msg_id in self.received[receiver]:
                return  # a late duplicate of a message already delivered
            self._held_msgs[receiver].add(datagram.msg_id)
            self.held_bytes[receiver] += datagram.msg_len
            self.max_held_bytes[receiver] = max(
                self.max_held_bytes[receiver], self.held_bytes[receiver]
            )

    # ------------------------------------------------------------------ views

    def events_of(self, site: str, kind: type[E]) -> list[E]:
        return [event for _, event in self.events[site] if isinstance(event, kind)]
