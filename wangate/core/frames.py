"""Wire frames between gateways (documented in proto/wire.md); the datagrams are in
``wangate.core.datagrams`` and re-exported here.

Two carriers per path connection:

* QUIC DATAGRAM frames carry ``ShardDatagram``, ``RepairDatagram`` and
  ``ProbeDatagram``: unreliable, each stamped with a per-path sequence number and the
  sender's clock, so the gateway measures RTT, jitter and loss itself and repairs only
  what is missing.
* One bidirectional QUIC stream (the control stream) carries length-prefixed control
  frames: ``Hello``, ``Ack``, ``Credit``, ``MessageRejected``, ``RouteChosen``,
  ``MessagesDone``, ``RepairRequested``, ``MessagesTaken``, ``RangesMissing``.

Decoders raise ``RemoteProtocolError`` on anything malformed; encoders raise
``LocalProtocolError`` on values that cannot be represented.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final

from wangate.core.datagrams import (
    DGRAM_PROBE,
    DGRAM_REPAIR,
    DGRAM_SHARD,
    DGRAM_TYPE_MASK,
    MAX_DATAGRAM_HEADER_BYTES,
    MAX_FEC_SYMBOLS,
    MAX_MESSAGE_BYTES,
    MSG_ID_BITS,
    PROBE_BYTES,
    REPAIR_HEADER_MAX_BYTES,
    SEQ_BITS,
    SHARD_FLAG_CRITICAL,
    SHARD_HEADER_MAX_BYTES,
    STAMP_BITS,
    STAMP_MASK,
    STAMP_UNIT_S,
    Datagram,
    ProbeDatagram,
    RepairDatagram,
    ShardDatagram,
    ShardSpan,
    decode_datagram,
    encode_probe,
    encode_repair,
    encode_shard,
    expand,
    message_header_bytes,
    shard_header_bytes,
    stamp,
    stamp_age_s,
    varint_bytes,
)
from wangate.errors import LocalProtocolError, RemoteProtocolError

# the datagrams (wangate.core.datagrams) are re-exported: one import for the whole wire
__all__ = [
    "CONTROL_HEADER_BYTES",
    "CTRL_ACK",
    "CTRL_CREDIT",
    "CTRL_DONE",
    "CTRL_HELLO",
    "CTRL_REJECTED",
    "CTRL_REPAIR_REQUEST",
    "CTRL_ROUTE",
    "CTRL_TAKEN",
    "DGRAM_PROBE",
    "DGRAM_REPAIR",
    "DGRAM_SHARD",
    "DGRAM_TYPE_MASK",
    "MAX_ACK_RANGES",
    "MAX_CONTROL_BODY_BYTES",
    "MAX_DATAGRAM_HEADER_BYTES",
    "MAX_DONE_IDS",
    "MAX_FEC_SYMBOLS",
    "MAX_MESSAGE_BYTES",
    "MAX_MISSING_RANGES",
    "MAX_REPAIR_BLOCKS",
    "MSG_ID_BITS",
    "NAME_RE",
    "PROBE_BYTES",
    "REJECT_CHECKSUM",
    "REJECT_EXPIRED",
    "REJECT_MALFORMED",
    "REJECT_TOO_LARGE",
    "REJECT_UNKNOWN_JOB",
    "REPAIR_HEADER_MAX_BYTES",
    "SEQ_BITS",
    "SHARD_FLAG_CRITICAL",
    "SHARD_HEADER_MAX_BYTES",
    "STAMP_BITS",
    "STAMP_MASK",
    "STAMP_UNIT_S",
    "WIRE_VERSION",
    "Ack",
    "ControlFrame",
    "ControlStreamDecoder",
    "Credit",
    "Datagram",
    "Hello",
    "MessageRejected",
    "MessagesDone",
    "MessagesTaken",
    "ProbeDatagram",
    "RangesMissing",
    "RepairDatagram",
    "RepairRequested",
    "RouteChosen",
    "ShardDatagram",
    "ShardSpan",
    "decode_control_body",
    "decode_datagram",
    "encode_control",
    "encode_probe",
    "encode_repair",
    "encode_shard",
    "expand",
    "message_header_bytes",
    "shard_header_bytes",
    "stamp",
    "stamp_age_s",
    "varint_bytes",
]

WIRE_VERSION: Final = (
    5  # 5: RangesMissing; 4: datagrams in the data plane's packets (proto/engine.md)
)


# control frame types
CTRL_HELLO: Final = 0x01
CTRL_ACK: Final = 0x02
CTRL_CREDIT: Final = 0x03
CTRL_REJECTED: Final = 0x04
CTRL_ROUTE: Final = 0x05
CTRL_DONE: Final = 0x06
CTRL_REPAIR_REQUEST: Final = 0x07
CTRL_TAKEN: Final = 0x08
CTRL_RANGES_MISSING: Final = 0x09


# control frame envelope: type u8, body length u32
_CTRL: Final = struct.Struct("!BI")
CONTROL_HEADER_BYTES: Final = _CTRL.size
MAX_CONTROL_BODY_BYTES: Final = 64 * 1024

_HELLO: Final = struct.Struct("!BQQ")  # version, instance_id, max_message_bytes
_ACK_HEAD: Final = struct.Struct("!IIH")  # echo_stamp (u24 in a u32), ack_delay_us, range count
_ACK_RANGE: Final = struct.Struct("!QQ")  # first, last (inclusive)
MAX_ACK_RANGES: Final = 1024
_CREDIT: Final = struct.Struct("!Q")
_REJECTED: Final = struct.Struct("!QH")
_MSG_ID: Final = struct.Struct("!Q")
MAX_DONE_IDS: Final = 1024
_REPAIR_REQUEST_HEAD: Final = struct.Struct("!QH")  # msg_id, block (or range) count
_BLOCK: Final = struct.Struct("!I")
MAX_REPAIR_BLOCKS: Final = 1024
_RANGE: Final = struct.Struct("!QQ")  # start, end (half-open)
MAX_MISSING_RANGES: Final = 256

NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_U32: Final = 0xFFFFFFFF


def _pack(layout: struct.Struct, *values: int) -> bytes:
    try:
        return layout.pack(*values)
    except struct.error as exc:  # a field out of range for its width
        raise LocalProtocolError(f"{values} cannot be encoded: {exc}") from exc


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

    echo_stamp: int  # sent_stamp of the newest datagram acknowledged here
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
class RangesMissing:
    """The receiver still lacks these byte ranges [start, end) of a message whose
    confirmation its sender asked for: send them again."""

    msg_id: int
    ranges: tuple[tuple[int, int], ...]  # ascending, disjoint, none empty


@dataclass(frozen=True)
class RouteChosen:
    """The sender tells its peer which path now carries its critical traffic."""

    path: str


REJECT_TOO_LARGE: Final = 1
REJECT_CHECKSUM: Final = 2
REJECT_MALFORMED: Final = 3
REJECT_EXPIRED: Final = 4  # no byte arrived for the receiver's idle timeout: sender gone quiet
REJECT_UNKNOWN_JOB: Final = 5  # the receiving gateway serves no job of that name

ControlFrame = (
    Hello
    | Ack
    | Credit
    | MessageRejected
    | RouteChosen
    | MessagesDone
    | RepairRequested
    | MessagesTaken
    | RangesMissing
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
        if not 0 <= frame.echo_stamp <= STAMP_MASK:
            raise LocalProtocolError(f"ack echoes stamp {frame.echo_stamp}, not a u24")
        parts = [_pack(_ACK_HEAD, frame.echo_stamp, delay_us, len(frame.ranges))]
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
    elif isinstance(frame, RangesMissing):
        _check_ranges(frame.ranges, LocalProtocolError)
        body = _pack(_REPAIR_REQUEST_HEAD, frame.msg_id, len(frame.ranges)) + b"".join(
            _pack(_RANGE, start, end) for start, end in frame.ranges
        )
        kind = CTRL_RANGES_MISSING
    elif isinstance(frame, Credit):
        body = _pack(_CREDIT, frame.granted_bytes)
        kind = CTRL_CREDIT
    else:
        reason = frame.reason.encode()[:1024]
        body = _pack(_REJECTED, frame.msg_id, frame.code) + reason
        kind = CTRL_REJECTED
    return _CTRL.pack(kind, len(body)) + body


def _check_ranges(
    ranges: tuple[tuple[int, int], ...], error: type[LocalProtocolError | RemoteProtocolError]
) -> None:
    if not 0 < len(ranges) <= MAX_MISSING_RANGES:
        raise error(f"a missing-ranges frame names 1..{MAX_MISSING_RANGES} ranges")
    previous_end = 0
    for start, end in ranges:
        if not previous_end <= start < end:
            raise error(f"missing range {start}..{end} is empty, reversed or out of order")
        previous_end = end


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
        if echo > STAMP_MASK:
            raise RemoteProtocolError(f"ack echoes stamp {echo}, not a u24")
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
    if kind == CTRL_RANGES_MISSING:
        if len(body) < _REPAIR_REQUEST_HEAD.size:
            raise RemoteProtocolError("missing-ranges frame truncated")
        msg_id, count = _REPAIR_REQUEST_HEAD.unpack_from(body)
        rest = body[_REPAIR_REQUEST_HEAD.size :]
        if len(rest) != count * _RANGE.size:
            raise RemoteProtocolError("missing-ranges frame length does not match its count")
        ranges = tuple(_RANGE.iter_unpack(rest))
        _check_ranges(ranges, RemoteProtocolError)
        return RangesMissing(msg_id, ranges)
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
