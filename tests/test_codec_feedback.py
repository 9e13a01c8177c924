"""Error feedback: what is dropped in one step reaches the receiver in later steps."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_codec_helpers import LOSSY_SPECS
from wangate.codec import ErrorFeedback, decode_tensor, encode_tensor
from wangate.errors import CodecError


@pytest.mark.parametrize("spec", LOSSY_SPECS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_sum_of_sent_plus_residual_equals_sum_of_inputs(spec: str, dtype: type) -> None:
    rng = np.random.default_rng(11)
    feedback = ErrorFeedback()
    inputs = np.zeros((5, 37), dtype=np.float64)
    sent = np.zeros((5, 37), dtype=np.float64)
    for step in range(40):
        gradient = (rng.standard_t(3.0, size=(5, 37)) * 1e-2).astype(dtype)
        encoded = encode_tensor(gradient, spec, feedback=feedback, key=("sh", "w"))
        decoded = decode_tensor(encoded.meta, encoded.payload)
        assert decoded.dtype == dtype
        inputs += gradient.astype(np.float32)
        sent += decoded.astype(np.float64)
        if step == 0:
            assert feedback.residual(("sh", "w")) is not None
    residual = feedback.residual(("sh", "w"))
    assert residual is not None and residual.shape == (5, 37) and residual.dtype == np.float32
    total = sent + residual
    # float32 arithmetic in the accumulation (and float16 on the way out): a few ulps per step.
    tolerance = 40 * np.abs(inputs).max() * (2.0**-10 if dtype == np.float16 else 2.0**-20)
    assert np.abs(total - inputs).max() <= tolerance
    # Without feedback the same codec would have lost far more (the check has teeth).
    if spec.startswith("topk"):
        assert np.abs(residual).max() > 0


def test_topk_residual_is_exactly_what_was_not_sent() -> None:
    feedback = ErrorFeedback()
    x = np.array([0.5, -4.0, 0.25, 3.0, -0.125, 1.0, 0.0, 2.0, -8.0, 0.75], dtype=np.float32)
    encoded = encode_tensor(x, "topk:0.2/fp32", feedback=feedback, key="t")
    decoded = decode_tensor(encoded.meta, encoded.payload)
    assert decoded.tolist() == [0, -4.0, 0, 0, 0, 0, 0, 0, -8.0, 0]
    residual = feedback.residual("t")
    assert residual is not None
    assert residual.tolist() == [0.5, 0, 0.25, 3.0, -0.125, 1.0, 0, 2.0, 0, 0.75]
    # Next step: the residual is added before selection, so 3.0 (+ 0.0) now goes out.
    zeros = np.zeros(10, dtype=np.float32)
    encoded = encode_tensor(zeros, "topk:0.2/fp32", feedback=feedback, key="t")
    expected = [0, 0, 0, 3.0, 0, 0, 0, 2.0, 0, 0]
    assert decode_tensor(encoded.meta, encoded.payload).tolist() == expected


def test_keys_are_independent_and_reset_forgets() -> None:
    feedback = ErrorFeedback()
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    encode_tensor(x, "topk:0.1", feedback=feedback, key=("a", "t"))
    encode_tensor(-x, "topk:0.1", feedback=feedback, key=("b", "t"))
    a, b = feedback.residual(("a", "t")), feedback.residual(("b", "t"))
    assert a is not None and b is not None and np.array_equal(a, -b)
    assert len(feedback) == 2 and feedback.nbytes == 800
    feedback.reset(("a", "t"))
    assert ("a", "t") not in feedback and ("b", "t") in feedback
    feedback.reset()
    assert len(feedback) == 0 and list(feedback.keys()) == []


def test_lossless_codecs_leave_feedback_alone() -> None:
    feedback = ErrorFeedback()
    feedback.add("k", np.ones(4, dtype=np.float32))
    x = np.arange(4, dtype=np.float32)
    encoded = encode_tensor(x, "zstd", feedback=feedback, key="k")
    assert np.array_equal(decode_tensor(encoded.meta, encoded.payload), x)
    residual = feedback.residual("k")
    assert residual is not None and residual.tolist() == [1, 1, 1, 1]


def test_add_accumulates_and_residual_view_is_read_only() -> None:
    feedback = ErrorFeedback()
    feedback.add("k", np.full((2, 2), 0.5))
    feedback.add("k", np.full((2, 2), 0.25))
    residual = feedback.residual("k")
    assert residual is not None and residual.tolist() == [[0.75, 0.75], [0.75, 0.75]]
    with pytest.raises(ValueError):
        residual[0, 0] = 1.0
    assert feedback.residual("missing") is None


def test_shape_change_for_a_key_is_an_error_naming_reset() -> None:
    feedback = ErrorFeedback()
    encode_tensor(np.ones(10, np.float32), "int8", feedback=feedback, key="k")
    with pytest.raises(CodecError, match="reset"):
        encode_tensor(np.ones(11, np.float32), "int8", feedback=feedback, key="k")
    with pytest.raises(CodecError, match="reset"):
        feedback.add("k", np.ones((2, 5)))


def test_failed_encode_drops_that_keys_residual() -> None:
    feedback = ErrorFeedback()
    encode_tensor(np.linspace(0, 1, 50, dtype=np.float32), "int4", feedback=feedback, key="k")
    bad = np.zeros(50, dtype=np.float32)
    bad[3] = np.nan
    with pytest.raises(CodecError, match="finite"):
        encode_tensor(bad, "int4", feedback=feedback, key="k")
    assert "k" not in feedback


def test_feedback_without_key_is_an_error() -> None:
    with pytest.raises(CodecError, match="key"):
        encode_tensor(np.ones(4, np.float32), "fp16", feedback=ErrorFeedback())


def test_feedback_does_not_modify_the_callers_array() -> None:
    feedback = ErrorFeedback()
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    before = x.copy()
    for _ in range(3):
        encode_tensor(x, "split:0.1/int4", feedback=feedback, key="k")
    assert np.array_equal(x, before)
