"""Wire datagrams between gateways (proto/wire.md, "Datagrams"), wire version 2.

QUIC DATAGRAM frames carry ``ShardDatagram``, ``RepairDatagram`` and ``ProbeDatagram``:
unreliable, each stamped with a per-path sequence number and the sender's clock, so the
gateway measures RTT, jitter and loss itself and repairs only what is missing. The
header is short: ``path_seq`` and ``msg_id`` travel as their low 32 bits and are
expanded on receipt like QUIC packet numbers, the send stamp is 24 bits, lengths and
offsets are varints.

Decoders raise ``RemoteProtocolError`` on anything malformed; encoders raise
``LocalProtocolError`` on values that cannot be represented.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, NamedTuple

from wangate.core.buffer import Buffer
from wangate.errors import LocalProtocolError, RemoteProtocolError

# datagram types: the first byte's top two bits; its low bits are flags
DGRAM_SHARD: Final = 0x40
DGRAM_REPAIR: Final = 0x80
DGRAM_PROBE: Final = 0xC0
DGRAM_TYPE_MASK: Final = 0xC0
SHARD_FLAG_CRITICAL: Final = 0x01

# Truncated fields, expanded on receipt against the largest value seen the way QUIC
# packet numbers are (RFC 9000 §17.1, Appendix A.3).
SEQ_BITS: Final = 32  # path_seq: a path would have to lose 2^31 datagrams in a row
MSG_ID_BITS: Final = 32  # msg_id: 2^31 messages between two datagrams of one message
# The send time: a wrapping stamp the receiver only echoes (RTT) or differences
# (jitter), so a few bytes do: 24 bits of 4 microseconds wrap every 67.1 s.
STAMP_BITS: Final = 24
STAMP_UNIT_S: Final = 4e-6
STAMP_MASK: Final = (1 << STAMP_BITS) - 1
_SEQ_MASK: Final = (1 << SEQ_BITS) - 1
_MSG_ID_MASK: Final = (1 << MSG_ID_BITS) - 1

# type|flags u8, path_seq u32, sent stamp u24, msg_id u32: the part every data datagram has
# (the stamp as u16 + u8: one unpack, no bytes objects per datagram)
_COMMON: Final = struct.Struct("!BIHBI")
_PROBE: Final = struct.Struct("!BIHB")
# the usual shard: msg_len and offset both 4-byte varints (messages of 16 KiB to 1 GiB)
_SHARD_USUAL: Final = struct.Struct("!BIHBIII")
_VARINT4_MASK: Final = 0x3FFFFFFF
_VARINT4_TAG: Final = 0x80000000
PROBE_BYTES: Final = _PROBE.size  # 8
MAX_FEC_SYMBOLS: Final = 256
# Shard: common, then msg_len and offset as QUIC varints (RFC 9000 §16). Repair: common,
# msg_len and block as varints, index u8, k u8; the symbol is the rest of the datagram.
SHARD_HEADER_MAX_BYTES: Final = _COMMON.size + 8 + 8  # 28
REPAIR_HEADER_MAX_BYTES: Final = _COMMON.size + 8 + 8 + 2  # 30
MAX_DATAGRAM_HEADER_BYTES: Final = max(SHARD_HEADER_MAX_BYTES, REPAIR_HEADER_MAX_BYTES)
_VARINT_MAX: Final = (1 << 62) - 1

MAX_MESSAGE_BYTES: Final = 1 << 40  # no single message may declare more (1 TiB)


def stamp(now: float) -> int:
    """The wire's send stamp for time ``now`` (seconds, any epoch)."""
    return int(now / STAMP_UNIT_S) & STAMP_MASK


def stamp_age_s(now: float, echoed: int) -> float:
    """Seconds from the stamp ``echoed`` (made by :func:`stamp` on this clock) to ``now``;
    right for ages below one wrap (67.1 s)."""
    return ((stamp(now) - echoed) & STAMP_MASK) * STAMP_UNIT_S


def expand(truncated: int, bits: int, expected: int) -> int:
    """The value nearest ``expected`` whose low ``bits`` are ``truncated`` (RFC 9000
    Appendix A.3, with ``expected`` = largest seen + 1 for sequence numbers)."""
    window = 1 << bits
    half = window >> 1
    candidate = (expected & ~(window - 1)) | truncated
    if candidate + half <= expected and candidate < (1 << 64) - window:
        return candidate + window
    if candidate > expected + half and candidate >= window:
        return candidate - window
    return candidate


def varint_bytes(value: int) -> int:
    """Bytes of ``value`` as a QUIC variable-length integer (RFC 9000 §16)."""
    if value < 0:
        raise LocalProtocolError(f"{value} cannot be encoded as a varint")
    if value < 1 << 6:
        return 1
    if value < 1 << 14:
        return 2
    if value < 1 << 30:
        return 4
    if value <= _VARINT_MAX:
        return 8
    raise LocalProtocolError(f"{value} cannot be encoded as a varint")


def _varint(value: int, size: int = 0) -> bytes:
    """``value`` as a varint of ``size`` bytes (default: the fewest that hold it)."""
    size = size or varint_bytes(value)
    return (value | ((size.bit_length() - 1) << (8 * size - 2))).to_bytes(size, "big")


def _pull_varint(data: bytes | memoryview, pos: int, kind: str, what: str) -> tuple[int, int]:
    if pos >= len(data):
        raise RemoteProtocolError(f"{kind} datagram truncated before {what}")
    size = 1 << (data[pos] >> 6)
    if pos + size > len(data):
        raise RemoteProtocolError(f"{kind} datagram truncated inside {what}")
    value = int.from_bytes(data[pos : pos + size], "big") & ((1 << (8 * size - 2)) - 1)
    return value, pos + size


def shard_header_bytes(msg_len: int) -> int:
    """The most header bytes a shard of a ``msg_len``-byte message takes."""
    return _COMMON.size + 2 * varint_bytes(msg_len)


def message_header_bytes(msg_len: int, k: int = 0, datagram_bytes: int = 0) -> int:
    """The most header bytes any datagram of a message takes: its shards and, if coded
    with ``k`` source symbols per block into datagrams of ``datagram_bytes``, its
    repair symbols (whose symbol size is ``datagram_bytes`` minus this)."""
    head = shard_header_bytes(msg_len)
    if not k or not datagram_bytes:
        return head
    fixed = _COMMON.size + varint_bytes(msg_len) + 2
    for _ in range(4):  # a larger header makes smaller symbols and maybe more blocks
        symbol = max(1, datagram_bytes - head)
        last_block = max(0, -(-msg_len // symbol) - 1) // k
        need = max(head, fixed + varint_bytes(last_block))
        if need == head:
            break
        head = need
    return head


# The datagram classes write their own __init__: one is built per datagram, and mypyc
# compiles a written one (dataclasses' generated one stays interpreted: 1.2 us a call).


@dataclass(frozen=True, init=False)
class ShardDatagram:
    path_seq: int
    sent_stamp: int  # the sender's wrapping stamp (STAMP_UNIT_S, STAMP_BITS)
    msg_id: int
    msg_len: int
    offset: int
    data: bytes | memoryview
    critical: bool = False

    def __init__(
        self,
        path_seq: int,
        sent_stamp: int,
        msg_id: int,
        msg_len: int,
        offset: int,
        data: bytes | memoryview,
        critical: bool = False,
    ) -> None:
        object.__setattr__(self, "path_seq", path_seq)
        object.__setattr__(self, "sent_stamp", sent_stamp)
        object.__setattr__(self, "msg_id", msg_id)
        object.__setattr__(self, "msg_len", msg_len)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "critical", critical)


@dataclass(frozen=True, init=False)
class ProbeDatagram:
    path_seq: int
    sent_stamp: int

    def __init__(self, path_seq: int, sent_stamp: int) -> None:
        object.__setattr__(self, "path_seq", path_seq)
        object.__setattr__(self, "sent_stamp", sent_stamp)


@dataclass(frozen=True, init=False)
class RepairDatagram:
    """One FEC repair symbol of block ``block`` of a message (see wangate.core.fec)."""

    path_seq: int
    sent_stamp: int
    msg_id: int
    msg_len: int
    block: int
    index: int  # k_b..255, k_b = source symbols in this block (k, or fewer in the last)
    k: int  # source symbols per block of this message (the last block may have fewer)
    symbol_bytes: int
    data: bytes | memoryview
    critical: bool = False

    def __init__(
        self,
        path_seq: int,
        sent_stamp: int,
        msg_id: int,
        msg_len: int,
        block: int,
        index: int,
        k: int,
        symbol_bytes: int,
        data: bytes | memoryview,
        critical: bool = False,
    ) -> None:
        object.__setattr__(self, "path_seq", path_seq)
        object.__setattr__(self, "sent_stamp", sent_stamp)
        object.__setattr__(self, "msg_id", msg_id)
        object.__setattr__(self, "msg_len", msg_len)
        object.__setattr__(self, "block", block)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "symbol_bytes", symbol_bytes)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "critical", critical)


Datagram = ShardDatagram | ProbeDatagram | RepairDatagram


def _common(kind: int, critical: bool, path_seq: int, sent_stamp: int, msg_id: int) -> bytes:
    if not (0 <= path_seq < 1 << 64 and 0 <= msg_id < 1 << 64 and 0 <= sent_stamp <= STAMP_MASK):
        raise LocalProtocolError(f"({path_seq}, {sent_stamp}, {msg_id}) cannot be encoded")
    flags = SHARD_FLAG_CRITICAL if critical else 0
    seq, msg = path_seq & _SEQ_MASK, msg_id & _MSG_ID_MASK
    return _COMMON.pack(kind | flags, seq, sent_stamp >> 8, sent_stamp & 0xFF, msg)


def encode_shard(
    path_seq: int,
    sent_stamp: int,
    msg_id: int,
    msg_len: int,
    offset: int,
    data: bytes | memoryview,
    critical: bool = False,
) -> bytes:
    if offset + len(data) > msg_len:
        raise LocalProtocolError("shard extends past the end of its message")
    usual = 1 << 14 <= msg_len < 1 << 30 and offset >= 0 and 0 <= sent_stamp <= STAMP_MASK
    if usual and 0 <= path_seq < 1 << 64 and 0 <= msg_id < 1 << 64:
        flags = SHARD_FLAG_CRITICAL if critical else 0
        head = _SHARD_USUAL.pack(
            DGRAM_SHARD | flags,
            path_seq & _SEQ_MASK,
            sent_stamp >> 8,
            sent_stamp & 0xFF,
            msg_id & _MSG_ID_MASK,
            msg_len | _VARINT4_TAG,
            offset | _VARINT4_TAG,
        )
        return head + data
    # the offset takes as many bytes as msg_len's, so a message's shard headers are one
    # size (the sender sizes its datagrams by it)
    size = varint_bytes(msg_len)
    head = _common(DGRAM_SHARD, critical, path_seq, sent_stamp, msg_id)
    return head + _varint(msg_len, size) + _varint(offset, size) + data


class ShardSpan(NamedTuple):
    """Shards of one message that follow each other, to be framed by the engine
    (``encode_shard_span``, ``PathChannel.queue_many``): datagram i carries the message's
    bytes [start + i * stride, min(start + (i + 1) * stride, end)) with path sequence
    number ``seq_first + i``, all with one send stamp, each exactly as ``encode_shard``
    frames it. A sender hands a run of shards over in one piece, not one bytes object
    per datagram."""

    payload: Buffer  # the message's bytes from payload_base on
    payload_base: int
    seq_first: int
    stamp: int
    msg_id: int
    msg_len: int
    start: int
    end: int
    stride: int
    critical: bool

    @property
    def datagrams(self) -> int:
        return -(-(self.end - self.start) // self.stride)


def encode_repair(
    path_seq: int,
    sent_stamp: int,
    msg_id: int,
    msg_len: int,
    block: int,
    index: int,
    k: int,
    data: bytes | memoryview,
    critical: bool = False,
) -> bytes:
    fault = _repair_fault(msg_id, msg_len, block, index, k, len(data))
    if fault is not None:
        raise LocalProtocolError(fault)
    head = _common(DGRAM_REPAIR, critical, path_seq, sent_stamp, msg_id)
    return head + _varint(msg_len) + _varint(block) + bytes([index, k]) + data


def _repair_fault(
    msg_id: int, msg_len: int, block: int, index: int, k: int, size: int
) -> str | None:
    """Why a repair symbol with these fields cannot exist (None: it can)."""
    if size == 0:
        return "empty repair symbol"
    if block < 0:
        return f"repair block {block} cannot exist"
    if msg_id == 0 or msg_len > MAX_MESSAGE_BYTES:
        return "repair symbol for an impossible message"
    if not 1 <= k < MAX_FEC_SYMBOLS:
        return f"repair symbol with k={k}"
    symbols = -(-msg_len // size)
    if block * k >= symbols:
        return f"repair block {block} past the end of the message"
    block_k = min(k, symbols - block * k)  # the last block may be short
    if not block_k <= index < MAX_FEC_SYMBOLS:
        return f"repair symbol index {index} in a block of {block_k}"
    return None


def encode_probe(path_seq: int, sent_stamp: int) -> bytes:
    if not (0 <= path_seq < 1 << 64 and 0 <= sent_stamp <= STAMP_MASK):
        raise LocalProtocolError(f"probe ({path_seq}, {sent_stamp}) cannot be encoded")
    return _PROBE.pack(DGRAM_PROBE, path_seq & _SEQ_MASK, sent_stamp >> 8, sent_stamp & 0xFF)


def decode_datagram(data: bytes, largest_seq: int = 0, largest_msg_id: int = 0) -> Datagram:
    """One datagram; ``largest_seq`` and ``largest_msg_id`` are the largest path
    sequence number (on this path) and message id (from this peer) received so far,
    against which the truncated fields are expanded."""
    if not data:
        raise RemoteProtocolError("empty datagram")
    kind = data[0] & DGRAM_TYPE_MASK
    critical = bool(data[0] & SHARD_FLAG_CRITICAL)
    if kind == DGRAM_PROBE:
        if len(data) != PROBE_BYTES:
            raise RemoteProtocolError(
                f"probe datagram of {len(data)} bytes, expected {PROBE_BYTES}"
            )
        _, seq, sent_hi, sent_lo = _PROBE.unpack(data)
        return ProbeDatagram(expand(seq, SEQ_BITS, largest_seq + 1), sent_hi << 8 | sent_lo)
    if (
        kind == DGRAM_SHARD
        and len(data) > _SHARD_USUAL.size
        and data[12] >> 6 == data[16] >> 6 == 2
    ):
        # the usual shard, in one unpack: the checks below, the same errors
        _, seq, sent_hi, sent_lo, short_id, msg_len, offset = _SHARD_USUAL.unpack_from(data)
        msg_len &= _VARINT4_MASK
        offset &= _VARINT4_MASK
        msg_id = expand(short_id, MSG_ID_BITS, largest_msg_id + 1)
        end = offset + len(data) - _SHARD_USUAL.size
        if msg_id == 0 or end > msg_len:
            return _decode_data(data, DGRAM_SHARD, critical, largest_seq, largest_msg_id)
        seq = expand(seq, SEQ_BITS, largest_seq + 1)
        payload = memoryview(data)[_SHARD_USUAL.size :]
        return ShardDatagram(
            seq, sent_hi << 8 | sent_lo, msg_id, msg_len, offset, payload, critical
        )
    if kind not in (DGRAM_SHARD, DGRAM_REPAIR):
        raise RemoteProtocolError(f"unknown datagram type 0x{data[0]:02x}")
    return _decode_data(data, kind, critical, largest_seq, largest_msg_id)


def _decode_data(
    data: bytes, kind: int, critical: bool, largest_seq: int, largest_msg_id: int
) -> Datagram:
    what = "shard" if kind == DGRAM_SHARD else "repair"
    if len(data) < _COMMON.size:
        raise RemoteProtocolError(f"{what} datagram of {len(data)} bytes is truncated")
    _, seq, sent_hi, sent_lo, short_id = _COMMON.unpack_from(data)
    seq = expand(seq, SEQ_BITS, largest_seq + 1)
    sent = sent_hi << 8 | sent_lo
    msg_id = expand(short_id, MSG_ID_BITS, largest_msg_id + 1)
    msg_len, pos = _pull_varint(data, _COMMON.size, what, "msg_len")
    if kind == DGRAM_SHARD:
        if msg_len > MAX_MESSAGE_BYTES:
            raise RemoteProtocolError(f"shard declares a {msg_len}-byte message")
        if msg_id == 0:
            raise RemoteProtocolError("shard with message id 0")
        offset, pos = _pull_varint(data, pos, what, "offset")
        payload = memoryview(data)[pos:]
        if offset + len(payload) > msg_len or not payload:
            raise RemoteProtocolError(
                f"shard [{offset}, {offset + len(payload)}) outside message of {msg_len} bytes"
            )
        return ShardDatagram(seq, sent, msg_id, msg_len, offset, payload, critical)
    block, pos = _pull_varint(data, pos, what, "block")
    if pos + 2 > len(data):
        raise RemoteProtocolError("repair datagram truncated before index and k")
    index, k = data[pos], data[pos + 1]
    payload = memoryview(data)[pos + 2 :]
    fault = _repair_fault(msg_id, msg_len, block, index, k, len(payload))
    if fault is not None:
        raise RemoteProtocolError(fault)
    return RepairDatagram(
        seq, sent, msg_id, msg_len, block, index, k, len(payload), payload, critical
    )
