"""Local API frames: encoding, validation, error codes, golden vectors, fuzzing."""

from __future__ import annotations

import contextlib
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.config.jobs import job_admission_error, unknown_job_error
from wangate.config.schema import JobConfig, JobsConfig
from wangate.errors import GatewayError, RemoteProtocolError
from wangate.gateway.claims import CollectiveClaims
from wangate.localapi.access import AccessPolicy, PeerCredentials, connection_cap_refusal
from wangate.localapi.protocol import (
    MAX_HEADER_BYTES,
    OPS,
    ClaimRequest,
    FrameError,
    HelloRequest,
    PingRequest,
    RecvRequest,
    ResetPathRequest,
    SendRequest,
    StreamProgress,
    WaitRequest,
    decode_prefix,
    decode_progress,
    decode_reply,
    decode_request,
    encode_header,
    encode_prefix,
    encode_request,
    error_reply,
    ok_reply,
    split_frame,
)
from wangate.service import Claimant

VECTORS = Path(__file__).resolve().parent.parent / "proto" / "vectors"
LIMIT = 1 << 20


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def load_vector(name: str) -> bytes:
    text = (VECTORS / f"localapi_{name}.hex").read_text()
    return bytes.fromhex(" ".join(line for line in text.splitlines() if not line.startswith("#")))


SEND = {
    "op": "send",
    "id": 5,
    "peer": "sh",
    "tag": "layer3.grad",
    "step": 12,
    "critical": False,
    "meta": b"\x01\x02",
    "checksum": 99,
}
RECV = {"op": "recv", "id": 6, "tag": "t", "source": None, "step": None, "timeout_s": 1.5}
CLAIM = {"op": "claim", "id": 13, "call": "allreduce/ddp.b0", "step": 3}


# ------------------------------------------------------------------ prefix


def test_prefix_layout_is_big_endian_magic_version_flags_lengths() -> None:
    assert encode_prefix(0x0102, 0x030405) == (
        b"WG\x01\x00" + b"\x00\x00\x01\x02" + b"\x00\x00\x00\x00\x00\x03\x04\x05"
    )


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"XG\x01\x00" + struct.pack("!IQ", 10, 0), "bad_magic"),
        (b"WG\x02\x00" + struct.pack("!IQ", 10, 0), "bad_version"),
        (b"WG\x01\x01" + struct.pack("!IQ", 10, 0), "bad_flags"),
        (b"WG\x01\x00" + struct.pack("!IQ", 0, 0), "header_too_large"),
        (b"WG\x01\x00" + struct.pack("!IQ", MAX_HEADER_BYTES + 1, 0), "header_too_large"),
        (b"WG\x01\x00" + struct.pack("!IQ", 10, LIMIT + 1), "too_large"),
        (b"WG\x01\x00" + struct.pack("!IQ", 10, 2**64 - 1), "too_large"),
    ],
)
def test_bad_prefixes_are_fatal_with_their_code(raw: bytes, code: str) -> None:
    with pytest.raises(FrameError) as info:
        decode_prefix(raw, LIMIT)
    assert info.value.code == code
    assert info.value.fatal
    assert info.value.request_id is None


def test_prefix_at_the_limits_is_accepted() -> None:
    prefix = decode_prefix(encode_prefix(MAX_HEADER_BYTES, LIMIT), LIMIT)
    assert (prefix.version, prefix.flags, prefix.header_bytes, prefix.payload_bytes) == (
        1,
        0,
        MAX_HEADER_BYTES,
        LIMIT,
    )


# ------------------------------------------------------------------ requests


def test_send_request_decodes_to_exact_values() -> None:
    request = decode_request(pack(SEND), 8)
    assert request == SendRequest(5, "sh", "layer3.grad", 12, False, b"\x01\x02", 99)


def test_send_deadline_is_optional_and_a_positive_number() -> None:
    request = decode_request(pack({**SEND, "deadline_s": 2}), 8)
    assert request == SendRequest(5, "sh", "layer3.grad", 12, False, b"\x01\x02", 99, 2.0)
    assert decode_request(pack({**SEND, "deadline_s": None}), 8) == decode_request(pack(SEND), 8)
    # without a deadline the encoding is what it always was (the golden vectors hold)
    plain = SendRequest(5, "sh", "t", 1, False, b"", 7)
    assert b"deadline_s" not in encode_request(plain, 0)
    assert b"deadline_s" in encode_request(SendRequest(5, "sh", "t", 1, False, b"", 7, 0.5), 0)


def test_hello_names_a_job_or_none_and_claim_decodes_to_exact_values() -> None:
    assert decode_request(pack({"op": "hello", "id": 1}), 0) == HelloRequest(1)
    assert decode_request(pack({"op": "hello", "id": 1, "job": None}), 0) == HelloRequest(1)
    job = decode_request(pack({"op": "hello", "id": 1, "job": "llama-run3"}), 0)
    assert job == HelloRequest(1, "llama-run3")
    # without a job the encoding is what it always was
    assert b"job" not in encode_request(HelloRequest(1))
    assert decode_request(pack(CLAIM), 0) == ClaimRequest(13, "allreduce/ddp.b0", 3)


def test_recv_request_nil_fields_and_integer_timeout() -> None:
    assert decode_request(pack(RECV), 0) == RecvRequest(6, "t", None, None, 1.5)
    request = decode_request(pack({**RECV, "source": "bj", "step": 3, "timeout_s": 2}), 0)
    assert request == RecvRequest(6, "t", "bj", 3, 2.0)
    assert isinstance(request, RecvRequest) and type(request.timeout_s) is float


@pytest.mark.parametrize(
    "request_",
    [
        HelloRequest(0),
        HelloRequest(1, "llama-run3"),
        HelloRequest(2, "j" * 64),
        ClaimRequest(5, "allreduce/ddp.b0", 0),
        ClaimRequest(6, "barrier/" + "é" * 124, 2**63 - 1),
        PingRequest(2**32 - 1),
        SendRequest(1, "sh", "é" * 128, 2**63 - 1, True, b"", 2**32 - 1),
        SendRequest(1, "sh", "t", 0, False, b"", 0, 0.125),
        RecvRequest(3, "x", "bj", 0, None),
        RecvRequest(4, "x", None, 7, 0.25),
        RecvRequest(5, "x", None, None, None, True, False, True, ()),
        RecvRequest(6, "x", None, None, None, False, False, False, tuple(range(1, 1025))),
        RecvRequest(7, "x", None, None, None, True, True, False, (2**32 - 1,)),
    ],
)
def test_requests_round_trip(request_: Any) -> None:
    frame = split_frame(encode_request(request_, 0), LIMIT)
    assert frame is not None
    assert decode_request(frame.header, 0) == request_


def bad(header: Any, payload_bytes: int = 0) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_request(pack(header), payload_bytes)
    assert not info.value.fatal
    return info.value


@pytest.mark.parametrize(
    ("header", "code", "request_id"),
    [
        ({**SEND, "extra": 1}, "bad_request", 5),
        ({k: v for k, v in SEND.items() if k != "meta"}, "bad_request", 5),
        ({**SEND, "step": -1}, "bad_request", 5),
        ({**SEND, "step": 2**63}, "bad_request", 5),
        ({**SEND, "step": 1.0}, "bad_request", 5),
        ({**SEND, "step": True}, "bad_request", 5),
        ({**SEND, "critical": 1}, "bad_request", 5),
        ({**SEND, "meta": "text"}, "bad_request", 5),
        ({**SEND, "checksum": 2**32}, "bad_request", 5),
        ({**SEND, "peer": ""}, "bad_request", 5),
        ({**SEND, "peer": None}, "bad_request", 5),
        ({**SEND, "tag": "x" * 257}, "bad_request", 5),
        ({**SEND, "tag": b"bytes"}, "bad_request", 5),
        ({**SEND, "id": -1}, "bad_request", None),
        ({**SEND, "id": 2**32}, "bad_request", None),
        ({**SEND, "id": "5"}, "bad_request", None),
        ({**SEND, "deadline_s": 0}, "bad_request", 5),
        ({**SEND, "deadline_s": -1.0}, "bad_request", 5),
        ({**SEND, "deadline_s": float("inf")}, "bad_request", 5),
        ({**SEND, "deadline_s": "1"}, "bad_request", 5),
        ({**SEND, "deadline_s": True}, "bad_request", 5),
        ({**RECV, "deadline_s": 1.0}, "bad_request", 6),
        ({**RECV, "timeout_s": -1.0}, "bad_request", 6),
        ({**RECV, "timeout_s": float("nan")}, "bad_request", 6),
        ({**RECV, "timeout_s": float("inf")}, "bad_request", 6),
        ({**RECV, "timeout_s": "1"}, "bad_request", 6),
        ({**RECV, "source": 3}, "bad_request", 6),
        ({**RECV, "returns": True}, "bad_request", 6),  # only with segments
        ({**RECV, "segments": True, "returns": 1}, "bad_request", 6),
        ({**RECV, "returned": [0]}, "bad_request", 6),
        ({**RECV, "returned": [2**32]}, "bad_request", 6),
        ({**RECV, "returned": [True]}, "bad_request", 6),
        ({**RECV, "returned": 5}, "bad_request", 6),
        ({**RECV, "returned": list(range(1, 1026))}, "bad_request", 6),  # at most 1024
        ({"op": "fly", "id": 9}, "unknown_op", 9),
        ({"op": 1, "id": 9}, "bad_request", 9),
        ({"id": 9}, "bad_request", 9),
        ({"op": "ping", "id": 9, "x": None}, "bad_request", 9),
        ({"op": "hello", "id": 9, "job": ""}, "bad_request", 9),
        ({"op": "hello", "id": 9, "job": "-x"}, "bad_request", 9),
        ({"op": "hello", "id": 9, "job": "j" * 65}, "bad_request", 9),
        ({"op": "hello", "id": 9, "job": "llama run"}, "bad_request", 9),
        ({"op": "hello", "id": 9, "job": 3}, "bad_request", 9),
        ({"op": "hello", "id": 9, "job": "a", "x": 1}, "bad_request", 9),
        ({**CLAIM, "step": -1}, "bad_request", 13),
        ({**CLAIM, "step": 2**63}, "bad_request", 13),
        ({**CLAIM, "step": None}, "bad_request", 13),
        ({**CLAIM, "call": ""}, "bad_request", 13),
        ({**CLAIM, "call": None}, "bad_request", 13),
        ({**CLAIM, "call": "x" * 257}, "bad_request", 13),
        ({k: v for k, v in CLAIM.items() if k != "step"}, "bad_request", 13),
        ({**CLAIM, "job": "default"}, "bad_request", 13),
    ],
)
def test_wrong_keys_and_types_are_refused_with_code_and_id(
    header: Any, code: str, request_id: int | None
) -> None:
    error = bad(header)
    assert (error.code, error.request_id) == (code, request_id)


def test_payload_only_on_send() -> None:
    error = bad({"op": "ping", "id": 1}, payload_bytes=1)
    assert (error.code, error.request_id) == ("bad_request", 1)
    assert decode_request(pack(SEND), 0) == SendRequest(
        5, "sh", "layer3.grad", 12, False, b"\x01\x02", 99
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",  # never-used msgpack byte
        b"\x93\x01\x02\x03",  # an array, not a map
        b"\x81\x01\x02",  # integer key
        b"\x81\xa2op",  # truncated
        pack({"op": "ping", "id": 1}) + b"\x00",  # trailing bytes
        b"\x81\xa1x\xd4\x01\x00",  # ext type
    ],
)
def test_undecodable_headers_are_bad_header(raw: bytes) -> None:
    with pytest.raises(FrameError) as info:
        decode_request(raw, 0)
    assert info.value.code == "bad_header"
    assert not info.value.fatal


def test_split_frame_needs_whole_frame() -> None:
    frame = encode_request(PingRequest(1), 3) + b"abc"
    for cut in range(len(frame)):
        assert split_frame(frame[:cut], LIMIT) is None
    whole = split_frame(frame + b"WG", LIMIT)
    assert whole is not None
    assert (whole.payload, whole.frame_bytes) == (b"abc", len(frame))


def test_header_over_limit_cannot_be_encoded() -> None:
    with pytest.raises(FrameError) as info:
        encode_header({"blob": b"x" * MAX_HEADER_BYTES})
    assert info.value.code == "header_too_large"


# ------------------------------------------------------------------ replies


def test_reply_validation() -> None:
    assert decode_reply(pack(ok_reply(3, message_id=1))) == {"ok": True, "id": 3, "message_id": 1}
    assert decode_reply(pack(error_reply(None, "x", "y"))) == {
        "ok": False,
        "id": None,
        "code": "x",
        "error": "y",
    }
    error = error_reply(1, "x", "y")
    for broken in (
        {"ok": 1, "id": 1},
        {"ok": True, "id": "1"},
        {"ok": False, "id": 1},
        {**error, "more": 1},
        {**error, "code": 3},
    ):
        with pytest.raises(FrameError):
            decode_reply(pack(broken))


# ------------------------------------------------------------------ golden vectors

META = bytes.fromhex("5743010000")
PAYLOAD = bytes(range(8))
CHECKSUM = zlib.crc32(PAYLOAD, zlib.crc32(META))

REQUEST_VECTORS = {
    "ping_request": (PingRequest(7), b""),
    "hello_request": (HelloRequest(1), b""),
    "hello_job_request": (HelloRequest(1, "llama-run3"), b""),
    "claim_request": (ClaimRequest(13, "allreduce/ddp.b0", 3), b""),
    "send_request": (SendRequest(2, "sh", "layer3.grad", 12, False, META, CHECKSUM), PAYLOAD),
    "send_deadline_request": (
        SendRequest(2, "sh", "layer3.grad", 12, True, META, CHECKSUM, 0.5),
        PAYLOAD,
    ),
    "recv_request": (RecvRequest(3, "layer3.grad", "bj", None, 30.0), b""),
    "wait_request": (WaitRequest(9, "sh", 41, 30.0), b""),
    "reset_path_request": (ResetPathRequest(11, "sh", "fiber-a"), b""),
    # the payload's 8 bytes are in the segment whose descriptor comes with the frame
    "send_segment_request": (
        SendRequest(4, "sh", "layer3.grad", 12, False, META, CHECKSUM, None, (0, 8), 5),
        b"",
    ),
    "recv_segments_request": (RecvRequest(3, "layer3.grad", "bj", None, 30.0, True), b""),
    "recv_stream_request": (RecvRequest(3, "layer3.grad", "bj", None, 30.0, True, True), b""),
    "recv_returns_request": (
        RecvRequest(3, "layer3.grad", "bj", None, 30.0, True, False, True, (5, 6)),
        b"",
    ),
}
HELLO_SETTINGS = {
    "compression": {"default": "none", "tags": [["layer0.*", "fp16"]], "min_lossy_bytes": 65536},
    "max_message_bytes": 1 << 30,
}


def collision_message() -> str:
    """What the gateway says to a second trainer of a job entering a call (pid 4712,
    while pid 4711 is in it), from the gateway's own bookkeeping."""
    claims = CollectiveClaims()
    claims.claim("llama-run3", "allreduce/ddp.b0", 3, Claimant(1, 4711))
    with pytest.raises(GatewayError) as refused:
        claims.claim("llama-run3", "allreduce/ddp.b0", 3, Claimant(2, 4712))
    assert refused.value.code == "collision"
    return str(refused.value)


REPLY_VECTORS = {
    "ping_reply": ({"ok": True, "id": 7}, b""),
    "hello_reply": (
        {
            "ok": True,
            "id": 1,
            "protocol": 1,
            "site": "bj",
            "version": "0.1.0",
            "client_settings": HELLO_SETTINGS,
            "job": "default",
        },
        b"",
    ),
    "hello_job_reply": (
        {
            "ok": True,
            "id": 1,
            "protocol": 1,
            "site": "bj",
            "version": "0.1.0",
            "client_settings": HELLO_SETTINGS,
            "job": "llama-run3",
        },
        b"",
    ),
    "claim_reply": ({"ok": True, "id": 13}, b""),
    "collision_reply": (
        error_reply(
            13,
            "collision",
            "collision: allreduce 'ddp.b0' at step 3 in job 'llama-run3' was entered at this "
            "site by another trainer (pid 4711); two trainers of one job at one site may not "
            "enter the same collective",
        ),
        b"",
    ),
    "unknown_job_reply": (
        error_reply(
            1,
            "unknown_job",
            "no job 'llama-run4' in /etc/wangate/wangate.toml (jobs: default, llama-run3)",
        ),
        b"",
    ),
    "job_denied_reply": (
        error_reply(
            1,
            "job_denied",
            "job 'llama-run3' admits groups 4242424; this process runs as uid 1000 gids 27, 1000",
        ),
        b"",
    ),
    "send_reply": ({"ok": True, "id": 2, "message_id": 41}, b""),
    "recv_reply": (
        {
            "ok": True,
            "id": 3,
            "source": "bj",
            "tag": "layer3.grad",
            "step": 12,
            "critical": True,
            "meta": META,
            "checksum": CHECKSUM,
        },
        PAYLOAD,
    ),
    "recv_segment_reply": (
        {
            "ok": True,
            "id": 3,
            "source": "bj",
            "tag": "layer3.grad",
            "step": 12,
            "critical": True,
            "meta": META,
            "checksum": CHECKSUM,
            "segment": [64, 8],
        },
        b"",
    ),
    "recv_lent_segment_reply": (
        {
            "ok": True,
            "id": 3,
            "source": "bj",
            "tag": "layer3.grad",
            "step": 12,
            "critical": True,
            "meta": META,
            "checksum": CHECKSUM,
            "segment": [64, 8],
            "segment_id": 7,
        },
        b"",
    ),
    # a streaming recv: the first reply at the header, 4096 of 1 MiB in so far; then
    # progress, and the end (or a failure naming the message)
    "recv_stream_reply": (
        {
            "ok": True,
            "id": 3,
            "source": "bj",
            "tag": "layer3.grad",
            "step": 12,
            "critical": False,
            "meta": META,
            "checksum": CHECKSUM,
            "segment": [64, 1 << 20],
            "ready": 4096,
            "done": False,
        },
        b"",
    ),
    "recv_stream_progress_reply": ({"ok": True, "id": 3, "ready": 1 << 19, "done": False}, b""),
    "recv_stream_done_reply": ({"ok": True, "id": 3, "ready": 1 << 20, "done": True}, b""),
    "recv_stream_checksum_reply": (
        error_reply(
            3,
            "checksum",
            "message 'layer3.grad' (step 12) from bj failed its checksum: message "
            "'layer3.grad' step 12: checksum 0badf00d, sender declared 9d7a21c5",
        ),
        b"",
    ),
    "send_released_reply": ({"ok": True, "id": 6, "message_id": 42, "released": [5]}, b""),
    "bad_segment_reply": (
        error_reply(
            4,
            "bad_segment",
            "the segment holds 4096 bytes, the request names 8192 bytes at offset 0",
        ),
        b"",
    ),
    "error_reply": (error_reply(None, "bad_header", "header is not valid msgpack"), b""),
    "wait_reply": ({"ok": True, "id": 9, "outcome": "taken"}, b""),
    "reset_path_reply": ({"ok": True, "id": 11}, b""),
    "unknown_path_reply": (
        error_reply(
            11, "unknown_path", "no path 'fiber-x' to peer 'sh' in /etc/wangate/wangate.toml"
        ),
        b"",
    ),
    "path_down_reply": (error_reply(11, "path_down", "path sh/fiber-a is not connected"), b""),
    "wait_failed_reply": (
        error_reply(
            9,
            "message_failed",
            "message 41 (tag 'layer3.grad', step 12) to sh failed: peer sh restarted with it "
            "in its inbox, before a trainer took it",
        ),
        b"",
    ),
    "peer_unreachable_reply": (
        error_reply(
            2,
            "peer_unreachable",
            "peer sh is unreachable: silent for 5.2 s (limits.peer_dead_s = 5); it fails "
            "until heard again",
        ),
        b"",
    ),
    "access_denied_reply": (
        error_reply(
            None,
            "access_denied",
            AccessPolicy(
                frozenset({0, 998}),
                frozenset({997}),
                "uids 0 (root), 998 (wangate) and members of gids 997 (wangate)",
            ).refusal(PeerCredentials(4711, 1000, 1000, (27, 100)), "/run/wangate/wangate.sock"),
        ),
        b"",
    ),
    "too_many_connections_reply": (
        error_reply(
            None,
            "too_many_connections",
            connection_cap_refusal("/run/wangate/wangate.sock", 1024),
        ),
        b"",
    ),
}


def test_refusal_vectors_say_who_is_refused_and_what_to_change() -> None:
    frame = split_frame(load_vector("access_denied_reply"), LIMIT)
    assert frame is not None
    assert decode_reply(frame.header) == {
        "ok": False,
        "id": None,
        "code": "access_denied",
        "error": "uid 1000 (gid 1000, supplementary groups 27, 100) may not use the wangate "
        "gateway at /run/wangate/wangate.sock: it admits uids 0 (root), 998 (wangate) and "
        "members of gids 997 (wangate). Run as one of those, join one of those groups, or "
        "add the uid to [site] allow_uids (or a group to allow_gids) in the gateway's config",
    }
    frame = split_frame(load_vector("too_many_connections_reply"), LIMIT)
    assert frame is not None
    assert decode_reply(frame.header)["error"] == (
        "the wangate gateway at /run/wangate/wangate.sock already serves 1024 local "
        "connections, its limit ([limits] max_local_connections): close idle clients or "
        "raise the limit"
    )


@pytest.mark.parametrize("name", sorted(REQUEST_VECTORS))
def test_request_vectors_decode_and_reencode_exactly(name: str) -> None:
    raw = load_vector(name)
    expected, payload = REQUEST_VECTORS[name]
    frame = split_frame(raw, LIMIT)
    assert frame is not None and frame.frame_bytes == len(raw)
    assert decode_request(frame.header, len(frame.payload)) == expected
    assert frame.payload == payload
    assert encode_request(expected, len(payload)) + payload == raw


@pytest.mark.parametrize("name", sorted(REPLY_VECTORS))
def test_reply_vectors_decode_and_reencode_exactly(name: str) -> None:
    raw = load_vector(name)
    expected, payload = REPLY_VECTORS[name]
    frame = split_frame(raw, LIMIT)
    assert frame is not None and frame.frame_bytes == len(raw)
    assert decode_reply(frame.header) == expected
    assert frame.payload == payload
    assert encode_header(expected, len(payload)) + payload == raw


def test_every_op_is_documented_and_every_vector_is_tested() -> None:
    doc = (VECTORS.parent / "localapi.md").read_text()
    for op in OPS:
        assert f"\n| `{op}`" in doc, op
    for code in ("unknown_path", "path_down", "unknown_job", "job_denied", "collision"):
        assert f"| `{code}`" in doc, code
    on_disk = {
        p.name.removeprefix("localapi_").removesuffix(".hex") for p in VECTORS.glob("localapi_*")
    }
    assert on_disk == set(REQUEST_VECTORS) | set(REPLY_VECTORS)
    decoded = set()
    for name in REQUEST_VECTORS:
        frame = split_frame(load_vector(name), LIMIT)
        assert frame is not None
        decoded.add(decode_request(frame.header, len(frame.payload)).__class__.__name__)
    assert {"ResetPathRequest", "ClaimRequest", "HelloRequest"} <= decoded


def vector_error(name: str) -> str:
    frame = split_frame(load_vector(name), LIMIT)
    assert frame is not None
    return str(decode_reply(frame.header)["error"])


def test_job_vectors_say_what_the_gateway_says() -> None:
    """The error texts in the job vectors are the gateway's own, word for word."""
    assert vector_error("collision_reply") == collision_message()
    closed = JobConfig("llama-run3", allow_gids=(4242424,))
    denied = job_admission_error(closed, 1000, (1000, 27), 998)
    assert vector_error("job_denied_reply") == denied
    config = SimpleNamespace(
        path="/etc/wangate/wangate.toml",
        jobs=JobsConfig(jobs=(JobConfig("default"), JobConfig("llama-run3"))),
    )
    assert vector_error("unknown_job_reply") == unknown_job_error("llama-run4", config)  # type: ignore[arg-type]
    frame = split_frame(load_vector("hello_job_request"), LIMIT)
    assert frame is not None
    assert decode_request(frame.header, 0) == HelloRequest(1, "llama-run3")


def test_send_vector_checksum_matches_its_payload() -> None:
    frame = split_frame(load_vector("send_request"), LIMIT)
    assert frame is not None
    request = decode_request(frame.header, len(frame.payload))
    assert isinstance(request, SendRequest)
    assert request.checksum == zlib.crc32(frame.payload, zlib.crc32(request.meta)) == 0x10767A9D


# ------------------------------------------------------------------ fuzzing


def decode_all(data: bytes) -> None:
    """Decode frames the way the server does; only FrameError may escape."""
    view = memoryview(data)
    while (frame := split_frame(view, LIMIT)) is not None:
        decode_request(frame.header, frame.prefix.payload_bytes)
        view = view[frame.frame_bytes :]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_frame_error(data: bytes) -> None:
    for candidate in (data, b"WG\x01\x00" + data):
        try:
            decode_all(candidate)
        except FrameError as exc:
            assert isinstance(exc, RemoteProtocolError)  # the other side sent it
            assert exc.code


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_random_headers_only_raise_frame_error(header: bytes) -> None:
    with contextlib.suppress(FrameError):
        decode_request(header, 0)
    with contextlib.suppress(FrameError):
        decode_reply(header)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(set(SEND) | set(RECV) | {"x"})), msgpack_values, max_size=9
    ),
    st.sampled_from(["send", "recv", "ping", "hello", "paths", "status", "nope"]),
)
def test_structured_random_headers_only_raise_frame_error(header: dict[str, Any], op: str) -> None:
    try:
        raw = pack({**header, "op": op})
    except (OverflowError, ValueError):
        return
    with contextlib.suppress(FrameError):
        decode_request(raw, 0)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"op": "wait", "id": 4, "peer": "sh", "message_id": 1, "timeout_s": -1}, "timeout_s"),
        ({"op": "wait", "id": 4, "peer": "sh", "message_id": -1, "timeout_s": None}, "message_id"),
        ({"op": "wait", "id": 4, "peer": "", "message_id": 1, "timeout_s": None}, "peer"),
        ({"op": "wait", "id": 4, "peer": "sh", "message_id": 1}, r"missing keys \['timeout_s'\]"),
    ],
)
def test_wait_requests_are_validated(header: dict[str, object], message: str) -> None:
    with pytest.raises(FrameError, match=message) as refused:
        decode_request(pack(header), 0)
    assert (refused.value.code, refused.value.request_id) == ("bad_request", 4)


def test_wait_request_without_timeout() -> None:
    header = {"op": "wait", "id": 5, "peer": "sh", "message_id": 2**63 - 1, "timeout_s": None}
    assert decode_request(pack(header), 0) == WaitRequest(5, "sh", 2**63 - 1, None)


def test_stream_vectors_are_progress_a_client_accepts() -> None:
    size = 1 << 20
    seen = []
    for name in ("recv_stream_reply", "recv_stream_progress_reply", "recv_stream_done_reply"):
        frame = split_frame(load_vector(name), LIMIT)
        assert frame is not None
        header = decode_reply(frame.header)
        keys = {"ok", "id", "ready", "done"}
        seen.append(decode_progress({k: v for k, v in header.items() if k in keys}, size))
    assert seen == [
        StreamProgress(4096, False),
        StreamProgress(1 << 19, False),
        StreamProgress(size, True),
    ]
    with pytest.raises(FrameError, match="ready = 1048576 when done"):
        decode_progress({"ok": True, "id": 3, "ready": 4096, "done": True}, size)
