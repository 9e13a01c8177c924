"""Local API wire format: frames between trainers and their site's gateway (proto/localapi.md).

A frame is a fixed 16-byte prefix, a msgpack header, then raw payload bytes::

    "WG" | version u8 | flags u8 | header_len u32 | payload_len u64     (big-endian)

The payload length lives in the prefix, not in the header, so a reader always knows
where the next frame starts: a header it cannot understand costs one error reply,
not the connection. Tensor bytes never pass through msgpack; the I/O layer reads
them straight into one preallocated buffer after checking ``payload_len``.

Everything here is pure: bytes in, values (or ``FrameError``) out.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from wangate.core.jobs import job_name_error
from wangate.errors import ErrorCode, RemoteProtocolError

MAGIC = b"WG"
VERSION = 1
PREFIX = struct.Struct("!2sBBIQ")
PREFIX_BYTES = PREFIX.size  # 16
MAX_HEADER_BYTES = 64 * 1024
MAX_NAME_BYTES = 256  # peer, source and tag names, UTF-8 encoded
MAX_ID = 2**32 - 1
MAX_STEP = 2**63 - 1
MAX_CHECKSUM = 2**32 - 1

OPS = ("hello", "send", "recv", "paths", "status", "ping", "reset_path", "wait", "claim")
REQUEST_KEYS: dict[str, frozenset[str]] = {
    "hello": frozenset({"op", "id"}),
    "send": frozenset({"op", "id", "peer", "tag", "step", "critical", "meta", "checksum"}),
    "recv": frozenset({"op", "id", "tag", "source", "step", "timeout_s"}),
    "paths": frozenset({"op", "id"}),
    "status": frozenset({"op", "id"}),
    "ping": frozenset({"op", "id"}),
    "reset_path": frozenset({"op", "id", "peer", "path"}),
    "wait": frozenset({"op", "id", "peer", "message_id", "timeout_s"}),
    "claim": frozenset({"op", "id", "call", "step"}),
}
OPTIONAL_KEYS: dict[str, frozenset[str]] = {
    "hello": frozenset({"job"}),
    "send": frozenset({"deadline_s", "segment", "segment_id"}),
    "recv": frozenset({"segments", "stream", "returns", "returned"}),
}
MAX_RETURNED = 1024  # segment ids one recv may return
ERROR_KEYS = frozenset({"ok", "id", "code", "error"})

# Error codes that leave the stream unusable: the reader cannot find the next frame.
FATAL_CODES = frozenset(code for code in ErrorCode if code.closes_connection)


class FrameError(RemoteProtocolError):
    """A frame breaks the local API protocol: the other side (a trainer, for the
    gateway; the gateway, for a client) sent something malformed.

    ``code`` is the error code sent back; ``request_id`` the request's id when the
    header got far enough to tell; ``fatal`` means the connection must close because
    the position of the next frame is unknown (or too costly to reach).
    """

    def __init__(self, code: str, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id

    @property
    def fatal(self) -> bool:
        return self.code in FATAL_CODES


@dataclass(frozen=True)
class FramePrefix:
    version: int
    flags: int
    header_bytes: int
    payload_bytes: int


@dataclass(frozen=True)
class HelloRequest:
    request_id: int
    job: str | None = None  # the job this connection's calls are in; None: "default"


@dataclass(frozen=True)
class SendRequest:
    request_id: int
    peer: str
    tag: str
    step: int
    critical: bool
    meta: bytes
    checksum: int
    deadline_s: float | None = None  # fail the message if not delivered by then
    # (offset, length) in the shared-memory segment passed with the frame; no payload
    segment: tuple[int, int] | None = None
    # the client reuses the segment: name this hand-over in a later reply's "released"
    segment_id: int | None = None


@dataclass(frozen=True)
class RecvRequest:
    request_id: int
    tag: str
    source: str | None
    step: int | None
    timeout_s: float | None
    segments: bool = False  # the client takes a large payload as a shared-memory segment
    # the reply may come while the message still arrives, followed by progress replies
    stream: bool = False
    # the client returns the segment it takes (``segment_id``) once its mapping is gone
    returns: bool = False
    returned: tuple[int, ...] = ()  # earlier segments' ids, whose mappings are gone


@dataclass(frozen=True)
class PathsRequest:
    request_id: int


@dataclass(frozen=True)
class StatusRequest:
    request_id: int


@dataclass(frozen=True)
class PingRequest:
    request_id: int


@dataclass(frozen=True)
class ResetPathRequest:
    """Close one path's connection now (it reconnects by itself): for operators and tests."""

    request_id: int
    peer: str
    path: str


@dataclass(frozen=True)
class WaitRequest:
    """Wait until a trainer at ``peer`` took message ``message_id`` (proto/delivery.md)."""

    request_id: int
    peer: str
    message_id: int
    timeout_s: float | None


@dataclass(frozen=True)
class ClaimRequest:
    """Enter collective ``call`` (``kind/tag``) at ``step``: fails with ``collision``
    while another trainer of the job at this site is in it (proto/collective.md)."""

    request_id: int
    call: str
    step: int


Request = (
    HelloRequest
    | ClaimRequest
    | SendRequest
    | RecvRequest
    | PathsRequest
    | StatusRequest
    | PingRequest
    | WaitRequest
    | ResetPathRequest
)


# ---------------------------------------------------------------- prefix


def encode_prefix(header_bytes: int, payload_bytes: int, flags: int = 0) -> bytes:
    return PREFIX.pack(MAGIC, VERSION, flags, header_bytes, payload_bytes)


def decode_prefix(data: bytes | bytearray | memoryview, max_payload_bytes: int) -> FramePrefix:
    """Check the 16-byte prefix; every failure here is fatal for the connection."""
    if len(data) != PREFIX_BYTES:
        raise FrameError(ErrorCode.BAD_MAGIC, f"frame prefix must be {PREFIX_BYTES} bytes")
    magic, version, flags, header_bytes, payload_bytes = PREFIX.unpack(data)
    if magic != MAGIC:
        raise FrameError(ErrorCode.BAD_MAGIC, f"not a wangate frame (starts with {bytes(magic)!r})")
    if version != VERSION:
        raise FrameError(
            ErrorCode.BAD_VERSION,
            f"protocol version {version} not supported (this side speaks {VERSION})",
        )
    if flags != 0:
        raise FrameError(ErrorCode.BAD_FLAGS, f"unknown frame flags 0x{flags:02x}")
    if header_bytes == 0 or header_bytes > MAX_HEADER_BYTES:
        raise FrameError(
            ErrorCode.HEADER_TOO_LARGE,
            f"header length {header_bytes} outside 1..{MAX_HEADER_BYTES}",
        )
    if payload_bytes > max_payload_bytes:
        raise FrameError(
            ErrorCode.TOO_LARGE,
            f"payload of {payload_bytes} bytes exceeds the gateway's limit of "
            f"{max_payload_bytes} bytes (max_message_bytes)",
        )
    return FramePrefix(version, flags, header_bytes, payload_bytes)


# ---------------------------------------------------------------- headers


def _unpack_map(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    size = len(data)
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=size,
            max_bin_len=size,
            max_array_len=size,
            max_map_len=size,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated classes
        raise FrameError(ErrorCode.BAD_HEADER, f"header is not valid msgpack: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(
            ErrorCode.BAD_HEADER, f"header must be a msgpack map, got {type(obj).__name__}"
        )
    if not all(type(key) is str for key in obj):  # strict_map_key lets bin keys through
        raise FrameError(ErrorCode.BAD_HEADER, "header keys must be msgpack strings")
    return obj


def _pack(obj: dict[str, Any]) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def encode_header(header: dict[str, Any], payload_bytes: int = 0) -> bytes:
    """Prefix plus msgpack header; the caller writes the payload bytes after it."""
    body = _pack(header)
    if len(body) > MAX_HEADER_BYTES:
        raise FrameError(
            ErrorCode.HEADER_TOO_LARGE, f"header of {len(body)} bytes exceeds the limit"
        )
    return encode_prefix(len(body), payload_bytes) + body


def _request_id(header: dict[str, Any]) -> int | None:
    rid = header.get("id")
    return rid if type(rid) is int and 0 <= rid <= MAX_ID else None


def _name(header: dict[str, Any], key: str, rid: int, *, optional: bool = False) -> Any:
    value = header[key]
    if value is None and optional:
        return None
    if type(value) is not str or not value or len(value.encode()) > MAX_NAME_BYTES:
        raise FrameError(
            ErrorCode.BAD_REQUEST,
            f"{key!r} must be a non-empty string of at most {MAX_NAME_BYTES} UTF-8 bytes",
            rid,
        )
    return value


def _int(header: dict[str, Any], key: str, rid: int, high: int, *, optional: bool = False) -> Any:
    value = header[key]
    if value is None and optional:
        return None
    if type(value) is not int or not 0 <= value <= high:
        raise FrameError(ErrorCode.BAD_REQUEST, f"{key!r} must be an integer in 0..{high}", rid)
    return value


def segment_field(value: Any, rid: int | None) -> tuple[int, int]:
    """``[offset, length]`` of a payload in a shared-memory segment."""
    if (
        type(value) is not list
        or len(value) != 2
        or not all(type(v) is int and 0 <= v <= MAX_STEP for v in value)
    ):
        raise FrameError(
            ErrorCode.BAD_REQUEST,
            f"'segment' must be [offset, length], integers in 0..{MAX_STEP}",
            rid,
        )
    return value[0], value[1]


def decode_request(data: bytes | bytearray | memoryview, payload_bytes: int) -> Request:
    """Validate a request header (exact key set per op, exact types)."""
    header = _unpack_map(data)
    rid = _request_id(header)
    op = header.get("op")
    if type(op) is not str:
        raise FrameError(ErrorCode.BAD_REQUEST, "'op' must be a string", rid)
    if op not in REQUEST_KEYS:
        raise FrameError(ErrorCode.UNKNOWN_OP, f"unknown op {op!r}; known: {', '.join(OPS)}", rid)
    expected = REQUEST_KEYS[op]
    allowed = expected | OPTIONAL_KEYS.get(op, frozenset())
    if not expected <= header.keys() <= allowed:
        missing = sorted(expected - header.keys())
        extra = sorted(header.keys() - allowed)
        raise FrameError(
            ErrorCode.BAD_REQUEST, f"{op}: missing keys {missing}, unexpected keys {extra}", rid
        )
    if rid is None:
        raise FrameError(ErrorCode.BAD_REQUEST, f"'id' must be an integer in 0..{MAX_ID}")
    if op != "send" and payload_bytes != 0:
        raise FrameError(ErrorCode.BAD_REQUEST, f"{op} carries no payload", rid)
    if op == "send":
        meta = header["meta"]
        if type(meta) is not bytes:
            raise FrameError(ErrorCode.BAD_REQUEST, "'meta' must be msgpack bin", rid)
        if type(header["critical"]) is not bool:
            raise FrameError(ErrorCode.BAD_REQUEST, "'critical' must be a boolean", rid)
        deadline_s = header.get("deadline_s")
        if deadline_s is not None and (
            type(deadline_s) not in (int, float) or not math.isfinite(deadline_s) or deadline_s <= 0
        ):
            raise FrameError(ErrorCode.BAD_REQUEST, "'deadline_s' must be a number > 0 or nil", rid)
        segment = header.get("segment")
        if segment is not None:
            segment = segment_field(segment, rid)
            if payload_bytes != 0:
                raise FrameError(
                    ErrorCode.BAD_REQUEST, "a send with a segment carries no payload", rid
                )
        segment_id = header.get("segment_id")
        if segment_id is not None and (
            type(segment_id) is not int or not 1 <= segment_id <= MAX_ID or segment is None
        ):
            raise FrameError(
                ErrorCode.BAD_REQUEST, f"'segment_id' must be 1..{MAX_ID}, with a 'segment'", rid
            )
        return SendRequest(
            rid,
            _name(header, "peer", rid),
            _name(header, "tag", rid),
            _int(header, "step", rid, MAX_STEP),
            header["critical"],
            meta,
            _int(header, "checksum", rid, MAX_CHECKSUM),
            None if deadline_s is None else float(deadline_s),
            segment,
            segment_id,
        )
    if op in ("recv", "wait"):
        timeout_s = header["timeout_s"]
        if timeout_s is not None and (
            type(timeout_s) not in (int, float) or not math.isfinite(timeout_s) or timeout_s < 0
        ):
            raise FrameError(ErrorCode.BAD_REQUEST, "'timeout_s' must be a number >= 0 or nil", rid)
    if op == "wait":
        return WaitRequest(
            rid,
            _name(header, "peer", rid),
            _int(header, "message_id", rid, MAX_STEP),
            None if timeout_s is None else float(timeout_s),
        )
    if op == "recv":
        segments = header.get("segments", False)
        if type(segments) is not bool:
            raise FrameError(ErrorCode.BAD_REQUEST, "'segments' must be a boolean", rid)
        stream = header.get("stream", False)
        if type(stream) is not bool or (stream and not segments):
            raise FrameError(
                ErrorCode.BAD_REQUEST, "'stream' must be a boolean, true only with 'segments'", rid
            )
        returns = header.get("returns", False)
        if type(returns) is not bool or (returns and not segments):
            raise FrameError(
                ErrorCode.BAD_REQUEST, "'returns' must be a boolean, true only with 'segments'", rid
            )
        returned = header.get("returned", [])
        if (
            type(returned) is not list
            or len(returned) > MAX_RETURNED
            or not all(type(i) is int and 1 <= i <= MAX_ID for i in returned)
        ):
            raise FrameError(
                ErrorCode.BAD_REQUEST,
                f"'returned' must be a list of at most {MAX_RETURNED} integers in 1..{MAX_ID}",
                rid,
            )
        return RecvRequest(
            rid,
            _name(header, "tag", rid),
            _name(header, "source", rid, optional=True),
            _int(header, "step", rid, MAX_STEP, optional=True),
            None if timeout_s is None else float(timeout_s),
            segments,
            stream,
            returns,
            tuple(returned),
        )
    if op == "hello":
        job = header.get("job")
        if job is not None:
            refused = job_name_error(job)
            if refused is not None:
                raise FrameError(ErrorCode.BAD_REQUEST, refused, rid)
        return HelloRequest(rid, job)
    if op == "claim":
        return ClaimRequest(rid, _name(header, "call", rid), _int(header, "step", rid, MAX_STEP))
    if op == "paths":
        return PathsRequest(rid)
    if op == "status":
        return StatusRequest(rid)
    if op == "reset_path":
        return ResetPathRequest(rid, _name(header, "peer", rid), _name(header, "path", rid))
    return PingRequest(rid)


def request_header(request: Request) -> dict[str, Any]:
    """The msgpack map for ``request`` (key order fixed, so encodings are byte-exact)."""
    if isinstance(request, SendRequest):
        return (
            {
                "op": "send",
                "id": request.request_id,
                "peer": request.peer,
                "tag": request.tag,
                "step": request.step,
                "critical": request.critical,
                "meta": request.meta,
                "checksum": request.checksum,
            }
            | ({} if request.deadline_s is None else {"deadline_s": request.deadline_s})
            | ({} if request.segment is None else {"segment": list(request.segment)})
            | ({} if request.segment_id is None else {"segment_id": request.segment_id})
        )
    if isinstance(request, RecvRequest):
        return (
            {
                "op": "recv",
                "id": request.request_id,
                "tag": request.tag,
                "source": request.source,
                "step": request.step,
                "timeout_s": request.timeout_s,
            }
            | ({"segments": True} if request.segments else {})
            | ({"stream": True} if request.stream else {})
            | ({"returns": True} if request.returns else {})
            | ({"returned": list(request.returned)} if request.returned else {})
        )
    if isinstance(request, WaitRequest):
        return {
            "op": "wait",
            "id": request.request_id,
            "peer": request.peer,
            "message_id": request.message_id,
            "timeout_s": request.timeout_s,
        }
    if isinstance(request, ResetPathRequest):
        return {
            "op": "reset_path",
            "id": request.request_id,
            "peer": request.peer,
            "path": request.path,
        }
    if isinstance(request, ClaimRequest):
        return {"op": "claim", "id": request.request_id, "call": request.call, "step": request.step}
    if isinstance(request, HelloRequest) and request.job is not None:
        return {"op": "hello", "id": request.request_id, "job": request.job}
    op = {HelloRequest: "hello", PathsRequest: "paths", StatusRequest: "status"}.get(
        type(request), "ping"
    )
    return {"op": op, "id": request.request_id}


def encode_request(request: Request, payload_bytes: int = 0) -> bytes:
    return encode_header(request_header(request), payload_bytes)


def ok_reply(request_id: int, **fields: Any) -> dict[str, Any]:
    return {"ok": True, "id": request_id, **fields}


def error_reply(request_id: int | None, code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "id": request_id, "code": code, "error": message}


def decode_reply(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Validate the common part of a reply; op-specific keys are checked by the caller."""
    header = _unpack_map(data)
    ok = header.get("ok")
    rid = header.get("id")
    if type(ok) is not bool or not (rid is None or (type(rid) is int and 0 <= rid <= MAX_ID)):
        raise FrameError(
            ErrorCode.BAD_HEADER, "reply needs a boolean 'ok' and an integer or nil 'id'"
        )
    if not ok and (
        header.keys() != ERROR_KEYS
        or type(header["code"]) is not str
        or type(header["error"]) is not str
    ):
        raise FrameError(ErrorCode.BAD_HEADER, "error reply must be exactly {ok, id, code, error}")
    return header


@dataclass(frozen=True)
class StreamProgress:
    """A later reply to a streaming ``recv``: ``ready_bytes`` of the payload are in
    (contiguous from its start); ``done``: all of them, and verified."""

    ready_bytes: int
    done: bool


def decode_progress(reply: dict[str, Any], payload_bytes: int) -> StreamProgress:
    """Check a successful follow-up reply to a streaming ``recv`` (its ``ok`` and ``id``
    already checked by ``decode_reply``) against the stream's ``payload_bytes``."""
    keys = reply.keys() - {"released"}
    ready, done = reply.get("ready"), reply.get("done", False)
    if (
        not keys <= {"ok", "id", "ready", "done"}
        or type(ready) is not int
        or type(done) is not bool
        or not 0 <= ready <= payload_bytes
        or (done and ready != payload_bytes)
    ):
        raise FrameError(
            ErrorCode.BAD_HEADER,
            f"a streaming recv's progress must be {{ok, id, ready 0..{payload_bytes}, "
            f"done}} with ready = {payload_bytes} when done, got {sorted(reply)}",
        )
    return StreamProgress(ready, done)


@dataclass(frozen=True)
class DecodedFrame:
    prefix: FramePrefix
    header: bytes
    payload: bytes
    frame_bytes: int


def split_frame(
    data: bytes | bytearray | memoryview, max_payload_bytes: int
) -> DecodedFrame | None:
    """Cut the first whole frame out of ``data``; None when more bytes are needed.

    For buffers already in memory (tests, tools, golden vectors). Streaming readers use
    ``decode_prefix`` then read header and payload themselves, to avoid copies.
    """
    view = memoryview(data).cast("B")
    if len(view) < PREFIX_BYTES:
        return None
    prefix = decode_prefix(view[:PREFIX_BYTES], max_payload_bytes)
    end_header = PREFIX_BYTES + prefix.header_bytes
    end = end_header + prefix.payload_bytes
    if len(view) < end:
        return None
    return DecodedFrame(
        prefix, bytes(view[PREFIX_BYTES:end_header]), bytes(view[end_header:end]), end
    )
