"""aioquic's pacer, paced by our controller, with a burst switch for critical data.

aioquic paces every packet at ``congestion_window / smoothed_rtt``, which makes the
window both the in-flight cap and the rate. BBR keeps the two apart (the window
~2 BDP, the rate ``gain x bandwidth``), and they must be apart here: with the rate
tied to the window, ProbeBW's 0.75 phase capped what was in flight below the path's
BDP and left it idle for part of every cycle, and the window's 64-datagram floor (CPU:
bursts per wake-up) paced a 5 Mbit/s path at 8 Mbit/s into its 50 ms queue. So when the
connection's controller offers a rate (``WangateCongestionControl.pacing_rate_bytes``),
the pacer uses it; otherwise it paces as aioquic does.

The bucket (what may leave back to back after a pause) makes up for wake-ups that come
late: paced exactly at the path's rate, a timer late by more than the bucket is sending
time lost for good (a loaded host's event loop is often late by several ms). So it
holds a quarter of the RTT of sending, at most ``BUCKET_MAX_S``; on short paths at least
aioquic's 16 datagrams (CPU), but on slow ones no more than ``BUCKET_SHORT_S`` of the
rate (16 datagrams are 38 ms at 5 Mbit/s, most of a shallow queue); never more than a
quarter of the window, never under 2 datagrams.

Critical data: a 64 KiB critical message on a path that only carries critical traffic
would be spread over a whole smoothed RTT although the bottleneck takes it in a few ms.
While critical data waits for this path, the link turns pacing off: the congestion
window still bounds what is in flight, and a burst of one message is well inside any
bottleneck buffer sized for the path's BDP. The burst's acks also show the controller
the path's real bottleneck rate, which paced, app-limited critical traffic never would.

Pure: aioquic passes ``now``.
"""

from __future__ import annotations

from typing import Protocol

from aioquic.quic.connection import QuicConnection
from aioquic.quic.recovery import K_MICRO_SECOND, K_SECOND, QuicPacketPacer

from wangate.net.aioquic_compat import congestion_control, pacer_datagram_size, replace_pacer

BUCKET_DATAGRAMS = 16  # aioquic's bucket (CPU: datagrams per wake-up on fast short paths)
BUCKET_SHORT_S = 0.004  # ... but no more than this much of a slow path's rate
BUCKET_MIN_DATAGRAMS = 2  # aioquic's floor
BUCKET_RTT_FRACTION = 0.25  # catch-up after a late wake-up: up to a quarter of the RTT...
BUCKET_MAX_S = 0.010  # ...and at most this


class RateSource(Protocol):
    def pacing_rate_bytes(self, smoothed_rtt_s: float) -> float | None: ...


class BurstablePacer(QuicPacketPacer):
    def __init__(self, *, max_datagram_size: int, rate_source: RateSource | None = None) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.burst = False  # set by the link while critical data waits for the path
        self.rate_source = rate_source
        self.pacing_rate_bytes = 0.0  # bytes per second, as last set

    # aioquic annotates this as float, but returns None whenever a packet may go now
    def next_send_time(self, now: float) -> float | None:  # type: ignore[override]
        if self.burst:
            return None
        return super().next_send_time(now)

    def update_after_send(self, now: float) -> None:
        if not self.burst:
            super().update_after_send(now)

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        source = self.rate_source
        rate = None if source is None else source.pacing_rate_bytes(smoothed_rtt)
        if rate is None:
            super().update_rate(congestion_window, smoothed_rtt)
            self.pacing_rate_bytes = congestion_window / max(smoothed_rtt, K_MICRO_SECOND)
            return
        size = pacer_datagram_size(self)
        rate = max(rate, size / K_SECOND)
        self.pacing_rate_bytes = rate
        self.packet_time = max(K_MICRO_SECOND, min(size / rate, K_SECOND))
        catch_up_s = min(BUCKET_RTT_FRACTION * smoothed_rtt, BUCKET_MAX_S)
        short = min(BUCKET_DATAGRAMS * size, BUCKET_SHORT_S * rate)
        bucket_bytes = min(congestion_window // 4, max(catch_up_s * rate, short))
        self.bucket_max = max(BUCKET_MIN_DATAGRAMS * size, bucket_bytes) / rate
        if self.bucket_time > self.bucket_max:
            self.bucket_time = self.bucket_max


def install_burstable_pacer(connection: QuicConnection) -> BurstablePacer:
    """Swap a fresh connection's pacer for a ``BurstablePacer`` paced by its controller
    when that controller offers a rate."""
    controller = congestion_control(connection)
    source = controller if hasattr(controller, "pacing_rate_bytes") else None

    def burstable(old: QuicPacketPacer) -> BurstablePacer:
        pacer = BurstablePacer(max_datagram_size=pacer_datagram_size(old), rate_source=source)
        pacer.bucket_max, pacer.bucket_time = old.bucket_max, old.bucket_time
        pacer.evaluation_time, pacer.packet_time = old.evaluation_time, old.packet_time
        return pacer

    return replace_pacer(connection, burstable)
