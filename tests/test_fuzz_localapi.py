"""Fuzzing the local API decoders in CI: frame prefixes, request and reply headers and
``FrameAssembler`` fed in arbitrary pieces (checks in ``tests/fuzz/targets.py``)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import targets
from tests.fuzz.strategies import mutated, seeds
from wangate.localapi import protocol

FAST = settings(max_examples=100, deadline=None)
TARGETS = ["localapi_frame", "frame_assembler"]
names = st.text(min_size=1, max_size=20)
u32 = st.integers(0, protocol.MAX_ID)
steps = st.integers(0, protocol.MAX_STEP)
jobs = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True)


def frame(header: object, payload: bytes = b"") -> bytes:
    body = msgpack.packb(header, use_bin_type=True)
    return protocol.encode_prefix(len(body), len(payload)) + body + payload


@pytest.mark.parametrize("target", TARGETS)
@FAST
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_wangate_errors(target: str, data: bytes) -> None:
    targets.run(target, data)


@pytest.mark.parametrize("target", TARGETS)
@FAST
@given(data=st.data())
def test_mutated_golden_frames_decode_or_raise_wangate_errors(
    target: str, data: st.DataObject
) -> None:
    targets.run(target, data.draw(mutated(seeds(target))))


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@FAST
@given(
    st.dictionaries(
        st.sampled_from(
            [*sorted(protocol.REQUEST_KEYS["send"] | {"deadline_s", "ok", "code"}), "x"]
        )
        | st.binary(max_size=3),
        st.sampled_from(protocol.OPS) | msgpack_values,
        max_size=10,
    ),
    st.binary(max_size=16),
)
def test_arbitrary_msgpack_headers_are_requests_or_frame_errors(
    header: dict[object, object], payload: bytes
) -> None:
    targets.run("localapi_frame", frame(header, payload))


requests = st.one_of(
    st.builds(protocol.HelloRequest, u32, st.none() | jobs),
    st.builds(protocol.ClaimRequest, u32, names, steps),
    st.builds(protocol.PingRequest, u32),
    st.builds(protocol.PathsRequest, u32),
    st.builds(protocol.StatusRequest, u32),
    st.builds(protocol.ResetPathRequest, u32, names, names),
    st.builds(
        protocol.SendRequest,
        u32,
        names,
        names,
        steps,
        st.booleans(),
        st.binary(max_size=32),
        u32,
        st.none() | st.floats(0.001, 1e9),
    ),
    st.builds(
        protocol.RecvRequest,
        u32,
        names,
        st.none() | names,
        st.none() | steps,
        st.none() | st.floats(0, 1e9),
    ),
    st.builds(  # streaming: only with segments
        protocol.RecvRequest,
        u32,
        names,
        st.none() | names,
        st.none() | steps,
        st.none() | st.floats(0, 1e9),
        st.just(True),
        st.booleans(),
    ),
    st.builds(  # returning its segment, and earlier ones
        protocol.RecvRequest,
        u32,
        names,
        st.none() | names,
        st.none() | steps,
        st.none() | st.floats(0, 1e9),
        st.just(True),
        st.just(False),
        st.booleans(),
        st.lists(st.integers(1, protocol.MAX_ID), max_size=protocol.MAX_RETURNED).map(tuple),
    ),
)


@FAST
@given(
    st.booleans(),
    msgpack_values | st.integers(-1, 1 << 33),
    msgpack_values
    | st.lists(st.integers(-1, (1 << 32) + 1), max_size=3)
    | st.lists(st.just(1), min_size=1024, max_size=1026),
)
def test_a_recv_returns_only_what_it_may_or_is_refused(
    segments: bool, returns: object, returned: object
) -> None:
    header = {"op": "recv", "id": 4, "tag": "t", "source": None, "step": None, "timeout_s": None}
    header |= {"segments": segments, "returns": returns, "returned": returned}
    try:
        request = protocol.decode_request(msgpack.packb(header, use_bin_type=True), 0)
    except protocol.FrameError as exc:
        assert (exc.code, exc.request_id, exc.fatal) == ("bad_request", 4, False)
        return
    assert isinstance(request, protocol.RecvRequest)
    assert type(returns) is bool and (segments or not returns) and request.returns is returns
    assert type(returned) is list and len(returned) <= protocol.MAX_RETURNED
    assert request.returned == tuple(returned)
    assert all(type(i) is int and 1 <= i <= protocol.MAX_ID for i in returned)


@FAST
@given(
    st.dictionaries(
        st.sampled_from(["ok", "id", "ready", "done", "released", "x"]),
        msgpack_values | st.integers(-2, 1 << 20),
        max_size=6,
    ),
    st.integers(0, 1 << 20),
)
def test_stream_progress_is_exact_or_a_frame_error(header: dict[str, object], size: int) -> None:
    try:
        progress = protocol.decode_progress(header, size)
    except protocol.FrameError as exc:
        assert exc.code == "bad_header"
        return
    ready, done = header["ready"], header.get("done", False)
    assert type(ready) is int and 0 <= ready <= size and type(done) is bool
    assert header.keys() <= {"ok", "id", "ready", "done", "released"}
    assert progress == protocol.StreamProgress(ready, done)
    assert not done or ready == size


def test_a_streaming_recv_needs_segments() -> None:
    header = {"op": "recv", "id": 1, "tag": "t", "source": None, "step": None}
    body = msgpack.packb(header | {"timeout_s": None, "stream": True}, use_bin_type=True)
    with pytest.raises(protocol.FrameError, match="'stream' must be a boolean, true only"):
        protocol.decode_request(body, 0)
    body = msgpack.packb(
        header | {"timeout_s": None, "stream": True, "segments": True}, use_bin_type=True
    )
    request = protocol.decode_request(body, 0)
    assert isinstance(request, protocol.RecvRequest) and request.stream and request.segments


@FAST
@given(st.lists(requests, min_size=1, max_size=4), st.binary(max_size=6))
def test_requests_round_trip_through_the_assembler_in_any_cut(
    sent: list[protocol.Request], sizes: bytes
) -> None:
    stream = b""
    for request in sent:
        payload = b"\x07" * 6 if isinstance(request, protocol.SendRequest) else b""
        stream += protocol.encode_request(request, len(payload)) + payload
    targets.localapi_frame(stream)
    targets.frame_assembler(bytes([len(sizes)]) + sizes + stream)
    offset = 0
    decoded = []
    while (cut := protocol.split_frame(stream[offset:], targets.MAX_PAYLOAD_BYTES)) is not None:
        decoded.append(protocol.decode_request(cut.header, cut.prefix.payload_bytes))
        offset += cut.frame_bytes
    assert decoded == sent and offset == len(stream)


# ------------------------------------------------------------------ findings


def test_binary_map_keys_are_a_bad_header_not_a_type_error() -> None:
    # A ping with one unexpected str key and one bin key: listing the unexpected keys
    # sorted str against bytes and raised TypeError.
    header = bytes.fromhex("84a26f70a470696e67a2696401a16101c4016202")
    assert msgpack.unpackb(header, strict_map_key=True) == {"op": "ping", "id": 1, "a": 1, b"b": 2}
    with pytest.raises(protocol.FrameError, match="keys must be msgpack strings") as error:
        protocol.decode_request(header, 0)
    assert error.value.code == "bad_header" and not error.value.fatal
    with pytest.raises(protocol.FrameError, match="keys must be msgpack strings"):
        protocol.decode_reply(bytes.fromhex("82a26f6bc3c4026964c0"))
