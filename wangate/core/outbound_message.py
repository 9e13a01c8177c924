"""A message on its way out (``OutboundMessage``: its bytes, what of them the peer
acknowledged, its FEC blocks' ledgers) and the pieces of work cut from it (``Piece``),
which ``OutboundQueue`` (wangate.core.outbound) hands to the paths."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from wangate.core.buffer import Buffer
from wangate.core.coding import BlockLedger, CodingShape
from wangate.core.fec import BlockEncoder
from wangate.core.jobs import DEFAULT_JOB
from wangate.core.rangeset import RangeSet


class OutboundMessage:
    __slots__ = (
        "acked",
        "acked_at",
        "blocks",
        "body_len",
        "critical",
        "deadline_at",
        "had_every_byte",
        "head",
        "header_bytes",
        "job",
        "msg_id",
        "next_offset",
        "payload",
        "queued",
        "repair_work",
        "repairs",
        "shape",
        "started_at",
        "step",
        "tag",
        "tail_upfront",
    )

    def __init__(
        self, msg_id: int, head: bytes, payload: Buffer, critical: bool, job: str = DEFAULT_JOB
    ) -> None:
        self.msg_id = msg_id
        self.job = job
        self.head = head
        self.payload = memoryview(payload).cast("B")
        self.body_len = len(head) + len(self.payload)
        self.critical = critical
        self.tag = ""  # for reports of its fate: the header is encoded already
        self.step = 0
        self.next_offset = 0  # first byte never sent
        self.repairs: deque[tuple[int, int]] = deque()  # [start, end) to send again
        self.acked = RangeSet()
        self.queued = False  # in the queue's work list
        self.started_at = 0.0
        self.acked_at: float | None = None  # every byte acknowledged (awaiting "done")
        # every byte was acknowledged once (a poke asking again for "done" does not undo
        # it): the peer may have delivered it, so silence alone does not fail it
        self.had_every_byte = False
        self.deadline_at: float | None = None  # the trainer's: give up if not done by then
        self.shape: CodingShape | None = None  # set when the first piece is taken
        self.blocks: dict[int, BlockLedger] = {}  # open coded blocks
        self.repair_work: deque[int] = deque()  # per repair symbol: block << 1 | up front
        self.header_bytes = 0  # room its datagrams' headers take (OutboundQueue.header_bytes)
        self.tail_upfront: bool | None = None  # its tail's repair symbols pay (decided once)

    def read(self, start: int, end: int) -> bytes | memoryview:
        head_len = len(self.head)
        if start >= head_len:
            return self.payload[start - head_len : end - head_len]
        if end <= head_len:
            return self.head[start:end]
        return self.head[start:] + self.payload[: end - head_len]

    @property
    def has_work(self) -> bool:
        return bool(self.repairs) or bool(self.repair_work) or self.next_offset < self.body_len

    @property
    def complete(self) -> bool:
        return self.acked.covers(0, self.body_len)

    def ledger(self, block: int) -> BlockLedger:
        ledger = self.blocks.get(block)
        if ledger is None:
            shape = self.shape
            assert shape is not None
            ledger = BlockLedger(next_repair=shape.block_k(block))
            if self.acked.covered_bytes(*shape.block_range(block)):
                # bytes acked before the ledger existed (a split symbol, a closed block)
                for i in range(shape.block_k(block)):
                    if self.acked.covered_bytes(*shape.symbol_range(block, i)):
                        ledger.count_by_range(i)
            self.blocks[block] = ledger
        return ledger

    def range_acked(self, start: int, end: int) -> None:
        """Tell the open ledgers which sources a byte-range piece [start, end) touched."""
        shape = self.shape
        if shape is None or not self.blocks or end <= start:
            return
        k = shape.k
        first, last = start // shape.symbol_bytes, (end - 1) // shape.symbol_bytes
        for block in range(first // k, last // k + 1):
            ledger = self.blocks.get(block)
            if ledger is not None:
                base = block * k
                for index in range(max(first, base) - base, min(last, base + k - 1) - base + 1):
                    ledger.count_by_range(index)

    def encoder(self, block: int) -> BlockEncoder:
        ledger = self.ledger(block)
        if ledger.encoder is None:
            shape = self.shape
            assert shape is not None
            encoder = BlockEncoder(shape.block_k(block), shape.symbol_bytes)
            for i in range(shape.block_k(block)):
                encoder.add_source(i, self.read(*shape.symbol_range(block, i)))
            ledger.encoder = encoder
        return ledger.encoder


@dataclass(frozen=True, init=False)
class Piece:
    message: OutboundMessage
    start: int
    end: int
    repair: bool
    block: int = -1  # coded block this piece belongs to (-1: counts for none)
    symbol: int = -1  # index in its block: < k source, >= k repair symbol

    def __init__(  # written, not generated: one per datagram, and mypyc compiles this one
        self,
        message: OutboundMessage,
        start: int,
        end: int,
        repair: bool,
        block: int = -1,
        symbol: int = -1,
    ) -> None:
        object.__setattr__(self, "message", message)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)
        object.__setattr__(self, "repair", repair)
        object.__setattr__(self, "block", block)
        object.__setattr__(self, "symbol", symbol)

    @property
    def is_repair_symbol(self) -> bool:
        return self.message.shape is not None and self.symbol >= self.message.shape.block_k(
            self.block
        )

    @property
    def size_bytes(self) -> int:
        """The message bytes it carries (a repair symbol: one symbol)."""
        shape = self.message.shape
        if shape is not None and self.symbol >= shape.block_k(self.block):
            return shape.symbol_bytes
        return self.end - self.start
