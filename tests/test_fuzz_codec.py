"""Fuzzing the codec decoders in CI: frame meta, every codec's body, zstd, spec strings.

Inputs go through ``tests/fuzz/targets.py`` (shared with the atheris harnesses): a frame
either decodes or raises ``CodecError``, and a lossless frame re-encodes byte for byte.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import targets
from tests.fuzz.strategies import mutated, seeds
from wangate.codec import decode_tensor, encode_tensor, parse_spec
from wangate.codec.frame import CODEC_TOPK, FrameInfo, pack_meta
from wangate.errors import CodecError

FAST = settings(max_examples=100, deadline=None)
SPECS = ["none", "zstd", "fp16", "bf16", "int8:8", "int4:8+zstd", "topk:0.3/int8:8"]
SPECS += ["split:0.2/int4:8/fp16", "topk:0.5/fp32+zstd:1"]


@pytest.mark.parametrize("target", ["codec_frame", "codec_spec"])
@FAST
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_wangate_errors(target: str, data: bytes) -> None:
    targets.run(target, data)


@FAST
@given(data=st.data(), knob=st.integers(0, 3))
def test_mutated_golden_frames_decode_or_raise_codec_errors(data: st.DataObject, knob: int) -> None:
    # knob 3 repairs the payload size and the CRC after the mutation, so the
    # mutated meta and body reach the codecs instead of stopping at the checksum.
    frame = bytearray(data.draw(mutated(seeds("codec_frame"))))
    if frame:
        frame[0] = knob
    targets.run("codec_frame", bytes(frame))


@FAST
@given(data=st.data())
def test_mutated_spec_strings_parse_or_raise_codec_errors(data: st.DataObject) -> None:
    targets.run("codec_spec", data.draw(mutated(seeds("codec_spec"))))


@pytest.mark.parametrize("target", ["codec_frame", "codec_spec"])
def test_every_seed_decodes(target: str) -> None:
    for seed in seeds(target):
        targets.TARGETS[target](seed)


@FAST
@given(
    st.sampled_from(SPECS),
    st.lists(st.floats(-6e4, 6e4, width=16), max_size=64),
    st.sampled_from(["<f4", "<f2", ">f8"]),
)
def test_encoded_tensors_decode_to_their_shape_and_dtype(
    spec: str, values: list[float], dtype: str
) -> None:
    array = np.array(values, dtype=dtype)
    encoded = encode_tensor(array, spec)
    decoded = decode_tensor(encoded.meta, encoded.payload)
    assert decoded.shape == array.shape and decoded.dtype == array.dtype.newbyteorder("<")
    if not parse_spec(spec).lossy:
        assert decoded.tobytes() == array.astype(decoded.dtype).tobytes()
    targets.codec_frame(targets.codec_input(encoded.meta, bytes(encoded.payload)))


@FAST
@given(st.sampled_from(SPECS))
def test_spec_strings_round_trip_through_their_canonical_form(spec: str) -> None:
    targets.codec_spec(spec.encode())


# ------------------------------------------------------------------ findings


@pytest.mark.parametrize("text", ["int8:--8", "int8:²", "zstd:²", "int4:-٣", "topk:0.5/int8:¹⁶"])
def test_spec_integers_are_ascii_digits(text: str) -> None:
    # str.isdigit() accepted these and int() then raised ValueError.
    with pytest.raises(CodecError, match="must be an integer"):
        parse_spec(text)


def test_frame_declaring_more_memory_than_exists_is_a_codec_error() -> None:
    # A checksummed top-k frame over 2**33 float16 elements (16 GiB decoded, within the
    # default limit) with k = n, 8-byte indices and fp32 values: a 96 GiB body, inflated
    # from a zstd frame whose header declares that size. It raised MemoryError.
    n = 1 << 33
    payload = b"\x28\xb5\x2f\xfd\xe0" + struct.pack("<Q", 12 * n) + b"\x01\x00\x00"
    params = struct.pack("<QBBI", n, 8, 7, 0)
    info = FrameInfo(CODEC_TOPK, 10, (n,), params, 12 * n, len(payload), zstd=True)
    meta = pack_meta(info, zlib.crc32(payload))
    assert meta.hex() == (
        "574301050a01010e000000001800000010000000000000000000000002000000"
        "00000000020000000807000000001f890f0e"
    )
    with pytest.raises(CodecError, match="more memory than this process can allocate"):
        decode_tensor(meta, payload)
