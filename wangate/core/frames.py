"""Wire frames between gateways (documented in proto/wire.md).

Two carriers per path connection:

* QUIC DATAGRAM frames carry ``ShardDatagram``, ``RepairDatagram`` and
  ``ProbeDatagram``: unreliable, each stamped with a per-path sequence number and the
  sender's clock, so the gateway measures RTT, jitter and loss itself and repairs only
  what is missing.
* One bidirectional QUIC stream (the control stream) carries length-prefixed control
  frames: ``Hello``, ``Ack``, ``Credit``, ``MessageRejected``, ``RouteChosen``,
  ``MessagesDone``, ``RepairRequested``, ``MessagesTaken``.

Decoders raise ``RemoteProtocolError`` on anything malformed; encoders raise
``LocalProtocolError`` on values that cannot be represented.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from wangate.errors import LocalProtocolError, RemoteProtocolError

WIRE_VERSION = 1

# datagram types
DGRAM_SHARD = 0x10
DGRAM_PROBE = 0x11
DGRAM_REPAIR = 0x12

# control frame types
CTRL_HELLO = 0x01
CTRL_ACK = 0x02
CTRL_CREDIT = 0x03
CTRL_REJECTED = 0x04
CTRL_ROUTE = 0x05
CTRL_DONE = 0x06
CTRL_REPAIR_REQUEST = 0x07
CTRL_TAKEN = 0x08

SHARD_FLAG_CRITICAL = 0x01

# type u8, flags u8, path_seq u64, sent_ns u64, msg_id u64, msg_len u64, offset u64
_SHARD = struct.Struct("!BBQQQQQ")
SHARD_HEADER_BYTES = _SHARD.size  # 42
# type u8, flags u8, path_seq u64, sent_ns u64, msg_id u64, msg_len u64,
# block u32, symbol index u16, k u16, symbol_bytes u32
_REPAIR = struct.Struct("!BBQQQQIHHI")
REPAIR_HEADER_BYTES = _REPAIR.size  # 46
MAX_FEC_SYMBOLS = 256
# type u8, flags u8, path_seq u64, sent_ns u64
_PROBE = struct.Struct("!BBQQ")
PROBE_BYTES = _PROBE.size  # 18

# control frame envelope: type u8, body length u32
_CTRL = struct.Struct("!BI")
CONTROL_HEADER_BYTES = _CTRL.size
MAX_CONTROL_BODY_BYTES = 64 * 1024

_HELLO = struct.Struct("!BQQ")  # version, instance_id, max_message_bytes
_ACK_HEAD = struct.Struct("!QIH")  # echo_sent_ns, ack_delay_us, range count
_ACK_RANGE = struct.Struct("!QQ")  # first, last (inclusive)
MAX_ACK_RANGES = 1024
_CREDIT = struct.Struct("!Q")
_REJECTED = struct.Struct("!QH")
_MSG_ID = struct.Struct("!Q")
MAX_DONE_IDS = 1024
_REPAIR_REQUEST_HEAD = struct.Struct("!QH")  # msg_id, block count
_BLOCK = struct.Struct("!I")
MAX_REPAIR_BLOCKS = 1024

MAX_MESSAGE_BYTES = 1 << 40  # no single message may declare more (1 TiB)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ShardDatagram:
    path_seq: int
    sent_ns: int
    msg_id: int
    msg_len: int
    offset: int
    data: bytes | memoryview
    critical: bool = False


@dataclass(frozen=True)
class ProbeDatagram:
    path_seq: int
    sent_ns: int


@dataclass(frozen=True)
class RepairDatagram:
    """One FEC repair symbol of block ``block`` of a message (see wangate.core.fec)."""

    path_seq: int
    sent_ns: int
    msg_id: int
    msg_len: int
    block: int
    index: int  # k_b..255, k_b = source symbols in this block (k, or fewer in the last)
    k: int  # source symbols per block of this message (the last block may have fewer)
    symbol_bytes: int
    data: bytes | memoryview
    critical: bool = False


Datagram = ShardDatagram | ProbeDatagram | RepairDatagram


def encode_shard(
    path_seq: int,
    sent_ns: int,
    msg_id: int,
    msg_len: int,
    offset: int,
    data: bytes | memoryview,
    critical: bool = False,
) -> bytes:
    if offset + len(data) > msg_len:
        raise LocalProtocolError("shard extends past the end of its message")
    head = _pack(
        _SHARD,
        DGRAM_SHARD,
        SHARD_FLAG_CRITICAL if critical else 0,
        path_seq,
        sent_ns,
        msg_id,
        msg_len,
        offset,
    )
    return head + data


def encode_repair(
    path_seq: int,
    sent_ns: int,
    msg_id: int,
    msg_len: int,
    block: int,
    index: int,
    k: int,
    data: bytes | memoryview,
    critical: bool = False,
) -> bytes:
    head = _pack(
        _REPAIR,
        DGRAM_REPAIR,
        SHARD_FLAG_CRITICAL if critical else 0,
        path_seq,
        sent_ns,
        msg_id,
        msg_len,
        block,
        index,
        k,
        len(data),
    )
    fault = _repair_fault(msg_id, msg_len, block, index, k, len(data))
    if fault is not None:
        raise LocalProtocolError(fault)
    return head + data


def _repair_fault(
    msg_id: int, msg_len: int, block: int, index: int, k: int, size: int
) -> str | None:
    """Why a repair symbol with these fields cannot exist (None: it can)."""
    if size == 0:
        return "empty repair symbol"
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


def encode_probe(path_seq: int, sent_ns: int) -> bytes:
    return _pack(_PROBE, DGRAM_PROBE, 0, path_seq, sent_ns)


def _pack(layout: struct.Struct, *values: int) -> bytes:
    try:
        return layout.pack(*values)
    except struct.error as exc:  # a field out of range for its width
        raise LocalProtocolError(f"{values} cannot be encoded: {exc}") from exc


def decode_datagram(data: bytes) -> Datagram:
    if not data:
        raise RemoteProtocolError("empty datagram")
    kind = data[0]
    if kind == DGRAM_SHARD:
        if len(data) < SHARD_HEADER_BYTES:
            raise RemoteProtocolError(f"shard datagram of {len(data)} bytes is truncated")
        _, flags, seq, sent_ns, msg_id, msg_len, offset = _SHARD.unpack_from(data)
        payload = memoryview(data)[SHARD_HEADER_BYTES:]
        if msg_len > MAX_MESSAGE_BYTES:
            raise RemoteProtocolError(f"shard declares a {msg_len}-byte message")
        if offset + len(payload) > msg_len or not payload:
            raise RemoteProtocolError(
                f"shard [{offset}, {offset + len(payload)}) outside message of {msg_len} bytes"
            )
        if msg_id == 0:
            raise RemoteProtocolError("shard with message id 0")
        return ShardDatagram(
            seq, sent_ns, msg_id, msg_len, offset, payload, bool(flags & SHARD_FLAG_CRITICAL)
        )
    if kind == DGRAM_REPAIR:
        if len(data) < REPAIR_HEADER_BYTES:
            raise RemoteProtocolError(f"repair datagram of {len(data)} bytes is truncated")
        _, flags, seq, sent_ns, msg_id, msg_len, block, index, k, size = _REPAIR.unpack_from(data)
        payload = memoryview(data)[REPAIR_HEADER_BYTES:]
        if len(payload) != size:
            raise RemoteProtocolError(f"repair symbol of {len(payload)} bytes, header says {size}")
        fault = _repair_fault(msg_id, msg_len, block, index, k, size)
        if fault is not None:
            raise RemoteProtocolError(fault)
        return RepairDatagram(
            seq,
            sent_ns,
            msg_id,
            msg_len,
            block,
            index,
            k,
            size,
            payload,
            bool(flags & SHARD_FLAG_CRITICAL),
        )
    if kind == DGRAM_PROBE:
        if len(data) != PROBE_BYTES:
            raise RemoteProtocolError(
                f"probe datagram of {len(data)} bytes, expected {PROBE_BYTES}"
            )
        _, _, seq, sent_ns = _PROBE.unpack(data)
        return ProbeDatagram(seq, sent_ns)
    raise RemoteProtocolError(f"unknown datagram type 0x{kind:02x}")


# ---------------------------------------------------------------------- control


@dataclass(frozen=True)
class Hello:
    """First frame each way on a path's control stream: who we are, which path."""

    site: str
    path: str
    instance_id: int  # random per daemon start; a new one resets the peer's state
    max_message_bytes: int
    version: int = WIRE_VERSION


@dataclass(frozen=True)
class Ack:
    """Per-path acknowledgement of datagram sequence numbers (RFC 9000 §19.3 in spirit)."""

    echo_sent_ns: int  # sent_ns of the newest datagram acknowledged here
    ack_delay_us: int  # how long the receiver held that datagram before acking it
    ranges: tuple[tuple[int, int], ...]  # inclusive (first, last), any order


@dataclass(frozen=True)
class Credit:
    """Cumulative message bytes the receiver accepts from this sender (like MAX_DATA)."""

    granted_bytes: int


@dataclass(frozen=True)
class MessageRejected:
    msg_id: int
    code: int
    reason: str


@dataclass(frozen=True)
class MessagesDone:
    """The receiver verified and delivered these messages: the sender may forget them."""

    msg_ids: tuple[int, ...]


@dataclass(frozen=True)
class MessagesTaken:
    """A trainer took these messages from the receiver's inbox: they are delivered.

    Until then the sender keeps a small record of each done message, so that a
    receiver that restarts with them in its inbox can be reported (proto/wire.md,
    "Delivery").
    """

    msg_ids: tuple[int, ...]


@dataclass(frozen=True)
class RepairRequested:
    """FEC-rebuilt blocks of a message failed its checksum: send their sources again."""

    msg_id: int
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class RouteChosen:
    """The sender tells its peer which path now carries its critical traffic."""

    path: str


REJECT_TOO_LARGE = 1
REJECT_CHECKSUM = 2
REJECT_MALFORMED = 3
REJECT_EXPIRED = 4  # no byte arrived for the receiver's idle timeout: sender gone quiet

ControlFrame = (
    Hello
    | Ack
    | Credit
    | MessageRejected
    | RouteChosen
    | MessagesDone
    | RepairRequested
    | MessagesTaken
)


def _name_bytes(name: str, what: str) -> bytes:
    if not NAME_RE.fullmatch(name):  # match() would let a trailing newline through
        raise LocalProtocolError(f"{what} {name!r} is not a valid name")
    return name.encode()


def encode_control(frame: ControlFrame) -> bytes:
    if isinstance(frame, Hello):
        site = _name_bytes(frame.site, "site")
        path = _name_bytes(frame.path, "path")
        body = (
            _pack(_HELLO, frame.version, frame.instance_id, frame.max_message_bytes)
            + bytes([len(site)])
            + site
            + bytes([len(path)])
            + path
        )
        kind = CTRL_HELLO
    elif isinstance(frame, Ack):
        if not 0 < len(frame.ranges) <= MAX_ACK_RANGES:
            raise LocalProtocolError(f"an ack carries 1..{MAX_ACK_RANGES} ranges")
        delay_us = min(frame.ack_delay_us, _U32)
        if any(last < first for first, last in frame.ranges):
            raise LocalProtocolError("an ack range is reversed")
        parts = [_pack(_ACK_HEAD, frame.echo_sent_ns, delay_us, len(frame.ranges))]
        parts.extend(_pack(_ACK_RANGE, first, last) for first, last in frame.ranges)
        body = b"".join(parts)
        kind = CTRL_ACK
    elif isinstance(frame, RouteChosen):
        path = _name_bytes(frame.path, "path")
        body = bytes([len(path)]) + path
        kind = CTRL_ROUTE
    elif isinstance(frame, MessagesDone | MessagesTaken):
        what = "done" if isinstance(frame, MessagesDone) else "taken"
        if not 0 < len(frame.msg_ids) <= MAX_DONE_IDS:
            raise LocalProtocolError(f"a {what} frame carries 1..{MAX_DONE_IDS} message ids")
        body = b"".join(_pack(_MSG_ID, msg_id) for msg_id in frame.msg_ids)
        kind = CTRL_DONE if isinstance(frame, MessagesDone) else CTRL_TAKEN
    elif isinstance(frame, RepairRequested):
        if not 0 < len(frame.blocks) <= MAX_REPAIR_BLOCKS:
            raise LocalProtocolError(f"a repair request names 1..{MAX_REPAIR_BLOCKS} blocks")
        body = _pack(_REPAIR_REQUEST_HEAD, frame.msg_id, len(frame.blocks)) + b"".join(
            _pack(_BLOCK, block) for block in frame.blocks
        )
        kind = CTRL_REPAIR_REQUEST
    elif isinstance(frame, Credit):
        body = _pack(_CREDIT, frame.granted_bytes)
        kind = CTRL_CREDIT
    else:
        reason = frame.reason.encode()[:1024]
        body = _pack(_REJECTED, frame.msg_id, frame.code) + reason
        kind = CTRL_REJECTED
    return _CTRL.pack(kind, len(body)) + body


def _decode_name(body: bytes, pos: int, frame: str, what: str) -> tuple[str, int]:
    if pos >= len(body):
        raise RemoteProtocolError(f"{frame} truncated before {what}")
    n = body[pos]
    raw = body[pos + 1 : pos + 1 + n]
    if len(raw) != n:
        raise RemoteProtocolError(f"{frame} truncated inside {what}")
    try:
        name = raw.decode()
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"{frame} {what} is not UTF-8") from exc
    if not NAME_RE.fullmatch(name):  # match() would let a trailing newline through
        raise RemoteProtocolError(f"{frame} {what} {name!r} is not a valid name")
    return name, pos + 1 + n


def decode_control_body(kind: int, body: bytes) -> ControlFrame:
    if kind == CTRL_HELLO:
        if len(body) < _HELLO.size:
            raise RemoteProtocolError("hello truncated")
        version, instance_id, max_message = _HELLO.unpack_from(body)
        if version != WIRE_VERSION:
            raise RemoteProtocolError(
                f"peer speaks wire version {version}, this gateway speaks {WIRE_VERSION}"
            )
        site, pos = _decode_name(body, _HELLO.size, "hello", "site")
        path, pos = _decode_name(body, pos, "hello", "path")
        if pos != len(body):
            raise RemoteProtocolError("hello has trailing bytes")
        return Hello(site, path, instance_id, max_message, version)
    if kind == CTRL_ACK:
        if len(body) < _ACK_HEAD.size:
            raise RemoteProtocolError("ack truncated")
        echo, delay, count = _ACK_HEAD.unpack_from(body)
        if count == 0 or count > MAX_ACK_RANGES:
            raise RemoteProtocolError(f"ack with {count} ranges")
        if len(body) != _ACK_HEAD.size + count * _ACK_RANGE.size:
            raise RemoteProtocolError("ack length does not match its range count")
        ranges = tuple(_ACK_RANGE.iter_unpack(body[_ACK_HEAD.size :]))
        for first, last in ranges:
            if last < first:
                raise RemoteProtocolError(f"ack range {first}..{last} is reversed")
        return Ack(echo, delay, ranges)
    if kind == CTRL_ROUTE:
        path, pos = _decode_name(body, 0, "route", "path")
        if pos != len(body):
            raise RemoteProtocolError("route frame has trailing bytes")
        return RouteChosen(path)
    if kind in (CTRL_DONE, CTRL_TAKEN):
        what = "done" if kind == CTRL_DONE else "taken"
        if not body or len(body) % _MSG_ID.size or len(body) // _MSG_ID.size > MAX_DONE_IDS:
            raise RemoteProtocolError(f"{what} frame of {len(body)} bytes")
        ids = tuple(m for (m,) in _MSG_ID.iter_unpack(body))
        return MessagesDone(ids) if kind == CTRL_DONE else MessagesTaken(ids)
    if kind == CTRL_REPAIR_REQUEST:
        if len(body) < _REPAIR_REQUEST_HEAD.size:
            raise RemoteProtocolError("repair request truncated")
        msg_id, count = _REPAIR_REQUEST_HEAD.unpack_from(body)
        rest = body[_REPAIR_REQUEST_HEAD.size :]
        if not 0 < count <= MAX_REPAIR_BLOCKS:
            raise RemoteProtocolError(f"repair request with {count} blocks")
        if len(rest) != count * _BLOCK.size:
            raise RemoteProtocolError("repair request length does not match its block count")
        return RepairRequested(msg_id, tuple(b for (b,) in _BLOCK.iter_unpack(rest)))
    if kind == CTRL_CREDIT:
        if len(body) != _CREDIT.size:
            raise RemoteProtocolError("credit frame has the wrong length")
        return Credit(*_CREDIT.unpack(body))
    if kind == CTRL_REJECTED:
        if len(body) < _REJECTED.size:
            raise RemoteProtocolError("rejected frame truncated")
        msg_id, code = _REJECTED.unpack_from(body)
        reason = body[_REJECTED.size :].decode("utf-8", errors="replace")
        return MessageRejected(msg_id, code, reason)
    raise RemoteProtocolError(f"unknown control frame type 0x{kind:02x}")


class ControlStreamDecoder:
    """Reassembles control frames from stream bytes that arrive in arbitrary pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[ControlFrame]:
        self._buffer += data
        frames: list[ControlFrame] = []
        buf = self._buffer
        pos = 0
        while len(buf) - pos >= CONTROL_HEADER_BYTES:
            kind, length = _CTRL.unpack_from(buf, pos)
            if length > MAX_CONTROL_BODY_BYTES:
                raise RemoteProtocolError(f"control frame of {length} bytes is too large")
            end = pos + CONTROL_HEADER_BYTES + length
            if len(buf) < end:
                break
            frames.append(decode_control_body(kind, bytes(buf[pos + CONTROL_HEADER_BYTES : end])))
            pos = end
        del buf[:pos]
        return frames
