"""How one message is cut into FEC blocks, and what each block still needs.

A coded message is cut into symbols of ``symbol_bytes`` (the last one short) and the
symbols into blocks of ``k``. Source symbols travel as ordinary shards; each block
gets ``m`` repair symbols right after its sources, ``m`` chosen from the measured loss
(``parity_for_loss``). A block is *decodable* once any ``k_b`` of its symbols arrived;
when losses leave a block short, exactly the missing number of fresh repair symbols is
sent (never the lost ones, and never anything of other blocks).

Sender and receiver each keep one ``BlockLedger``/``BlockDecoder`` per block that is
still open: state is per block in flight, not per byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wangate.core.buffer import Buffer
from wangate.core.fec import MAX_SYMBOLS, BlockDecoder, BlockEncoder
from wangate.core.rangeset import RangeSet


@dataclass(frozen=True)
class CodingShape:
    """The symbol grid of one message."""

    body_len: int
    symbol_bytes: int
    k: int

    @property
    def symbols(self) -> int:
        return -(-self.body_len // self.symbol_bytes)

    @property
    def blocks(self) -> int:
        return -(-self.symbols // self.k)

    def block_of(self, offset: int) -> int:
        return offset // self.symbol_bytes // self.k

    def block_k(self, block: int) -> int:
        return min(self.k, self.symbols - block * self.k)

    def block_range(self, block: int) -> tuple[int, int]:
        span = self.k * self.symbol_bytes
        return block * span, min(self.body_len, (block + 1) * span)

    def symbol_range(self, block: int, index: int) -> tuple[int, int]:
        start = (block * self.k + index) * self.symbol_bytes
        return start, min(self.body_len, start + self.symbol_bytes)


@dataclass
class BlockLedger:
    """The sender's view of one block: what is acked, in flight, and queued.

    ``have`` runs on every ack, so sources are counted from ``acked_sources`` (each
    index acked by its own piece) rather than by scanning the block's byte ranges.
    A source whose bytes were acked or un-acked any other way (a symbol split over
    small datagrams, a range repair, a poke) is moved to ``by_range`` and counted from
    the message's acked ranges. A ledger that is no longer ``coded`` counts every
    source from the ranges.
    """

    acked_repairs: set[int] = field(default_factory=set)
    acked_sources: set[int] = field(default_factory=set)  # never shares an index with by_range
    by_range: set[int] = field(default_factory=set)  # sources counted from the acked ranges
    inflight: int = 0  # symbols of this block on the wire now
    queued: int = 0  # repair symbols decided but not yet taken by a path
    next_repair: int = 0  # next fresh repair index (starts at k_b)
    coded: bool = True  # False after a repair request: sources are resent by range
    encoder: BlockEncoder | None = None

    def source_acked(self, index: int) -> None:
        """The piece carrying exactly source ``index`` was acknowledged."""
        if index not in self.by_range:
            self.acked_sources.add(index)

    def count_by_range(self, index: int) -> None:
        """Bytes of source ``index`` were acked or un-acked other than by its own piece."""
        self.by_range.add(index)
        self.acked_sources.discard(index)

    def have(self, shape: CodingShape, block: int, acked: RangeSet) -> int:
        """Symbols of the block acknowledged: sources whose bytes are all acked, repairs."""
        if not self.coded:
            sources = sum(
                acked.covers(*shape.symbol_range(block, i)) for i in range(shape.block_k(block))
            )
        else:
            sources = len(self.acked_sources)
            for i in self.by_range:
                sources += acked.covers(*shape.symbol_range(block, i))
        return sources + len(self.acked_repairs)

    def shortfall(self, shape: CodingShape, block: int, acked: RangeSet) -> int:
        """Repair symbols still to send so that k_b symbols can arrive."""
        return shape.block_k(block) - self.have(shape, block, acked) - self.inflight - self.queued

    def can_add_repairs(self, count: int) -> bool:
        return self.next_repair + count <= MAX_SYMBOLS


class InboundCoding:
    """The receiver's open blocks of one message: repair symbols kept until they decode.

    Every shard that lands in a block with a decoder asks whether it decodes now, so a
    block's missing byte count is kept once counted: the owner of ``received`` reports
    each change to it (``bytes_received``, ``bytes_removed``).
    """

    def __init__(self, shape: CodingShape) -> None:
        self.shape = shape
        self.decoders: dict[int, BlockDecoder] = {}
        self.decoded_blocks: set[int] = set()
        self._missing_bytes: dict[int, int] = {}  # blocks with a decoder, once counted

    def add_repair(self, block: int, index: int, data: Buffer) -> None:
        decoder = self.decoders.get(block)
        if decoder is None:
            decoder = BlockDecoder(self.shape.block_k(block), self.shape.symbol_bytes)
            self.decoders[block] = decoder
        decoder.add(index, data)

    def bytes_received(self, start: int, end: int, new_bytes: int) -> None:
        """``new_bytes`` integers of [start, end) were just added to ``received``."""
        counted = self._missing_bytes
        if not counted or end <= start:
            return
        first, last = self.shape.block_of(start), self.shape.block_of(end - 1)
        if first == last:
            if first in counted:
                counted[first] -= new_bytes
        else:  # which block got how many is unknown: count those again when asked
            for block in range(first, last + 1):
                counted.pop(block, None)

    def bytes_removed(self, block: int) -> None:
        """Bytes of ``block`` were taken out of ``received``."""
        self._missing_bytes.pop(block, None)

    def _close(self, block: int) -> None:
        del self.decoders[block]
        self._missing_bytes.pop(block, None)

    def try_decode(
        self, block: int, body: bytearray | memoryview, received: RangeSet
    ) -> list[tuple[int, int]]:
        """Rebuild the block's missing sources into ``body`` if enough symbols arrived.

        Returns the byte ranges written (empty when not decodable yet or not needed).
        """
        decoder = self.decoders.get(block)
        if decoder is None:
            return []
        shape = self.shape
        missing_bytes = self._missing_bytes.get(block)
        if missing_bytes is None:
            start, end = shape.block_range(block)
            missing_bytes = end - start - received.covered_bytes(start, end)
            self._missing_bytes[block] = missing_bytes
        if missing_bytes == 0:
            self._close(block)
            return []
        # each incomplete source misses 1..symbol_bytes bytes: with fewer symbols held
        # than that lower bound on incomplete sources, the block cannot decode yet
        if decoder.symbol_count * shape.symbol_bytes < missing_bytes:
            return []
        block_k = shape.block_k(block)
        complete = [i for i in range(block_k) if received.covers(*shape.symbol_range(block, i))]
        if len(complete) + decoder.symbol_count < block_k:
            return []
        for i in complete:
            lo, hi = shape.symbol_range(block, i)
            decoder.add(i, memoryview(body)[lo:hi])
        written = []
        for i, symbol in decoder.recover().items():
            lo, hi = shape.symbol_range(block, i)
            body[lo:hi] = symbol[: hi - lo]
            written.append((lo, hi))
        self._close(block)
        self.decoded_blocks.add(block)
        return written
