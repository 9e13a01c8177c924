"""aioquic's pacer with a burst switch: critical data leaves at once, within the window.

aioquic paces every packet at ``congestion_window / smoothed_rtt``. That is right for
bulk, but a 64 KiB critical message on a path that only carries critical traffic is then
spread over a whole smoothed RTT (tens of ms with a busy receiver) although the
bottleneck would take it in a few ms. While critical data waits for this path, the link
turns pacing off: the congestion window still bounds what is in flight, and a burst of
one message is well inside any bottleneck buffer sized for the path's BDP. The burst's
acks also show the controller the path's real bottleneck rate, which paced, app-limited
critical traffic never would.

Pure: aioquic passes ``now``.
"""

from __future__ import annotations

from aioquic.quic.connection import QuicConnection
from aioquic.quic.recovery import QuicPacketPacer

from wangate.net.aioquic_compat import replace_pacer


class BurstablePacer(QuicPacketPacer):
    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.burst = False  # set by the link while critical data waits for the path

    # aioquic annotates this as float, but returns None whenever a packet may go now
    def next_send_time(self, now: float) -> float | None:  # type: ignore[override]
        if self.burst:
            return None
        return super().next_send_time(now)

    def update_after_send(self, now: float) -> None:
        if not self.burst:
            super().update_after_send(now)


def install_burstable_pacer(connection: QuicConnection) -> BurstablePacer:
    """Swap a fresh connection's pacer for a ``BurstablePacer``."""

    def burstable(old: QuicPacketPacer) -> BurstablePacer:
        pacer = BurstablePacer(max_datagram_size=old._max_datagram_size)
        pacer.bucket_max, pacer.bucket_time = old.bucket_max, old.bucket_time
        pacer.evaluation_time, pacer.packet_time = old.evaluation_time, old.packet_time
        return pacer

    return replace_pacer(connection, burstable)
