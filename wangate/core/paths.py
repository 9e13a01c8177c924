"""Per-path transport state: what we sent and await acks for, what we received and owe acks,
and the session's record of each path (``PathRecord``: connected, its state).

Loss detection follows RFC 9002 §6.1 on our own per-path sequence numbers: a datagram
is lost when one sent at least ``PACKET_THRESHOLD`` later was acknowledged, or when it
is older than 9/8 of the RTT while a later one was acknowledged. When no ack comes for a
retransmission timeout and another path is open, everything in flight past it is lost:
its repairs go where acks still come, and the path's run of losses marks it degraded.
On a path alone, the oldest ``RTO_DECLARES`` past it are declared lost and repaired (RFC 9002
§6.2.4 sends one or two probes; ours carry the repair), and the timeout doubles until
an ack comes: the repairs' acks then show by the thresholds what else was lost. There,
declaring everything lost would send a window of repairs the same way as the acks a
busy host or queue delayed past the timeout, for datagrams that had arrived.

A datagram declared lost that is acknowledged after all was not lost, only late (the
receiver's process was busy, or a queue grew). Then the timeout was too short: we raise
its floor to that lateness (Eifel/F-RTO in spirit, RFC 3522/5682) and let it decay.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Final

from wangate.core.estimator import PathEstimator
from wangate.core.frames import MAX_ACK_RANGES, STAMP_BITS, STAMP_UNIT_S, Ack, expand
from wangate.core.rangeset import RangeSet
from wangate.core.states import PATH_TRANSITIONS, PathStateKind, check_transition

PACKET_THRESHOLD: Final = 3  # RFC 9002 §6.1.1
TIME_THRESHOLD: Final = 9 / 8  # RFC 9002 §6.1.2
MAX_ACK_DELAY_S: Final = 0.005  # we ack at least this often while datagrams arrive
# Critical data is acked within this: soon enough for loss detection to matter to a
# message that lasts a few ms, late enough that one ack covers several datagrams (an
# ack per datagram was half of a receiving gateway's work).
CRITICAL_ACK_DELAY_S: Final = 0.001
# An ack at once when this many wait: below ~2 Gbit/s at 1452 B the 5 ms above comes
# first; above it each ack is a control-stream write that aioquic carries in a packet of
# its own each way (at 32, a fifth of both gateways' CPU at 1452-byte datagrams; at 256,
# about a tenth), while the data plane's own ACKs already pace the window.
ACK_EVERY_DATAGRAMS: Final = 1024
MIN_RTO_S: Final = 0.02
RECENTLY_LOST_MAX: Final = 4096  # lost datagrams remembered to notice a spurious loss
RTO_FLOOR_MAX_S: Final = 1.0
RTO_FLOOR_DECAY: Final = 0.999  # per ack without a spurious loss
RTO_DECLARES: Final = 2  # datagrams a retransmission timeout declares lost
RTO_BACKOFF_MAX: Final = 8  # the timeout doubles per expiry without an ack, up to this factor


# a path that carries little is still given this much in flight when sizing its tail
HORIZON_MIN_DATAGRAMS: Final = 64


def repair_horizon_bytes(sender: PathSender) -> int:
    """Bytes ``sender``'s path sends between a datagram's departure and the arrival of
    the repair for it, had it been lost: about what is in flight (rate x RTT, Little's
    law), stretched by the loss detection's wait (RFC 9002 §6.1.2: 9/8 of the RTT) and
    the receiver's ack delay."""
    est = sender.estimator
    inflight = max(est.bytes_in_flight, HORIZON_MIN_DATAGRAMS * sender.datagram_bytes)
    srtt_s = max(est.srtt_s, 0.001)
    return int(inflight * (TIME_THRESHOLD + MAX_ACK_DELAY_S / srtt_s))


@dataclass(init=False)
class SentDatagram:
    msg_id: int  # 0 for a probe
    start: int
    end: int
    sent_at: float
    size_bytes: int
    block: int = -1  # FEC block of a coded message (-1: none)
    symbol: int = -1  # index within that block

    def __init__(  # written, not generated: one per datagram, and mypyc compiles this one
        self,
        msg_id: int,
        start: int,
        end: int,
        sent_at: float,
        size_bytes: int,
        block: int = -1,
        symbol: int = -1,
    ) -> None:
        self.msg_id = msg_id
        self.start = start
        self.end = end
        self.sent_at = sent_at
        self.size_bytes = size_bytes
        self.block = block
        self.symbol = symbol


@dataclass
class PathSender:
    """Our side of a path as a sender: sequence numbers, in flight, loss detection."""

    name: str
    datagram_bytes: int  # largest DATAGRAM frame payload this path carries
    estimator: PathEstimator
    next_seq: int = 1
    largest_acked: int = 0
    inflight: dict[int, SentDatagram] = field(default_factory=dict)
    last_sent_at: float = 0.0
    back_at: float = 0.0  # when it was last heard again after being down
    recently_lost: dict[int, SentDatagram] = field(default_factory=dict)
    spurious_losses: int = 0
    rto_floor_s: float = MIN_RTO_S
    rto_backoff: int = 1  # doubled by each timeout that fires, back to 1 on an ack
    rto_fired_at: float = 0.0  # the next timeout counts from this or the datagram's sending

    def retransmission_timeout_s(self) -> float:
        est = self.estimator
        return max(1.5 * est.srtt_s + 4 * est.rttvar_s + MAX_ACK_DELAY_S, self.rto_floor_s)

    def record(self, sent: SentDatagram) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.inflight[seq] = sent
        self.last_sent_at = sent.sent_at
        self.estimator.on_sent(sent.size_bytes, sent.sent_at)
        return seq

    def acknowledge(self, ack: Ack, now: float) -> tuple[list[SentDatagram], list[SentDatagram]]:
        """Pop every datagram the ack covers: (in flight, declared lost before).

        Unknown sequence numbers are ignored.
        """
        acked: list[SentDatagram] = []
        late_acked: list[SentDatagram] = []
        inflight = self.inflight
        spurious = 0
        for first, last in ack.ranges:
            last = min(last, self.next_seq - 1)
            if last < first:
                continue
            # walk the range, or what we remember if that is less (a range may be huge)
            remembered = len(inflight) + len(self.recently_lost)
            if last - first + 1 <= remembered:
                seqs: list[int] | range = range(first, last + 1)
            else:
                seqs = [s for s in inflight if first <= s <= last]
                seqs += [s for s in self.recently_lost if first <= s <= last]
            for seq in seqs:
                sent = inflight.pop(seq, None)
                if sent is not None:
                    acked.append(sent)
                elif self.recently_lost:
                    late = self.recently_lost.pop(seq, None)
                    if late is not None and late.sent_at < self.back_at:
                        # swallowed by an outage; its ack waited behind it: no reordering
                        late_acked.append(late)
                    elif late is not None:
                        spurious += 1
                        late_acked.append(late)
                        self.estimator.on_spurious_loss(late.size_bytes, now)
                        lateness_s = now - late.sent_at
                        self.rto_floor_s = min(
                            max(self.rto_floor_s, 1.25 * lateness_s), RTO_FLOOR_MAX_S
                        )
            self.largest_acked = max(self.largest_acked, last)
        if acked:
            self.rto_backoff = 1
        if spurious:
            self.spurious_losses += spurious
        else:
            self.rto_floor_s = max(MIN_RTO_S, self.rto_floor_s * RTO_FLOOR_DECAY)
        return acked, late_acked

    def detect_lost(self, now: float, *, alone: bool = True) -> list[SentDatagram]:
        """What the thresholds and the timeout declare lost now; ``alone``: no other
        path is open (see the module notes)."""
        delay_s = self._reorder_delay_s()
        # In-flight datagrams are in sequence (and so sending) order: those lost by the
        # thresholds are a prefix, and the scan stops at the first one that is not lost.
        lost_seqs: list[int] = []
        timed_out = False
        for seq, sent in self.inflight.items():
            reordered_past = seq < self.largest_acked and (
                seq + PACKET_THRESHOLD <= self.largest_acked or sent.sent_at <= now - delay_s
            )
            if reordered_past:
                lost_seqs.append(seq)
                continue
            timed_out = self._timeout_at(sent) <= now
            break
        if timed_out:
            # those past the timeout themselves: all of them, or on a path alone the
            # oldest RTO_DECLARES
            first = len(lost_seqs)
            rest = itertools.islice(
                self.inflight.items(), first, first + RTO_DECLARES if alone else None
            )
            timeout_s = self._timeout_s()
            for seq, sent in rest:
                if max(sent.sent_at, self.rto_fired_at) + timeout_s > now:
                    break
                lost_seqs.append(seq)
            if alone:
                self.rto_fired_at = now
                self.rto_backoff = min(2 * self.rto_backoff, RTO_BACKOFF_MAX)
        return self._forget(lost_seqs)

    def _timeout_s(self) -> float:
        return self.retransmission_timeout_s() * self.rto_backoff

    def _timeout_at(self, oldest: SentDatagram) -> float:
        return max(oldest.sent_at, self.rto_fired_at) + self._timeout_s()

    def _reorder_delay_s(self) -> float:
        """How long after a later datagram's ack an earlier one counts as lost."""
        est = self.estimator
        return max(TIME_THRESHOLD * max(est.srtt_s, est.latest_rtt_s), 0.001)

    def _forget(self, seqs: list[int]) -> list[SentDatagram]:
        lost = []
        remembered = self.recently_lost
        for seq in seqs:
            sent = self.inflight.pop(seq)
            lost.append(sent)
            remembered[seq] = sent
        while len(remembered) > RECENTLY_LOST_MAX:
            del remembered[next(iter(remembered))]
        return lost

    def loss_deadline(self) -> float | None:
        if not self.inflight:
            return None
        oldest = next(iter(self.inflight.values()))
        deadline = self._timeout_at(oldest)
        if self.largest_acked > next(iter(self.inflight)):
            deadline = min(deadline, oldest.sent_at + self._reorder_delay_s())
        return deadline

    def take_all_inflight(self) -> list[SentDatagram]:
        return self._forget(list(self.inflight))

    def give_up(self, seqs: list[int]) -> list[SentDatagram]:
        """Stop waiting for these in-flight datagrams (their data goes elsewhere)."""
        return self._forget([seq for seq in seqs if seq in self.inflight])


@dataclass
class PathReceiver:
    """Our side of a path as a receiver: which sequence numbers we owe an ack for."""

    pending: RangeSet = field(default_factory=RangeSet)
    pending_count: int = 0
    newest_seq: int = 0
    newest_stamp: int = 0
    newest_received_at: float = 0.0
    clock_units: int = -1  # the newest sender stamp, unwrapped (-1: none yet)
    first_pending_at: float = 0.0
    ack_due_at: float | None = None  # the earliest any pending datagram wants its ack
    received_bytes: int = 0

    def on_datagram(self, seq: int, sent_stamp: int, now: float, ack_within_s: float) -> None:
        """Owe an ack for ``seq`` within ``ack_within_s``."""
        self.on_datagrams(seq, seq, sent_stamp, now, ack_within_s)

    def on_datagrams(
        self, seq_first: int, seq_last: int, last_stamp: int, now: float, ack_within_s: float
    ) -> None:
        """``on_datagram`` for each of ``seq_first`` .. ``seq_last``, sent in that order
        (the last sent at ``last_stamp``)."""
        if self.pending_count == 0:
            self.first_pending_at = now
        self.pending.add(seq_first, seq_last + 1)
        self.pending_count += seq_last - seq_first + 1
        if seq_last >= self.newest_seq:
            self.newest_seq = seq_last
            self.newest_stamp = last_stamp
            self.newest_received_at = now
        due_at = now + ack_within_s
        if self.ack_due_at is None or due_at < self.ack_due_at:
            self.ack_due_at = due_at

    def sender_clock_s(self, sent_stamp: int) -> float:
        """The sender's clock (seconds, its own epoch) at ``sent_stamp``: the wrapping
        stamp unwrapped against the newest heard on this path (RFC 9000 Appendix A.3)."""
        if self.clock_units < 0:
            units = sent_stamp
        else:
            units = expand(sent_stamp, STAMP_BITS, self.clock_units)
        self.clock_units = max(self.clock_units, units)
        return units * STAMP_UNIT_S

    def ack_deadline(self) -> float | None:
        if self.pending_count == 0:
            return None
        if self.pending_count >= ACK_EVERY_DATAGRAMS:
            return self.first_pending_at
        return self.ack_due_at

    def take_ack(self, now: float) -> Ack | None:
        deadline = self.ack_deadline()
        if deadline is None or deadline > now:
            return None
        ranges = [(start, end - 1) for start, end in self.pending.ranges()]
        if len(ranges) > MAX_ACK_RANGES:
            # ack the newest ranges now; the rest stay pending for the next ack
            keep = ranges[: len(ranges) - MAX_ACK_RANGES]
            ranges = ranges[len(ranges) - MAX_ACK_RANGES :]
            self.pending.clear()
            for first, last in keep:
                self.pending.add(first, last + 1)
            self.pending_count = sum(last - first + 1 for first, last in keep)
        else:
            self.pending.clear()
            self.pending_count = 0
        if self.pending_count == 0:
            self.ack_due_at = None
        delay_us = int(max(0.0, now - self.newest_received_at) * 1e6)
        return Ack(self.newest_stamp, delay_us, tuple(ranges))


@dataclass
class PathRecord:
    """Everything the session knows of one path, in one place.

    ``connected``: the shell reported the path's connection up (``path_up``) and not
    since down; ``state``/``why``: what was last reported as ``PathStateChanged``.
    """

    sender: PathSender
    receiver: PathReceiver
    connected: bool = True
    state: PathStateKind = PathStateKind.UP
    why: str = "connected"
    probe_heard_at: float = -math.inf  # the peer's last keep-alive probe on this path

    @property
    def usable(self) -> bool:
        """Not declared down: neither closed nor silent past its timeout."""
        return self.state != PathStateKind.DOWN

    @property
    def open(self) -> bool:
        """May carry data now."""
        return self.usable and self.connected

    def move(self, name: str, state: PathStateKind, why: str) -> bool:
        """The path is ``state`` for ``why`` from now on; whether that changes its state
        (``PATH_TRANSITIONS``)."""
        changed = check_transition(PATH_TRANSITIONS, self.state, state, f"path {name}")
        self.state, self.why = state, why
        return changed
