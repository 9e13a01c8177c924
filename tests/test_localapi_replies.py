"""Typed replies: every golden reply vector decodes as the answer to its request and
encodes back to the same bytes; anything but the spec's key set is refused."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_localapi_protocol import LIMIT, REPLY_VECTORS, load_vector
from wangate.errors import ErrorCode
from wangate.localapi.protocol import (
    ClaimRequest,
    FrameError,
    HelloRequest,
    PingRequest,
    RecvRequest,
    Request,
    ResetPathRequest,
    SendRequest,
    StreamProgress,
    WaitRequest,
    decode_progress,
    decode_reply,
    encode_header,
    split_frame,
)
from wangate.localapi.replies import (
    DoneReply,
    ErrorReply,
    HelloReply,
    ProgressReply,
    RecvReply,
    SendReply,
    decode_answer,
    reply_header,
)

SEND = SendRequest(2, "sh", "g", 0, False, b"", 0)
RECV = RecvRequest(3, "g", None, None, None)
HELLO = HelloRequest(1)
# the request each reply vector answers; a streaming recv's later replies are progress
ANSWERS: dict[str, Request] = {
    "ping_reply": PingRequest(7),
    "hello_reply": HelloRequest(1),
    "hello_job_reply": HelloRequest(1, "llama-run3"),
    "claim_reply": ClaimRequest(13, "allreduce/ddp.b0", 3),
    "send_reply": SEND,
    "send_released_reply": SEND,
    "recv_reply": RECV,
    "recv_segment_reply": RECV,
    "recv_lent_segment_reply": RECV,
    "recv_stream_reply": RECV,
    "wait_reply": WaitRequest(9, "sh", 41, None),
    "reset_path_reply": ResetPathRequest(11, "sh", "fiber-a"),
}


@pytest.mark.parametrize("name", sorted(REPLY_VECTORS))
def test_reply_vectors_decode_typed_and_reencode_exactly(name: str) -> None:
    raw = load_vector(name)
    frame = split_frame(raw, LIMIT)
    assert frame is not None
    header = decode_reply(frame.header)
    released = header.get("released", [])
    if not header["ok"]:
        typed: Any = decode_answer(PingRequest(0), header)
        assert isinstance(typed, ErrorReply)
    elif name in ANSWERS:
        typed = decode_answer(ANSWERS[name], header)
    else:  # a streaming recv's progress, of a 1 MiB message
        typed = ProgressReply(header["id"], decode_progress(header, 1 << 20))
    assert (
        encode_header(reply_header(typed, released), len(frame.payload))
        == raw[: len(raw) - len(frame.payload)]
    )


def test_typed_fields() -> None:
    header = decode_reply(split_frame(load_vector("recv_stream_reply"), LIMIT).header)  # type: ignore[union-attr]
    reply = decode_answer(RECV, header)
    assert isinstance(reply, RecvReply)
    assert reply.segment == (64, 1 << 20) and reply.progress == StreamProgress(4096, False)
    assert reply.segment_id == 0  # a streamed segment is never lent
    header = decode_reply(split_frame(load_vector("recv_lent_segment_reply"), LIMIT).header)  # type: ignore[union-attr]
    lent = decode_answer(RECV, header)
    assert isinstance(lent, RecvReply) and (lent.segment, lent.segment_id) == ((64, 8), 7)
    sent = decode_answer(SEND, {"ok": True, "id": 6, "message_id": 42, "released": [5]})
    assert sent == SendReply(6, 42)
    assert reply_header(DoneReply(4), [1, 2]) == {"ok": True, "id": 4, "released": [1, 2]}


def test_the_hello_reply_names_the_job_and_a_reply_without_one_is_default() -> None:
    header = decode_reply(split_frame(load_vector("hello_job_reply"), LIMIT).header)  # type: ignore[union-attr]
    reply = decode_answer(HelloRequest(1, "llama-run3"), header)
    assert isinstance(reply, HelloReply) and (reply.site, reply.job) == ("bj", "llama-run3")
    # a gateway before jobs leaves the key out: the connection is in the default job
    older = {k: v for k, v in header.items() if k != "job"}
    reply = decode_answer(HelloRequest(1), older)
    assert isinstance(reply, HelloReply) and reply.job == "default"
    assert decode_answer(ClaimRequest(13, "allreduce/ddp.b0", 3), {"ok": True, "id": 13}) == (
        DoneReply(13)
    )


LENT = {
    "ok": True,
    "id": 3,
    "source": "bj",
    "tag": "g",
    "step": 1,
    "critical": False,
    "meta": b"",
    "checksum": 0,
    "segment": [64, 8],
    "segment_id": 7,
}


@pytest.mark.parametrize(
    "request_, header",
    [
        (SEND, {"ok": True, "id": 2}),  # missing
        (SEND, {"ok": True, "id": 2, "message_id": 1, "more": 1}),  # extra
        (SEND, {"ok": True, "id": 2, "message_id": True}),  # a boolean is not an integer
        (SEND, {"ok": True, "id": 2, "message_id": 1, "released": [0]}),
        (PingRequest(1), {"ok": True, "id": None}),
        (PingRequest(1), {"ok": True, "id": 1, "paths": []}),
        (RECV, {"ok": True, "id": 3, "source": "bj"}),
        (RECV, {**LENT, "segment_id": 0}),
        (RECV, {**LENT, "segment_id": 2**32}),
        (RECV, {**LENT, "segment_id": "7"}),
        (RECV, {k: v for k, v in LENT.items() if k != "segment"}),  # an id of no segment
        (
            HELLO,
            {
                "ok": True,
                "id": 1,
                "protocol": 1,
                "site": "bj",
                "version": "0",
                "client_settings": {},
                "job": 3,
            },
        ),
        (ClaimRequest(13, "barrier/b", 0), {"ok": True, "id": 13, "message_id": 1}),
    ],
)
def test_anything_but_the_key_set_is_refused(request_: Request, header: dict[str, Any]) -> None:
    with pytest.raises(FrameError) as info:
        decode_answer(request_, header)
    assert info.value.code == ErrorCode.BAD_REPLY
