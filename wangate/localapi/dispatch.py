"""A request's call on the ``GatewayService``, and the reply it makes.

Every failure becomes its reply here, once (``failure_reply``): a ``GatewayError``
with its code, anything else as ``internal`` after it is logged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace

from wangate import __version__
from wangate.core.buffer import Buffer
from wangate.delivery.delivered import Delivery
from wangate.delivery.streams import IncomingStream
from wangate.errors import ErrorCode, GatewayError
from wangate.localapi.protocol import (
    VERSION,
    ClaimRequest,
    HelloRequest,
    PathsRequest,
    RecvRequest,
    Request,
    ResetPathRequest,
    SendRequest,
    StatusRequest,
    WaitRequest,
)
from wangate.localapi.replies import (
    DoneReply,
    ErrorReply,
    HelloReply,
    PathsReply,
    RecvReply,
    Reply,
    SendReply,
    StatusReply,
    WaitReply,
)
from wangate.service import Claimant, GatewayService, Submission
from wangate.shm import source_of

log = logging.getLogger("wangate.localapi")


@dataclass(frozen=True)
class Handed:
    """A reply payload that goes as a segment: its descriptor travels with the reply."""

    fd: int


ReplyPayload = Buffer | Handed


def failure_reply(request_id: int | None, exc: Exception, what: object) -> ErrorReply:
    """The reply to a request (``what``, for the log) that raised ``exc``; call it in
    the ``except`` block, so that an unexpected error is logged with its traceback."""
    if isinstance(exc, GatewayError):
        return ErrorReply(request_id, exc.code, str(exc))
    log.exception("local API request %r failed", what)
    return ErrorReply(request_id, ErrorCode.INTERNAL, f"gateway error: {exc}")


def submission(request: SendRequest, payload: Buffer, job: str) -> Submission:
    return Submission(
        peer=request.peer,
        tag=request.tag,
        step=request.step,
        critical=request.critical,
        meta=request.meta,
        payload=payload,
        checksum=request.checksum,
        deadline_s=request.deadline_s,
        segment=source_of(payload),
        job=job,
    )


def message_reply(rid: int, message: Delivery | IncomingStream) -> RecvReply:
    """What a recv reply says of its message, whole or streamed (proto/localapi.md)."""
    return RecvReply(
        rid,
        message.source,
        message.tag,
        message.step,
        message.critical,
        message.meta,
        message.checksum,
    )


def recv_reply(rid: int, delivery: Delivery, segments: bool) -> tuple[RecvReply, ReplyPayload]:
    reply = message_reply(rid, delivery)
    fd = delivery.segment_fd
    if fd is None:
        return reply, delivery.payload
    if not segments:
        os.close(fd)  # in-band, from the gateway's own mapping of it
        return reply, delivery.payload
    view = memoryview(delivery.payload)
    offset = memoryview(view.obj).nbytes - view.nbytes  # the payload ends the body
    placed = replace(reply, segment=(offset, view.nbytes), segment_id=delivery.segment_id)
    return placed, Handed(fd)


async def dispatch(
    service: GatewayService,
    request: Request,
    payload: Buffer,
    job: str,
    claimant: Claimant,
) -> tuple[Reply, ReplyPayload]:
    """Carry out every request but a streaming recv, in ``job`` (the connection's,
    admitted already); raises what the service raised."""
    rid = request.request_id
    if isinstance(request, SendRequest):
        return SendReply(rid, await service.submit(submission(request, payload, job))), b""
    if isinstance(request, RecvRequest):
        delivery = await service.receive(
            request.tag,
            request.source,
            request.step,
            request.timeout_s,
            job,
            claimant.connection if request.returns else None,
        )
        return recv_reply(rid, delivery, request.segments)
    if isinstance(request, HelloRequest):
        settings = service.client_settings(job)
        hello = HelloReply(rid, VERSION, service.site_name, __version__, settings, job)
        return hello, b""
    if isinstance(request, PathsRequest):
        return PathsReply(rid, [row.to_dict() for row in service.paths()]), b""
    if isinstance(request, StatusRequest):
        return StatusReply(rid, service.status().to_dict()), b""
    if isinstance(request, ClaimRequest):
        service.claim(job, request.call, request.step, claimant)
        return DoneReply(rid), b""
    if isinstance(request, ResetPathRequest):
        service.reset_path(request.peer, request.path)
        return DoneReply(rid), b""
    if isinstance(request, WaitRequest):
        await service.wait_message(request.peer, request.message_id, request.timeout_s, job)
        return WaitReply(rid, "taken"), b""
    return DoneReply(rid), b""
