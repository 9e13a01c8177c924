"""Local API replies, typed like the requests (proto/localapi.md, "Replies").

The gateway builds one of these per reply and ``reply_header`` gives its msgpack map,
keys in a fixed order, so that encodings are byte-exact (the golden vectors in
proto/vectors). A client, knowing which request a reply answers, reads it back with
``decode_answer``: exactly the keys the spec lists for that op (``released`` allowed
on any success), each of its type, or ``FrameError`` (code ``bad_reply``).

Everything here is pure: values in, maps out, and back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from wangate.core.jobs import DEFAULT_JOB
from wangate.errors import ErrorCode
from wangate.localapi.protocol import (
    MAX_CHECKSUM,
    MAX_ID,
    ClaimRequest,
    FrameError,
    HelloRequest,
    PathsRequest,
    PingRequest,
    RecvRequest,
    Request,
    ResetPathRequest,
    SendRequest,
    StatusRequest,
    StreamProgress,
    WaitRequest,
    segment_field,
)

T = TypeVar("T")


@dataclass(frozen=True)
class ErrorReply:
    """A request failed (``request_id`` None when its id could not be read)."""

    request_id: int | None
    code: str
    message: str


@dataclass(frozen=True)
class HelloReply:
    request_id: int
    protocol: int
    site: str
    version: str
    client_settings: dict[str, Any]
    job: str = DEFAULT_JOB  # the job the connection is in


@dataclass(frozen=True)
class SendReply:
    request_id: int
    message_id: int  # the gateway's id for the accepted message


@dataclass(frozen=True)
class RecvReply:
    """A message for a ``recv``: its payload follows in-band, or as ``segment``."""

    request_id: int
    source: str
    tag: str
    step: int
    critical: bool
    meta: bytes
    checksum: int
    segment: tuple[int, int] | None = None  # (offset, length) in the descriptor sent with it
    segment_id: int = 0  # ≥ 1: the client returns the segment by it (``recv``'s ``returned``)
    # a streaming recv's first reply: how much of the payload is in, and whether all
    progress: StreamProgress | None = None


@dataclass(frozen=True)
class ProgressReply:
    """A later reply to a streaming ``recv``."""

    request_id: int
    progress: StreamProgress


@dataclass(frozen=True)
class PathsReply:
    request_id: int
    paths: list[dict[str, Any]]  # ``wangate.rows.PathRow`` maps


@dataclass(frozen=True)
class StatusReply:
    request_id: int
    status: dict[str, Any]  # a ``wangate.rows.GatewayStatus`` map


@dataclass(frozen=True)
class WaitReply:
    request_id: int
    outcome: str  # "taken"


@dataclass(frozen=True)
class DoneReply:
    """Success and nothing more: ``ping`` and ``reset_path``."""

    request_id: int


Reply = (
    ErrorReply
    | HelloReply
    | SendReply
    | RecvReply
    | ProgressReply
    | PathsReply
    | StatusReply
    | WaitReply
    | DoneReply
)


# ---------------------------------------------------------------- encoding


def _message_fields(reply: RecvReply) -> dict[str, Any]:
    return {
        "source": reply.source,
        "tag": reply.tag,
        "step": reply.step,
        "critical": reply.critical,
        "meta": reply.meta,
        "checksum": reply.checksum,
    }


def _fields(reply: Reply) -> dict[str, Any]:
    """What a success reply carries besides ``ok`` and ``id``, in wire order."""
    if isinstance(reply, HelloReply):
        return {
            "protocol": reply.protocol,
            "site": reply.site,
            "version": reply.version,
            "client_settings": reply.client_settings,
            "job": reply.job,
        }
    if isinstance(reply, SendReply):
        return {"message_id": reply.message_id}
    if isinstance(reply, RecvReply):
        fields = _message_fields(reply)
        if reply.segment is not None:
            fields["segment"] = list(reply.segment)
            if reply.segment_id:
                fields["segment_id"] = reply.segment_id
        if reply.progress is not None:
            fields |= {"ready": reply.progress.ready_bytes, "done": reply.progress.done}
        return fields
    if isinstance(reply, ProgressReply):
        return {"ready": reply.progress.ready_bytes, "done": reply.progress.done}
    if isinstance(reply, PathsReply):
        return {"paths": reply.paths}
    if isinstance(reply, StatusReply):
        return {"status": reply.status}
    if isinstance(reply, WaitReply):
        return {"outcome": reply.outcome}
    return {}


def reply_header(reply: Reply, released: Sequence[int] = ()) -> dict[str, Any]:
    """The msgpack map for ``reply``; a success names the segments ``released`` last."""
    if isinstance(reply, ErrorReply):
        return {"ok": False, "id": reply.request_id, "code": reply.code, "error": reply.message}
    header = {"ok": True, "id": reply.request_id, **_fields(reply)}
    if released:
        header["released"] = list(released)
    return header


# ---------------------------------------------------------------- decoding


def _malformed(header: dict[str, Any], what: str) -> FrameError:
    return FrameError(ErrorCode.BAD_REPLY, what, header.get("id"))


def _value(header: dict[str, Any], key: str, kind: type[T]) -> T:
    value = header[key]
    if type(value) is not kind:
        raise _malformed(header, f"{key!r} must be {kind.__name__}")
    return value


def _count(header: dict[str, Any], key: str, high: int) -> int:
    value = _value(header, key, int)
    if not 0 <= value <= high:
        raise _malformed(header, f"{key!r} must be an integer in 0..{high}")
    return value


def released_of(header: dict[str, Any]) -> list[int]:
    """The ``segment_id``s a success reply says the gateway let go of."""
    released = header.get("released", [])
    if type(released) is not list or not all(
        type(token) is int and 1 <= token <= MAX_ID for token in released
    ):
        raise _malformed(header, f"'released' must be a list of integers in 1..{MAX_ID}")
    return released


def _keys(header: dict[str, Any], required: frozenset[str], optional: frozenset[str]) -> None:
    present = header.keys() - {"ok", "id", "released"}
    if not required <= present <= required | optional:
        raise _malformed(
            header,
            f"expected keys {sorted(required)} (optional {sorted(optional)}), "
            f"got {sorted(present)}",
        )


_NONE: frozenset[str] = frozenset()
_JOB = frozenset({"job"})  # a gateway before jobs leaves it out
_MESSAGE_KEYS = frozenset({"source", "tag", "step", "critical", "meta", "checksum"})


def _hello(header: dict[str, Any], rid: int) -> HelloReply:
    _keys(header, frozenset({"protocol", "site", "version", "client_settings"}), _JOB)
    return HelloReply(
        rid,
        _value(header, "protocol", int),
        _value(header, "site", str),
        _value(header, "version", str),
        _value(header, "client_settings", dict),
        _value(header, "job", str) if "job" in header else DEFAULT_JOB,
    )


def _send(header: dict[str, Any], rid: int) -> SendReply:
    _keys(header, frozenset({"message_id"}), _NONE)
    return SendReply(rid, _count(header, "message_id", 2**63 - 1))


def _recv(header: dict[str, Any], rid: int) -> RecvReply:
    _keys(header, _MESSAGE_KEYS, frozenset({"segment", "segment_id", "ready", "done"}))
    segment = header.get("segment")
    segment_id = header.get("segment_id", 0)
    if "segment_id" in header and (
        segment is None or type(segment_id) is not int or not 1 <= segment_id <= MAX_ID
    ):
        raise _malformed(header, f"'segment_id' must be an integer in 1..{MAX_ID}, with 'segment'")
    progress = None
    if "ready" in header or "done" in header:
        progress = StreamProgress(_count(header, "ready", 2**63 - 1), _value(header, "done", bool))
    try:
        place = None if segment is None else segment_field(segment, rid)
    except FrameError as exc:
        raise _malformed(header, str(exc)) from None
    return RecvReply(
        rid,
        _value(header, "source", str),
        _value(header, "tag", str),
        _count(header, "step", 2**63 - 1),
        _value(header, "critical", bool),
        _value(header, "meta", bytes),
        _count(header, "checksum", MAX_CHECKSUM),
        place,
        segment_id,
        progress,
    )


def _paths(header: dict[str, Any], rid: int) -> PathsReply:
    _keys(header, frozenset({"paths"}), _NONE)
    paths = _value(header, "paths", list)
    if not all(type(row) is dict for row in paths):
        raise _malformed(header, "'paths' must be a list of maps")
    return PathsReply(rid, paths)


def _status(header: dict[str, Any], rid: int) -> StatusReply:
    _keys(header, frozenset({"status"}), _NONE)
    return StatusReply(rid, _value(header, "status", dict))


def _wait(header: dict[str, Any], rid: int) -> WaitReply:
    _keys(header, frozenset({"outcome"}), _NONE)
    return WaitReply(rid, _value(header, "outcome", str))


def _done(header: dict[str, Any], rid: int) -> DoneReply:
    _keys(header, _NONE, _NONE)
    return DoneReply(rid)


_DECODERS: dict[type[Request], Callable[[dict[str, Any], int], Reply]] = {
    HelloRequest: _hello,
    SendRequest: _send,
    RecvRequest: _recv,
    PathsRequest: _paths,
    StatusRequest: _status,
    WaitRequest: _wait,
    PingRequest: _done,
    ResetPathRequest: _done,
    ClaimRequest: _done,
}


def decode_answer(request: Request, header: dict[str, Any]) -> Reply:
    """The reply ``header`` (already through ``decode_reply``) as the answer to
    ``request``: an ``ErrorReply``, or the success reply of its op."""
    if not header["ok"]:
        return ErrorReply(header["id"], header["code"], header["error"])
    rid = header["id"]
    if rid is None:
        raise _malformed(header, "a success reply needs an integer 'id'")
    released_of(header)
    return _DECODERS[type(request)](header, rid)
