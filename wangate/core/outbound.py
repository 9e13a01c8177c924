"""Messages on their way out: which bytes still need sending, which are acknowledged.

Work is pulled: a path that can send asks ``OutboundQueue.take(max_bytes)`` for the
next piece. Repairs come before new bytes, critical messages before bulk ones, older
messages before newer ones; between jobs, weighted turns decide (``JobFairQueue``, which
also bounds one job's critical against the others' bulk). Nothing is ever resent whole.

A coded message (``CodingShape``, see wangate.core.coding) is sent as FEC blocks: each
block's source symbols, then its repair symbols; a loss is answered with fresh repair
symbols for that block only, as many as it still lacks. An uncoded message (or a block
whose repair was requested) repairs a loss as exactly the byte range that was lost.

Repair symbols are sent up front only where a round trip would cost more time than they
do (``round_trip_costs``): critical messages, blocks that end within ``tail_bytes`` of
the end of all queued bulk work (a loss there would be found and repaired only after
everything behind it was sent, the paths idle meanwhile), and a message's own tail when
the round trip it saves that message outweighs the delay the symbols add to the
messages queued behind it. In the middle of a
long transfer a loss is repaired after it is seen: that costs the bytes lost and no
time, while repair symbols sized for a residual block loss of 1e-3 cost several times
the loss rate on every block.

A message stays here until the receiver confirms it verified it (``MessagesDone``):
acknowledged symbols say the bytes arrived, not that the message checked out.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass
from typing import Final

from wangate.core.coding import BlockLedger, CodingShape
from wangate.core.fairqueue import Helps, JobFairQueue
from wangate.core.fec import MAX_SYMBOLS, parity_for_loss
from wangate.core.jobs import JobPolicy
from wangate.core.outbound_message import OutboundMessage, Piece
from wangate.core.paths import PathSender, repair_horizon_bytes


@dataclass(frozen=True)
class CodingPolicy:
    """FEC settings: ``k`` source symbols per block (0: no FEC), repair symbols bounds."""

    k: int = 64
    min_repair: int = 0
    max_repair: int = 16
    # a critical message's blocks get at least this many, so that one lost datagram
    # costs no round trip before the route's loss shows in the estimates
    critical_min_repair: int = 2


UNKNOWN_TAIL_BYTES: Final = 1 << 62


def _no_header(msg_len: int, k: int, datagram_bytes: int) -> int:
    return 0


class OutboundQueue:
    """Messages started (admitted by the peer's credit) and not yet confirmed done."""

    def __init__(self, coding: CodingPolicy | None = None) -> None:
        self.coding = coding or CodingPolicy()
        self.messages: dict[int, OutboundMessage] = {}
        # messages with work, per job and class, served fairly between jobs
        self.work: JobFairQueue[OutboundMessage] = JobFairQueue()
        self.repair_bytes = 0  # cumulative bytes sent again (range repairs)
        self.fec_bytes = 0  # cumulative repair-symbol bytes
        self.source_bytes = 0  # cumulative first-time bytes
        self.bulk_backlog_bytes = 0  # bulk bytes still to send (new and repairs)
        # datagram space for newly started coded messages' symbols and their headers (0: no
        # FEC); the symbol is this less the message's header_bytes
        self.symbol_bytes = 0
        # the largest datagram an open path carries (the session sets it): repair symbols
        # of a message cut for a larger one go as byte ranges of its sources instead
        self.largest_datagram_bytes = sys.maxsize
        # the most header bytes a datagram of a message takes: (msg_len, k, datagram
        # bytes) -> bytes, k and datagram bytes 0 for an uncoded one; the session sets
        # the wire's (frames.message_header_bytes), and take() sizes pieces by it
        self.header_bytes: Callable[[int, int, int], int] = _no_header
        self.repair_count = 0  # repair symbols per block where a round trip costs time
        # bytes the paths send while a loss is found and its repair arrives; the session
        # sets it from the paths (until then every block counts as a tail)
        self.tail_bytes = UNKNOWN_TAIL_BYTES
        self.loss_rate = 0.0  # random loss per datagram that repair_count was sized for
        # messages submitted and not yet started (the session's Outbox.waiting): they
        # queue behind every message started
        self.waiting: Sized = ()
        self.fec_upfront_bytes = 0  # repair symbols sent with their block (of fec_bytes)
        self.fec_upfront_blocks = 0  # blocks that got repair symbols up front
        self.fec_mid_blocks = 0  # bulk blocks left to repair after loss (no round trip cost)
        self.repairs_unneeded = 0  # repair symbols dropped before sending: a late ack came
        self.ranges_resent = 0  # RangesMissing frames honoured

    def add(self, message: OutboundMessage) -> None:
        self.messages[message.msg_id] = message
        message.header_bytes = self.header_bytes(message.body_len, 0, 0)
        self._add_backlog(message, message.body_len)
        self._enqueue(message)

    def adapt_coding(self, senders: list[PathSender]) -> None:
        """To the open paths' senders: symbol size fits every one; repair count follows
        the measured loss, and where it is spent (``round_trip_costs``) what the paths
        send while a loss is found and repaired."""
        policy = self.coding
        if not policy.k or not senders:
            self.symbol_bytes = 0
            return
        self.symbol_bytes = min(s.datagram_bytes for s in senders)  # less each one's header
        self.largest_datagram_bytes = max(s.datagram_bytes for s in senders)
        # random loss seen by a block spread over the paths in proportion to their rates
        rates = [s.estimator.planning_rate_bps for s in senders]
        # declared: mypy infers float | Literal[0] for this sum, which the compiled core
        # (mypyc) divides as an int
        loss: float = sum(
            s.estimator.random_loss_rate * r for s, r in zip(senders, rates, strict=True)
        )
        loss /= sum(rates)
        self.repair_count = parity_for_loss(
            loss, policy.k, floor=policy.min_repair, ceiling=policy.max_repair
        )
        self.loss_rate = loss
        self.tail_bytes = sum(repair_horizon_bytes(s) for s in senders)

    def set_policies(self, policies: Mapping[str, JobPolicy]) -> None:
        self.work.set_policies(policies)

    def _enqueue(self, message: OutboundMessage) -> None:
        if not message.queued and message.has_work:
            message.queued = True
            # back for repairs: ahead of its job's newer messages' new bytes, or the
            # repair (and the message) would wait until they were all sent
            self.work.push(message, front=bool(message.next_offset))

    def has_work(self) -> bool:
        return self.work.has_work

    @property
    def has_critical_work(self) -> bool:
        return self.work.has_critical_work

    @property
    def has_bulk_work(self) -> bool:
        return self.work.has_bulk_work

    def take(
        self,
        max_bytes: int,
        *,
        critical: bool,
        path: str | None = None,
        route: str | None = None,
        helps: Helps | None = None,
    ) -> Piece | None:
        """The next critical (or bulk) piece for ``path`` whose datagram, header
        included, takes at most ``max_bytes``, if any: jobs in turn (``JobFairQueue``),
        each job's messages in order; a message with only repair symbols larger than
        this path's datagrams left (a smaller path joined after it was cut) is left to
        the others."""
        return self.work.take(
            self._take_from, max_bytes, critical=critical, path=path, route=route, helps=helps
        )

    def _take_from(self, message: OutboundMessage, space: int) -> Piece | None:
        if message.repair_work and self._fits_no_path(message):
            self._repair_by_range(message)
        max_bytes = space - message.header_bytes
        while message.repairs:
            start, end = message.repairs.popleft()
            gap = message.acked.first_gap(start, end)
            if gap is None:
                self._add_backlog(message, start - end)
                continue  # acknowledged after all (a late ack beat the repair)
            self._add_backlog(message, start - gap[0])
            start, gap_end = gap
            if gap_end < end:
                message.repairs.appendleft((gap_end, end))
            end = min(gap_end, start + max_bytes)
            if end < gap_end:
                message.repairs.appendleft((end, gap_end))
            self.repair_bytes += end - start
            self._add_backlog(message, start - end)
            return Piece(message, start, end, True)
        fits = message.shape is not None and message.shape.symbol_bytes <= max_bytes
        while message.repair_work and fits:
            piece = self._repair_symbol(message)
            if piece is not None:
                return piece
        if message.next_offset < message.body_len:
            return self._new_piece(message, space)
        return None

    def take_next(self, message: OutboundMessage, path: str, space: int) -> tuple[int, int, int]:
        """(end, block, index) of the next piece of ``message`` for ``path`` if the next
        bulk ``take`` would cut it from its new bytes right after the last one (no
        repairs waiting), else (0, -1, -1) and nothing is taken. What ``take`` would do
        for that piece is done, at a fraction of its cost: a path sending a stripe asks
        this once per datagram."""
        start = message.next_offset
        shape = message.shape
        if (
            start >= message.body_len
            or message.repairs
            or message.repair_work
            or (shape is None and self.coding.k and self.symbol_bytes)  # not cut yet
            or (shape is not None and shape.symbol_bytes > space - message.header_bytes)
            or not self.work.served_next(message, path)
        ):
            return 0, -1, -1
        start, end, block, index = self._cut(message, space)
        self.work.charge_next(message, path, end - start)
        return end, block, index

    def _fits_no_path(self, message: OutboundMessage) -> bool:
        shape = message.shape
        assert shape is not None
        return shape.symbol_bytes + message.header_bytes > self.largest_datagram_bytes

    def _repair_by_range(self, message: OutboundMessage) -> None:
        """No open path carries the message's symbols any more (its path reconnected with
        less room, e.g. as the other end's dial, whose connection ID is longer): a block
        whose loss awaits repair symbols gets its missing sources again by range, and
        repair symbols meant to go with their block are dropped."""
        for work in message.repair_work:
            block, upfront = work >> 1, bool(work & 1)
            ledger = message.blocks.get(block)
            if ledger is None:
                continue  # decodable meanwhile
            ledger.queued -= 1
            if not upfront and ledger.coded:
                self._uncode(message, ledger, block)
        message.repair_work.clear()

    def _uncode(self, message: OutboundMessage, ledger: BlockLedger, block: int) -> None:
        """From now on ``block`` is repaired by range: its missing sources go again."""
        assert message.shape is not None
        ledger.coded = False
        start, end = message.shape.block_range(block)
        if not message.acked.covers(start, end):
            message.repairs.append((start, end))
            self._add_backlog(message, end - start)

    def _new_piece(self, message: OutboundMessage, space: int) -> Piece:
        start, end, block, index = self._cut(message, space)
        return Piece(message, start, end, False, block, index)

    def _cut(self, message: OutboundMessage, space: int) -> tuple[int, int, int, int]:
        """The message's next new bytes for a datagram of ``space`` bytes: (start, end,
        block, index), block and index -1 for bytes that count for no coded block."""
        start = message.next_offset
        k = self.coding.k
        if message.shape is None and k and self.symbol_bytes:
            header = self.header_bytes(message.body_len, k, self.symbol_bytes)
            message.header_bytes = max(message.header_bytes, header)
            symbol = self.symbol_bytes - message.header_bytes
            message.shape = CodingShape(message.body_len, symbol, k)
        max_bytes = space - message.header_bytes
        shape = message.shape
        if shape is None:
            end = min(message.body_len, start + max_bytes)
            message.next_offset = end
            self._add_backlog(message, start - end)
            self.source_bytes += end - start
            return start, end, -1, -1
        block = shape.block_of(start)
        index = start // shape.symbol_bytes - block * shape.k
        symbol_start, symbol_end = shape.symbol_range(block, index)
        message.next_offset = symbol_end
        # only [start, symbol_end) leaves the backlog: a message begun before any path's
        # size was known went uncut, and its first symbol repeats the bytes before start
        self._add_backlog(message, start - symbol_end)
        self.source_bytes += symbol_end - symbol_start
        if symbol_end - symbol_start > max_bytes:
            # this path cannot carry a whole symbol: send part, queue the rest as a range
            message.repairs.append((start + max_bytes, symbol_end))
            self._add_backlog(message, symbol_end - start - max_bytes)
            return start, start + max_bytes, -1, -1
        ledger = message.ledger(block)
        ledger.inflight += 1
        if index == shape.block_k(block) - 1:  # the block's sources are all out
            if self.round_trip_costs(message, symbol_end):
                count = self.repair_count
                if message.critical:
                    count = max(count, self.coding.critical_min_repair)
                self.fec_upfront_blocks += count > 0
            else:
                count = self.coding.min_repair
                self.fec_mid_blocks += 1
            self._queue_repairs(message, block, count, upfront=True)
        return symbol_start, symbol_end, block, index

    def round_trip_costs(self, message: OutboundMessage, block_end: int) -> bool:
        """Whether a loss in the block ending at byte ``block_end`` would cost a round
        trip worth more than repair symbols sent with the block.

        It would for critical data (latency is the point), and for a block within
        ``tail_bytes`` of the end of all bulk work queued (the paths would idle while
        the repair is due: the end of a transfer, or of the receiver's credit window).
        A block within ``tail_bytes`` of its message's end costs that message a round
        trip, which is weighed against the delay the symbols add to the messages
        queued behind it (``_tail_repair_pays``). Elsewhere the repair of a loss
        travels while the rest of the message does, and costs no time.
        """
        if message.critical:
            return True
        tail = self.tail_bytes
        if self.bulk_backlog_bytes < tail:
            return True
        if message.body_len - block_end >= tail:
            return False
        if message.tail_upfront is None:  # once: half a tail protected buys nothing
            message.tail_upfront = self._tail_repair_pays(message)
        return message.tail_upfront

    def _tail_repair_pays(self, message: OutboundMessage) -> bool:
        """Whether repair symbols up front on ``message``'s tail save the messages more
        time than they cost them, in total.

        They save ``message`` a round trip (the paths' time for ``tail_bytes``) with the
        chance that its tail loses a datagram, p. They cost ``repair_count / k`` of the
        tail's time to it and to every message queued behind it (n in all). They pay
        when p x tail > n x tail x repair_count / k, i.e. n < p x k / repair_count: a
        message sent alone (n = 1) nearly always; of a batch of bulk messages handed
        over at once only the last few (about 15 at 1 % loss, 5 at 5 %): the others'
        repairs travel while the next message keeps the paths busy.
        """
        count = self.repair_count
        if not count:
            return True  # nothing to spend
        datagrams = self.tail_bytes // max(self.symbol_bytes, 1)
        tail_loss = 1.0 - (1.0 - min(self.loss_rate, 1.0)) ** max(datagrams, 1)
        limit = tail_loss * self.coding.k / count
        queued = 1 + len(self.waiting)
        for other in self.work.messages(critical=False):
            if queued >= limit:
                return False
            queued += other is not message and other.next_offset == 0
        return queued < limit

    def _repair_symbol(self, message: OutboundMessage) -> Piece | None:
        work = message.repair_work.popleft()
        block, upfront = work >> 1, bool(work & 1)
        shape = message.shape
        ledger = message.blocks.get(block)
        if ledger is None or shape is None:
            return None  # the block became decodable meanwhile
        ledger.queued -= 1
        if not ledger.coded:
            return None
        if not upfront and ledger.shortfall(shape, block, message.acked) <= 0:
            # it answered a loss that a late ack took back: what arrived, what is in
            # flight and the other symbols queued make k without it
            self.repairs_unneeded += 1
            return None
        index = ledger.next_repair
        ledger.next_repair += 1
        ledger.inflight += 1
        self.fec_bytes += shape.symbol_bytes
        if upfront:
            self.fec_upfront_bytes += shape.symbol_bytes
        return Piece(message, 0, 0, True, block, index)

    def repair_symbol_data(self, piece: Piece) -> bytes:
        """The symbol's bytes; those still queued for its block (the next indices) are
        computed in the same pass over the sources, a fraction of one pass each."""
        message = piece.message
        encoder = message.encoder(piece.block)
        ledger = message.blocks.get(piece.block)
        ahead = 0 if ledger is None else max(0, ledger.queued)
        last = min(piece.symbol + 1 + ahead, MAX_SYMBOLS)
        return encoder.repairs(range(piece.symbol, last))[0]

    def _queue_repairs(
        self, message: OutboundMessage, block: int, count: int, *, upfront: bool = False
    ) -> None:
        ledger = message.ledger(block)
        count = min(count, MAX_SYMBOLS - ledger.next_repair - ledger.queued)
        if count > 0:
            ledger.queued += count
            # one entry per symbol: the block, and whether it goes with its block (1) or
            # answers a loss (0)
            message.repair_work.extend([block << 1 | upfront] * count)
            self._enqueue(message)

    def _add_backlog(self, message: OutboundMessage, size_bytes: int) -> None:
        if not message.critical:
            self.bulk_backlog_bytes += size_bytes

    # ---------------------------------------------------------------- outcomes

    def mark_lost(self, msg_id: int, start: int, end: int, block: int, symbol: int) -> None:
        message = self.messages.get(msg_id)
        if message is None:
            return
        shape = message.shape
        ledger = message.blocks.get(block) if block >= 0 else None
        if shape is not None and ledger is not None and ledger.coded:
            ledger.inflight -= 1
            missing = ledger.shortfall(shape, block, message.acked)
            if missing <= 0:
                return  # enough symbols are still on their way
            if ledger.can_add_repairs(ledger.queued + missing):
                self._queue_repairs(message, block, missing)
            else:  # out of repair symbols: fall back to the lost bytes
                self._uncode(message, ledger, block)
                self._enqueue(message)
            return
        if end <= start or message.acked.covers(start, end):
            return
        message.repairs.append((start, end))
        self._add_backlog(message, end - start)
        self._enqueue(message)

    def mark_acked(
        self,
        msg_id: int,
        start: int,
        end: int,
        block: int,
        symbol: int,
        now: float,
        *,
        declared_lost: bool = False,
        symbols: int = 1,
    ) -> None:
        """A piece arrived; ``declared_lost``: after ``mark_lost`` took it out of flight.
        ``symbols``: a run of that many coded symbols of ``block`` from ``symbol`` on,
        their bytes [start, end) together (an ack's run), as one call each would."""
        message = self.messages.get(msg_id)
        if message is None:
            return
        if end > start:
            message.acked.add(start, end)
        shape = message.shape
        ledger = message.blocks.get(block) if block >= 0 else None
        if block < 0:
            message.range_acked(start, end)
        elif shape is not None and ledger is not None:
            if not declared_lost:
                ledger.inflight -= symbols
            block_k = shape.block_k(block)
            for index in range(symbol, symbol + symbols):
                if index >= block_k:
                    ledger.acked_repairs.add(index)
                else:
                    ledger.source_acked(index)
            if ledger.coded and ledger.have(shape, block, message.acked) >= block_k:
                # any k symbols rebuild the block at the receiver
                message.acked.add(*shape.block_range(block))
                del message.blocks[block]
        done_sending = message.next_offset >= message.body_len and not message.repairs
        if message.acked_at is None and done_sending and message.complete:
            message.acked_at = now
            message.had_every_byte = True

    def repair_blocks(self, msg_id: int, blocks: tuple[int, ...]) -> bool:
        """The receiver could not verify rebuilt blocks: resend their sources by range."""
        message = self.messages.get(msg_id)
        if message is None or message.shape is None:
            return False
        shape = message.shape
        for block in blocks:
            if block >= shape.blocks:
                continue
            start, end = shape.block_range(block)
            message.acked.remove(start, end)
            # no repair symbols for it: its sources go again by range
            message.blocks[block] = BlockLedger(next_repair=MAX_SYMBOLS, coded=False)
            message.repairs.append((start, end))
            self._add_backlog(message, end - start)
        message.acked_at = None
        message.had_every_byte = False  # the receiver could not verify it: not whole there
        self._enqueue(message)
        return True

    def resend_ranges(self, msg_id: int, ranges: tuple[tuple[int, int], ...]) -> bool:
        """The receiver lacks these ranges of a message counted as acknowledged (its
        answer to a poke): they count as unacknowledged and go again by range, and the
        blocks they touch are repaired by range from now on. Bytes never sent yet and
        ranges past the end are left alone."""
        message = self.messages.get(msg_id)
        if message is None:
            return False
        shape = message.shape
        for start, stop in ranges:
            end = min(stop, message.next_offset)
            if end <= start:
                continue
            message.acked.remove(start, end)
            if shape is not None:
                for block in range(shape.block_of(start), shape.block_of(end - 1) + 1):
                    ledger = message.blocks.get(block)
                    if ledger is None:  # counted decodable: no more symbols for it
                        message.blocks[block] = BlockLedger(next_repair=MAX_SYMBOLS, coded=False)
                    else:
                        ledger.coded = False
            message.repairs.append((start, end))
            self._add_backlog(message, end - start)
        message.acked_at = None
        message.had_every_byte = False  # the receiver says it is not whole there
        self.ranges_resent += 1
        self._enqueue(message)
        return True

    def poke(self, msg_id: int) -> None:
        """Resend one byte of a message whose confirmation is overdue, to ask again."""
        message = self.messages.get(msg_id)
        if message is not None:
            message.repairs.append((0, 1))
            message.acked.remove(0, 1)
            ledger = message.blocks.get(0)
            if ledger is not None:
                ledger.count_by_range(0)
            message.acked_at = None
            self._add_backlog(message, 1)
            self._enqueue(message)

    def done(self, msg_id: int) -> OutboundMessage | None:
        """The receiver verified the message."""
        return self.drop(msg_id)

    def drop(self, msg_id: int) -> OutboundMessage | None:
        message = self.messages.pop(msg_id, None)
        if message is not None:
            backlog = (message.body_len - message.next_offset) + sum(
                end - start for start, end in message.repairs
            )
            self._add_backlog(message, -backlog)
            message.repairs.clear()
            message.repair_work.clear()
            message.blocks.clear()
            message.next_offset = message.body_len
        return message

    def clear(self, keep_whole: bool = False) -> list[OutboundMessage]:
        """Drop every message, or (``keep_whole``) every one but those the peer had
        every byte of; returns those dropped."""
        dropped = [m for m in self.messages.values() if not (keep_whole and m.had_every_byte)]
        for message in dropped:
            self.drop(message.msg_id)
        if not self.messages:
            self.work.clear()  # else the work list skips the dropped ones as it meets them
        return dropped
