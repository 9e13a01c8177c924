"""aioquic's pacer with a burst switch: critical data leaves at once, within the window.

aioquic paces every packet at ``congestion_window / smoothed_rtt``. That is right for
bulk, but a 64 KiB critical message on a path that only carries critical traffic is then
spread over a whole smoothed RTT (tens of ms with a busy receiver) although the
bottleneck would take it in a few ms. While critical data waits for this path, the link
turns pacing off: the congestion window still bounds what is in flight, and a burst of
one message is well inside any bottleneck buffer sized for the path's BDP. The burst's
acks also show the controller the path's real bottleneck rate, which paced, app-limited
critical traffic never would.

When the bucket is empty, aioquic wakes up again after one packet's time, so a busy
path sends one datagram per timer and per system call (about 13 000 a second at
150 Mbit/s). This pacer waits for a quantum instead: at least ``PACING_QUANTUM_S`` of
sending (never more than the bucket holds), like Linux's fq and TSO autosizing, so each
wake-up sends a few datagrams at once, which the link hands the kernel in one segmented
batch (net/batching.py). The average rate is unchanged; bursts grow to about 1 ms of
data (6 datagrams at 50 Mbit/s), far inside any queue sized for a WAN path.

Pure: aioquic passes ``now``.
"""

from __future__ import annotations

from aioquic.quic.recovery import QuicPacketPacer, QuicPacketRecovery

PACING_QUANTUM_S = 0.001


class BurstablePacer(QuicPacketPacer):
    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.burst = False  # set by the link while critical data waits for the path

    # aioquic annotates this as float, but returns None whenever a packet may go now
    def next_send_time(self, now: float) -> float | None:  # type: ignore[override]
        if self.burst or self.packet_time is None:
            return None
        self.update_bucket(now=now)
        if self.bucket_time > 0:
            return None
        return now + min(self.bucket_max, max(self.packet_time, PACING_QUANTUM_S))

    def update_after_send(self, now: float) -> None:
        if not self.burst:
            super().update_after_send(now)


def install_burstable_pacer(recovery: QuicPacketRecovery) -> BurstablePacer:
    """Swap a fresh connection's pacer for a ``BurstablePacer`` (aioquic 1.7.2 internals)."""
    old = recovery._pacer
    pacer = BurstablePacer(max_datagram_size=old._max_datagram_size)
    pacer.bucket_max, pacer.bucket_time = old.bucket_max, old.bucket_time
    pacer.evaluation_time, pacer.packet_time = old.evaluation_time, old.packet_time
    recovery._pacer = pacer
    return pacer
