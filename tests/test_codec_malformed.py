"""Malformed frames: every check the decoder makes, and fuzzing that only CodecError escapes."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_codec_helpers import patch_meta, reseal
from wangate.codec import decode_tensor, encode_tensor, read_meta
from wangate.errors import CodecError

# Meta field offsets (proto/codec.md).
VERSION, CODEC, DTYPE, FLAGS, NDIM, PARAMS_LEN, BODY, PAYLOAD, SHAPE = 2, 3, 4, 5, 6, 7, 8, 16, 24


def frame(spec: str, x: np.ndarray | None = None) -> tuple[bytes, bytes]:
    if x is None:
        x = np.linspace(-2, 2, 600, dtype=np.float32).reshape(20, 30)
    encoded = encode_tensor(x, spec)
    return encoded.meta, bytes(encoded.payload)


def rejects(meta: bytes, payload: bytes | memoryview, match: str, **kwargs: int) -> None:
    with pytest.raises(CodecError, match=match):
        decode_tensor(meta, payload, **kwargs)


def test_meta_size_limits() -> None:
    meta, payload = frame("none")
    rejects(meta[:27], payload, "bytes")
    rejects(meta + bytes(4096), payload, "bytes")
    rejects(b"", payload, "bytes")


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "match"),
    [
        (0, "<H", 0x5858, "magic"),
        (VERSION, "<B", 2, "version"),
        (CODEC, "<B", 7, "codec id"),
        (DTYPE, "<B", 13, "dtype code"),
        (DTYPE, "<B", 0, "dtype code"),
        (FLAGS, "<B", 0x04, "flags"),
        (FLAGS, "<B", 0x02, "bfloat16"),
        (NDIM, "<B", 33, "dimensions"),
        (NDIM, "<B", 3, "header says"),
        (PARAMS_LEN, "<B", 1, "header says"),
        (SHAPE, "<Q", 1 << 63, "2\\*\\*63"),
    ],
)
def test_header_field_rejections(offset: int, fmt: str, value: int, match: str) -> None:
    meta, payload = frame("int8")
    rejects(reseal(patch_meta(meta, offset, fmt, value), payload), payload, match)


def test_payload_size_must_match_declaration() -> None:
    meta, payload = frame("fp16")
    rejects(meta, payload[:-1], "declares")
    rejects(meta, payload + b"\0", "declares")


def test_checksum_covers_meta_and_payload() -> None:
    meta, payload = frame("int8")
    flipped = bytearray(payload)
    flipped[100] ^= 1
    rejects(meta, bytes(flipped), "checksum")
    rejects(patch_meta(meta, SHAPE, "<Q", 30), payload, "checksum")  # 20x30 -> 30x30, same body?
    corrupt_crc = bytearray(meta)
    corrupt_crc[-1] ^= 0x80
    rejects(bytes(corrupt_crc), payload, "checksum")


@pytest.mark.parametrize("spec", ["none", "fp16", "int8", "int4", "topk:0.1", "split:0.1/int8"])
def test_body_size_must_match_shape(spec: str) -> None:
    meta, payload = frame(spec)
    body = read_meta(meta).body_size
    lying = patch_meta(patch_meta(meta, BODY, "<Q", body - 1), PAYLOAD, "<Q", body - 1)
    rejects(reseal(lying, payload[:-1]), payload[:-1], "body")
    if spec != "topk:0.1":  # a top-k body depends on k alone
        bigger_shape = patch_meta(meta, SHAPE, "<Q", 21)
        rejects(reseal(bigger_shape, payload), payload, "body")


def test_uncompressed_frame_needs_payload_equal_to_body() -> None:
    meta, payload = frame("none")
    lying = patch_meta(meta, BODY, "<Q", 0)
    rejects(reseal(lying, payload), payload, "body")


def test_decoded_size_limit_applies_before_any_allocation() -> None:
    meta, payload = frame("topk:0.1")
    huge = patch_meta(meta, SHAPE, "<Q", 1 << 40)
    rejects(reseal(huge, payload), payload, "limit")
    rejects(meta, payload, "limit", max_decoded_bytes=600 * 4 - 1)
    assert decode_tensor(meta, payload, max_decoded_bytes=600 * 4).shape == (20, 30)


def zstd_frame(meta: bytes, body: bytes, **kwargs: bool) -> tuple[bytes, bytes]:
    payload = zstandard.ZstdCompressor(level=3, **kwargs).compress(body)
    meta = patch_meta(meta, PAYLOAD, "<Q", len(payload))
    return reseal(meta, payload), payload


def test_zstd_content_size_must_match_meta() -> None:
    meta, _ = frame("int8+zstd")
    body = bytes(
        encode_tensor(np.linspace(-2, 2, 600, dtype=np.float32).reshape(20, 30), "int8").payload
    )
    good_meta, good_payload = zstd_frame(meta, body)
    assert decode_tensor(good_meta, good_payload).shape == (20, 30)
    # A frame that declares (and holds) a different size, up to a bomb of 64 MiB of zeros.
    for other in (body[:-1], body + b"\0", bytes(64 << 20)):
        rejects(*zstd_frame(meta, other), "zstd frame declares")
    # A frame without a declared size is refused rather than inflated blind.
    rejects(*zstd_frame(meta, body, write_content_size=False), "zstd frame declares")


def test_zstd_frame_that_lies_about_its_size_is_stopped() -> None:
    meta, _ = frame("zstd", np.arange(100, dtype=np.uint8))
    # Declared 100 in the header, but holding 120 bytes: patch the 1-byte content size field.
    payload = bytearray(zstandard.ZstdCompressor(level=3).compress(bytes(range(120))))
    params = zstandard.get_frame_parameters(bytes(payload))
    assert params.content_size == 120
    header = zstandard.frame_header_size(bytes(payload))
    assert payload[header - 1] == 120
    payload[header - 1] = 100
    rejects(*zstd_frame_raw(meta, bytes(payload)), "zstd")


def zstd_frame_raw(meta: bytes, payload: bytes) -> tuple[bytes, bytes]:
    meta = patch_meta(meta, PAYLOAD, "<Q", len(payload))
    return reseal(meta, payload), payload


def test_zstd_trailing_frame_is_refused() -> None:
    meta, payload = frame("zstd", np.arange(100, dtype=np.uint8))
    doubled = payload + zstandard.ZstdCompressor().compress(b"more")
    rejects(*zstd_frame_raw(meta, doubled), "inflates")


def test_zstd_garbage_is_refused() -> None:
    meta, payload = frame("zstd", np.arange(100, dtype=np.uint8))
    rejects(*zstd_frame_raw(meta, b"\x28\xb5\x2f\xfd" + bytes(20)), "zstd")
    rejects(*zstd_frame_raw(meta, b"not zstd at all"), "zstd")
    truncated = payload[: len(payload) - 3]
    rejects(*zstd_frame_raw(meta, truncated), "zstd")


def scale_frame(spec: str, scale: float) -> tuple[bytes, bytes]:
    meta, payload = frame(spec)
    patched = bytearray(payload)
    struct.pack_into("<f", patched, 0, scale)
    return reseal(meta, bytes(patched)), bytes(patched)


@pytest.mark.parametrize("spec", ["int8", "int4"])
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -1.0, 3.0e38])
def test_bad_block_scales_are_refused(spec: str, scale: float) -> None:
    rejects(*scale_frame(spec, scale), "scale")


def params_frame(spec: str, fmt: str, value: int, offset_in_params: int) -> tuple[bytes, bytes]:
    meta, payload = frame(spec)
    ndim = meta[NDIM]
    patched = patch_meta(meta, SHAPE + 8 * ndim + offset_in_params, fmt, value)
    return reseal(patched, payload), payload


@pytest.mark.parametrize(
    ("spec", "fmt", "offset", "value", "match"),
    [
        ("int8", "<I", 0, 100, "block size"),
        ("int8", "<I", 0, 4, "block size"),
        ("int4", "<I", 0, 1 << 17, "block size"),
        ("topk:0.1", "<Q", 0, 601, "selected"),
        ("topk:0.1", "<Q", 0, 0, "selected"),
        ("topk:0.1", "<B", 8, 3, "index width"),
        ("topk:0.1", "<B", 9, 9, "carrier"),
        ("topk:0.1", "<B", 9, 0, "carrier"),
        ("topk:0.1", "<I", 10, 64, "block size"),
        ("topk:0.1/int8", "<I", 10, 0, "block size"),
        ("split:0.1/int8", "<B", 9, 3, "carrier"),
        ("split:0.1/int8", "<B", 10, 7, "carrier"),
        ("split:0.1/int8", "<I", 11, 12, "block size"),
    ],
)
def test_codec_parameter_rejections(
    spec: str, fmt: str, offset: int, value: int, match: str
) -> None:
    rejects(*params_frame(spec, fmt, value, offset), match)


def index_frame(deltas: list[int], n: int = 16) -> tuple[bytes, bytes]:
    """A topk frame over n float32 elements with the given 1-byte deltas and fp32 values."""
    x = np.zeros(n, dtype=np.float32)
    x[: len(deltas)] = np.arange(1, len(deltas) + 1)
    meta, payload = frame(f"topk:{len(deltas) / n}/fp32", x)
    assert read_meta(meta).params[8] == 1
    patched = bytes(deltas) + payload[len(deltas) :]
    return reseal(meta, patched), patched


def test_index_lists_must_increase_and_stay_in_range() -> None:
    assert decode_tensor(*index_frame([0, 1, 1, 1])).tolist()[:4] == [1, 2, 3, 4]
    rejects(*index_frame([0, 1, 0, 1]), "increasing")
    rejects(*index_frame([5, 5, 5, 1]), "increasing")
    rejects(*index_frame([15, 1, 1, 1]), "increasing")


def test_wide_deltas_that_wrap_uint64_are_refused() -> None:
    x = np.zeros(16, dtype=np.float32)
    x[[3, 9]] = [1.0, 2.0]
    meta, payload = frame("topk:0.125/fp32", x)
    meta = reseal(patch_meta(meta, SHAPE + 8 + 8, "<B", 8), b"")  # width 8: body grows
    deltas = struct.pack("<QQ", 3, (1 << 64) - 1)
    body = deltas + payload[2:]
    meta = patch_meta(meta, BODY, "<Q", len(body))
    meta = patch_meta(meta, PAYLOAD, "<Q", len(body))
    rejects(reseal(meta, body), body, "increasing")


def test_lossy_codec_on_integer_dtype_is_refused() -> None:
    meta, payload = frame("int8")
    rejects(reseal(patch_meta(meta, DTYPE, "<B", 6), payload), payload, "non-float")


def test_none_with_parameters_is_refused() -> None:
    meta, payload = frame("none", np.arange(4, dtype=np.int32))
    head, crc = meta[:-4], meta[-4:]
    patched = patch_meta(head + b"\0" + crc, PARAMS_LEN, "<B", 1)
    rejects(reseal(patched, payload), payload, "no parameters")


def test_bad_argument_types_raise_codec_error() -> None:
    meta, payload = frame("none")
    rejects("text", payload, "malformed")  # type: ignore[arg-type]
    rejects(meta, "text", "malformed")  # type: ignore[arg-type]
    strided = memoryview(np.frombuffer(payload + payload, dtype=np.uint8))[::2]
    rejects(meta, strided, "contiguous")
    assert decode_tensor(memoryview(meta), memoryview(bytearray(payload))).shape == (20, 30)
    float_view = memoryview(np.frombuffer(payload, dtype=np.float32))
    assert decode_tensor(meta, float_view).shape == (20, 30)


FUZZ_SPECS = (
    "none",
    "zstd",
    "fp16",
    "bf16",
    "int8",
    "int4",
    "topk:0.1",
    "topk:0.2/int8",
    "split:0.1/int8",
    "split:0.2/int4/fp16",
    "int8+zstd",
    "topk:0.1/int4+zstd",
)
FUZZ_FRAMES = {
    spec: frame(spec, (np.random.default_rng(1).standard_t(3.0, size=(7, 11))).astype("f4"))
    for spec in FUZZ_SPECS
}


def decode_or_codec_error(meta: bytes, payload: bytes) -> None:
    try:
        result = decode_tensor(meta, payload, max_decoded_bytes=1 << 20)
    except CodecError:
        return
    assert result.nbytes <= 1 << 20


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(FUZZ_SPECS),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6),
    st.booleans(),
    st.booleans(),
    st.integers(-8, 8),
)
def test_mutated_frames_only_raise_codec_error(
    spec: str,
    edits: list[tuple[int, int]],
    in_meta: bool,
    fix_crc: bool,
    resize: int,
) -> None:
    meta, payload = FUZZ_FRAMES[spec]
    target = bytearray(meta if in_meta else payload)
    for position, value in edits:
        if target:
            target[position % len(target)] = value
    if resize > 0:
        target += bytes(resize)
    elif resize < 0:
        del target[resize:]
    meta, payload = (bytes(target), payload) if in_meta else (meta, bytes(target))
    if fix_crc and len(meta) >= 4:
        meta = reseal(meta, payload)
    decode_or_codec_error(meta, payload)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=300))
def test_arbitrary_bytes_only_raise_codec_error(meta: bytes, payload: bytes) -> None:
    decode_or_codec_error(meta, payload)
    if len(meta) >= 4:
        decode_or_codec_error(reseal(meta, payload), payload)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(FUZZ_SPECS),
    st.integers(0, 255),
    st.integers(0, 255),
    st.integers(0, 1 << 20),
    st.sampled_from((BODY, PAYLOAD, SHAPE, SHAPE + 8)),
)
def test_resealed_header_lies_only_raise_codec_error(
    spec: str, codec: int, dtype: int, size: int, field: int
) -> None:
    meta, payload = FUZZ_FRAMES[spec]
    meta = patch_meta(meta, CODEC, "<B", codec)
    meta = patch_meta(meta, DTYPE, "<B", dtype)
    meta = patch_meta(meta, field, "<Q", size)
    decode_or_codec_error(reseal(meta, payload), payload)
