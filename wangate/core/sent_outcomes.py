"""What became of the datagrams a path carried: acknowledged, or lost.

Part of the ``Sender`` (wangate.core.sending), whose path table and queue it shares: an
ack times the path and tells the queue which bytes arrived; what a path lost (or
swallowed in an outage) is counted against it and queued to go again, on any path.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from wangate.core.frames import Ack, stamp_age_s
from wangate.core.outbound import OutboundQueue
from wangate.core.paths import PathRecord, SentDatagram
from wangate.core.selector import CriticalPathSelector


class SentOutcomes:
    def __init__(
        self, paths: dict[str, PathRecord], queue: OutboundQueue, selector: CriticalPathSelector
    ) -> None:
        self._paths = paths  # the session's, shared
        self.queue = queue
        self._selector = selector

    def requeue(
        self, record: PathRecord, lost: Iterable[SentDatagram], *, outage: bool = False
    ) -> None:
        """Send elsewhere what ``record``'s path lost (or swallowed in an outage)."""
        sender = record.sender
        estimator = sender.estimator
        for sent in lost:
            if outage or not record.usable or sent.sent_at < sender.back_at:  # the outage
                estimator.on_abandoned(sent.size_bytes, sent.sent_at)
            else:
                estimator.on_lost(sent.size_bytes, sent.sent_at)
            if sent.msg_id:
                self.queue.mark_lost(sent.msg_id, sent.start, sent.end, sent.block, sent.symbol)

    def on_ack(self, path: str, ack: Ack, now: float) -> None:
        record = self._paths.get(path)
        if record is None:
            return
        sender = record.sender
        est = sender.estimator
        acked, late_acked = sender.acknowledge(ack, now)
        if acked:
            # Only an ack of something still in flight times the path (RFC 9002 §5.1):
            # one of datagrams given up long ago may have waited out an outage behind
            # lost stream data, and a sample of seconds would hold the path back.
            rtt_s = stamp_age_s(now, ack.echo_stamp)
            if 0.0 < rtt_s < 60.0:
                est.on_rtt_sample(rtt_s, now, ack_delay_s=ack.ack_delay_us / 1e6)
            self._selector.record_probe_ok(path, now)
            acked_bytes = 0
            newest_sent_at = -math.inf
            for sent in acked:
                acked_bytes += sent.size_bytes
                if sent.sent_at > newest_sent_at:
                    newest_sent_at = sent.sent_at
            est.on_acked(acked_bytes, now, sent_at=newest_sent_at, datagrams=len(acked))
            self._mark_acked(acked, now)
        for sent in late_acked:
            if sent.msg_id:
                self.queue.mark_acked(
                    sent.msg_id,
                    sent.start,
                    sent.end,
                    sent.block,
                    sent.symbol,
                    now,
                    declared_lost=True,
                )
        self.requeue(record, sender.detect_lost(now, alone=self.alone(path)))

    def _mark_acked(self, acked: list[SentDatagram], now: float) -> None:
        """Tell the queue what arrived: a run of plain pieces that follow each other in
        one message (an in-order ack's usual shape) as one range, and a run of coded
        symbols that follow each other in one block as one call. Marking is a union, so
        the run's result is the pieces'."""
        msg_id = start = end = count = 0  # the run: count pieces, [start, end) of msg_id
        block = symbol = -1
        for sent in acked:
            if not sent.msg_id:
                continue
            if (
                count
                and sent.msg_id == msg_id
                and sent.start == end
                and sent.block == block
                and (block < 0 or sent.symbol == symbol + count)
            ):
                end = sent.end
                count += 1
                continue
            if count:
                self._mark_run(msg_id, start, end, block, symbol, count, now)
            msg_id, start, end = sent.msg_id, sent.start, sent.end
            block, symbol, count = sent.block, sent.symbol, 1
        if count:
            self._mark_run(msg_id, start, end, block, symbol, count, now)

    def _mark_run(
        self, msg_id: int, start: int, end: int, block: int, symbol: int, count: int, now: float
    ) -> None:
        symbols = count if block >= 0 else 1  # a plain run names no symbols
        self.queue.mark_acked(msg_id, start, end, block, symbol, now, symbols=symbols)

    def alone(self, path: str) -> bool:
        """Whether no path but ``path`` may carry data now."""
        return not any(r.open for n, r in self._paths.items() if n != path)
