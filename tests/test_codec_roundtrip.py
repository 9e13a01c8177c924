"""Round trips: exact for lossless codecs, within a stated bound for lossy ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.test_codec_helpers import F32_MAX, F32_TINY, LOSSY_SPECS, dense_bound
from wangate.codec import decode_tensor, encode_tensor, parse_spec, read_meta
from wangate.codec.spec import selected_count
from wangate.errors import CodecError

ALL_DTYPES = (
    "?",
    "i1",
    "u1",
    "<i2",
    ">i2",
    "<u2",
    "<i4",
    ">u4",
    "<i8",
    "<u8",
    "<f2",
    "<f4",
    ">f4",
    "<f8",
)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7)


def roundtrip(x: np.ndarray, spec: str) -> np.ndarray:
    encoded = encode_tensor(x, spec)
    assert len(encoded.meta) <= 4096
    y = decode_tensor(encoded.meta, bytes(encoded.payload))
    assert y.shape == x.shape
    assert y.dtype == x.dtype.newbyteorder("<") or y.dtype == x.dtype
    return y


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(ALL_DTYPES).flatmap(lambda dt: hnp.arrays(np.dtype(dt), SHAPES)),
    st.sampled_from(("none", "zstd", "zstd:1", "zstd:19")),
)
def test_lossless_codecs_are_bit_exact_on_every_dtype_and_shape(x: np.ndarray, spec: str) -> None:
    y = roundtrip(x, spec)
    assert y.dtype == x.dtype.newbyteorder("<")
    assert y.tobytes() == x.astype(y.dtype).tobytes()


def test_none_payload_is_a_view_of_a_contiguous_array() -> None:
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    payload = encode_tensor(x, "none").payload
    assert isinstance(payload, memoryview)
    assert np.shares_memory(np.frombuffer(payload, dtype=np.uint8), x)


def test_none_handles_non_contiguous_and_zero_d_arrays() -> None:
    x = np.arange(60, dtype=np.int32).reshape(6, 10)[:, ::3].T
    assert np.array_equal(roundtrip(x, "none"), x)
    scalar = np.array(2.5, dtype=np.float64)
    y = roundtrip(scalar, "none")
    assert y.shape == () and y[()] == 2.5


def test_decode_of_writable_payload_may_share_it_but_bytes_come_back_writable() -> None:
    x = np.arange(16, dtype=np.float32)
    encoded = encode_tensor(x, "none")
    y = decode_tensor(encoded.meta, bytes(encoded.payload))
    y += 1  # must be writable
    assert np.array_equal(y, x + 1)


def test_bfloat16_flag_travels_and_comes_back_as_uint16() -> None:
    bits = np.array([[0x3F80, 0xC000], [0x7F7F, 0x0001]], dtype=np.uint16)
    for spec in ("none", "zstd"):
        encoded = encode_tensor(bits, spec, bfloat16=True)
        assert read_meta(encoded.meta).bfloat16
        y = decode_tensor(encoded.meta, encoded.payload)
        assert y.dtype == np.uint16 and np.array_equal(y, bits)
    assert not read_meta(encode_tensor(bits, "none").meta).bfloat16
    with pytest.raises(CodecError, match="uint16"):
        encode_tensor(bits.astype(np.int16), "none", bfloat16=True)
    with pytest.raises(CodecError, match="float"):
        encode_tensor(bits, "int8", bfloat16=True)


@pytest.mark.parametrize("spec", ["fp16", "int8", "topk:0.1", "split:0.1/int8", "int4+zstd"])
@pytest.mark.parametrize("dtype", ["i4", "u1", "?", "i8"])
def test_lossy_codecs_refuse_non_float_dtypes(spec: str, dtype: str) -> None:
    with pytest.raises(CodecError, match="float16/float32/float64"):
        encode_tensor(np.zeros(8, dtype=dtype), spec)


@pytest.mark.parametrize("spec", LOSSY_SPECS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_lossy_codecs_refuse_non_finite_input(spec: str, bad: float) -> None:
    x = np.linspace(-1, 1, 300, dtype=np.float32)
    x[123] = bad
    with pytest.raises(CodecError, match="finite"):
        encode_tensor(x, spec)


def check_lossy(x: np.ndarray, spec: str) -> None:
    """Decoded values lie within the codec's bound of the float32 view of ``x``."""
    parsed = parse_spec(spec)
    y = roundtrip(x, spec).astype(np.float64).reshape(-1)
    assert np.isfinite(y).all()
    ref = x.astype(np.float32).astype(np.float64).reshape(-1)
    # The codecs work in float32; float64 inputs gain float32 rounding, float16 outputs gain
    # float16 rounding on the way back.
    slack = np.abs(ref) * 2.0**-23 + (
        np.abs(ref) * 2.0**-10 + 2.0**-24 if x.dtype == np.float16 else 0
    )
    error = np.abs(y - ref)
    values = parsed.values
    assert values is not None
    if parsed.kind in ("fp16", "bf16", "int8", "int4"):
        assert (error <= dense_bound(values.name, ref, values.block) + slack).all()
        return
    k = selected_count(parsed.fraction, ref.size)
    order = np.argsort(-np.abs(ref), kind="stable")
    threshold = np.abs(ref[order[k - 1]]) if k else 0.0
    if parsed.kind == "topk":
        assert np.count_nonzero(y) <= k
        kept = y != 0
        # Sent elements carry the value carrier's error (for int8/int4 at most half a step of
        # a scale set by the largest value, plus saturation beyond what the capped scale
        # sends, plus a whole block below qmax x the smallest normal float, which goes as
        # zeros as dense_bound's does); the rest are no larger than the k-th magnitude, or
        # were sent and quantised to zero.
        if values.name in ("int8", "int4"):
            qmax = 127 if values.name == "int8" else 7
            largest = qmax * (F32_MAX / 128 if values.name == "int8" else F32_MAX / 16)
            carrier = (
                np.abs(ref).max(initial=0.0) * (0.5 / 7) * 1.0001
                + qmax * F32_TINY
                + np.maximum(np.abs(ref) - largest, 0)
            )
        else:
            carrier = dense_bound(values.name, ref, 1)
        assert (error[kept] <= carrier[kept] + slack[kept]).all()
        assert (error[~kept] <= np.maximum(threshold, carrier[~kept]) + slack[~kept]).all()
        return
    key = parsed.key
    assert key is not None
    # Split: every element within the rest carrier's bound on blocks of x (the rest's blocks
    # have no larger absmax), key elements within the key carrier's bound.
    rest_bound = dense_bound(values.name, ref, values.block or 1)
    key_bound = dense_bound(key.name, ref, 1)
    assert (error <= np.maximum(rest_bound, key_bound) + slack).all()


FLOATS32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(("<f2", "<f4", ">f4", "<f8")).flatmap(
        lambda dt: hnp.arrays(
            np.dtype(dt),
            SHAPES,
            elements=st.floats(
                width=16 if "2" in dt else 32, allow_nan=False, allow_infinity=False
            ),
        )
    ),
    st.sampled_from(LOSSY_SPECS),
)
# top-k keeps the smallest normal float, whose int8 block goes as zeros (scale underflow)
@example(np.array([[F32_TINY, 0, 0, 0], [0, 0, 0, 0]], dtype=np.float32), "topk:0.2/int8")
def test_lossy_codecs_stay_within_bounds_and_finite(x: np.ndarray, spec: str) -> None:
    check_lossy(x, spec)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float64, st.integers(0, 600), elements=st.floats(allow_nan=False, allow_infinity=False)
    ),
    st.sampled_from(LOSSY_SPECS),
)
def test_float64_beyond_float32_range_saturates_never_inf(x: np.ndarray, spec: str) -> None:
    y = roundtrip(x, spec)
    assert np.isfinite(y).all()


@pytest.mark.parametrize(
    "spec", ["fp16", "bf16", "int8", "int4", "topk:0.5/fp16", "split:0.5/fp16"]
)
def test_values_beyond_the_carrier_range_saturate(spec: str) -> None:
    x = np.array([3.0e38, -3.3e38, 1e6, -70000.0, 1.0, 0.0] * 50, dtype=np.float32)
    y = roundtrip(x, spec)
    assert np.isfinite(y).all()
    assert y[0] >= 65504 and y[1] <= -65504  # saturated, not wrapped or zeroed


@pytest.mark.parametrize("n", [1, 255, 256, 257, 65535, 65536, 65537, 200_001])
@pytest.mark.parametrize("spec", ["fp16", "bf16", "int8", "int4", "topk:0.01", "split:0.02/int4"])
def test_lossy_codecs_across_chunk_and_block_edges(n: int, spec: str) -> None:
    rng = np.random.default_rng(n)
    check_lossy((rng.standard_t(3.0, size=n) * 1e-3).astype(np.float32), spec)


def test_fp16_rounding_matches_numpy_on_every_magnitude() -> None:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=400_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = np.clip(x[np.isfinite(x)], -65504, 65504)
    halves = np.array([1.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 65504, 2.0**-14, 0.1], np.float32)
    x = np.concatenate(
        [x, halves, -halves, (rng.standard_normal(10_000) * 1e-6).astype(np.float32)]
    )
    payload = np.frombuffer(encode_tensor(x, "fp16").payload, dtype=np.uint16)
    assert np.array_equal(payload, x.astype(np.float16).view(np.uint16))


def test_bf16_is_round_to_nearest_even_on_the_top_16_bits() -> None:
    bits = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x80000001, 0x7F7F7FFF], dtype=np.uint32)
    payload = np.frombuffer(encode_tensor(bits.view(np.float32), "bf16").payload, dtype="<u2")
    assert payload.tolist() == [0x3F80, 0x3F82, 0x3F80, 0x8000, 0x7F7F]


def test_topk_sends_exactly_the_largest_magnitudes() -> None:
    rng = np.random.default_rng(3)
    x = rng.permutation(np.linspace(-1, 1, 2001)).astype(np.float32)
    y = roundtrip(x, "topk:0.01/fp32")
    kept = np.flatnonzero(y)
    assert kept.size == 20
    assert np.array_equal(np.sort(np.abs(x[kept])), np.sort(np.abs(x))[-20:])
    assert np.array_equal(y[kept], x[kept])


def test_topk_selection_with_sampling_matches_full_partition() -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_t(3.0, size=1 << 19)).astype(np.float32)
    y = roundtrip(x, "topk:0.01/fp32")
    k = selected_count(0.01, x.size)
    assert np.count_nonzero(y) == k
    assert np.array_equal(np.sort(np.abs(y[y != 0])), np.sort(np.abs(x))[-k:])


def test_split_is_more_accurate_than_plain_int8_on_heavy_tails() -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_t(2.0, size=100_000) * 1e-3).astype(np.float32)
    int8_error = np.abs(roundtrip(x, "int8") - x).mean()
    split_error = np.abs(roundtrip(x, "split:0.01/int8") - x).mean()
    assert split_error < 0.8 * int8_error


@pytest.mark.parametrize("spec", ["int8", "topk:0.1", "split:0.1/int8", "fp16"])
def test_encode_does_not_modify_the_callers_array(spec: str) -> None:
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    before = x.copy()
    encode_tensor(x, spec)
    assert np.array_equal(x, before)


def test_encode_rejects_non_arrays_and_unsupported_dtypes() -> None:
    with pytest.raises(CodecError, match="numpy array"):
        encode_tensor([1.0, 2.0], "none")  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="not supported"):
        encode_tensor(np.zeros(3, dtype=np.complex64), "none")
    with pytest.raises(CodecError, match="not supported"):
        encode_tensor(np.array(["a"]), "none")
