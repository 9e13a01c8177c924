"""Codec spec grammar and CodecPolicy."""

from __future__ import annotations

import numpy as np
import pytest

from wangate.codec import CodecPolicy, parse_spec, validate_codec_spec
from wangate.errors import CodecError

VALID = {
    "none": "none",
    "zstd": "zstd",
    "zstd:3": "zstd",
    "zstd:19": "zstd:19",
    "none+zstd:-3": "zstd:-3",
    "fp16": "fp16",
    "bf16+zstd": "bf16+zstd",
    "int8": "int8",
    "int8:256": "int8",
    "int8:64+zstd:5": "int8:64+zstd:5",
    "int4": "int4",
    "topk:0.01": "topk:0.01/fp16",
    "topk:0.01/int8": "topk:0.01/int8",
    "topk:0.25/int4:32": "topk:0.25/int4:32",
    "split:0.01/int8": "split:0.01/int8/fp32",
    "split:0.05/int4": "split:0.05/int4/fp32",
    "split:0.05/int4/fp16+zstd:1": "split:0.05/int4/fp16+zstd:1",
}
INVALID = (
    "",
    "None",
    "int9",
    "fp16+",
    "fp16+lz4",
    "int8+zstd+zstd",
    "zstd+zstd",
    "zstd:0",
    "zstd:23",
    "zstd:x",
    "int8:100",
    "int8:4",
    "int8:131072",
    "int8:",
    "fp16:2",
    "none:1",
    "topk",
    "topk:",
    "topk:0",
    "topk:1",
    "topk:1.5",
    "topk:nan",
    "topk:-0.1",
    "topk:0.1/none",
    "topk:0.1/int8/fp32",
    "split:0.1/fp32",
    "split:0.1/int8/int8",
    "split:0.1/int8/fp32/x",
    " int8",
    "int8 ",
    "x" * 65,
)


@pytest.mark.parametrize(("spec", "canonical"), sorted(VALID.items()))
def test_valid_specs_parse_to_canonical_form(spec: str, canonical: str) -> None:
    validate_codec_spec(spec)
    assert str(parse_spec(spec)) == canonical
    assert str(parse_spec(canonical)) == canonical


@pytest.mark.parametrize("spec", INVALID)
def test_invalid_specs_raise_codec_error(spec: str) -> None:
    with pytest.raises(CodecError, match="spec"):
        validate_codec_spec(spec)


def test_non_string_spec_is_rejected() -> None:
    with pytest.raises(CodecError):
        validate_codec_spec(3)  # type: ignore[arg-type]


def test_policy_first_matching_glob_wins_then_default() -> None:
    policy = CodecPolicy(
        default="fp16",
        tags=[("layer*.weight", "int8+zstd"), ("layer1.*", "topk:0.01"), ("*.bias", "none")],
        min_lossy_bytes=1024,
    )
    assert policy.choose("layer1.weight", 1 << 20) == "int8+zstd"
    assert policy.choose("layer1.grad", 1 << 20) == "topk:0.01"
    assert policy.choose("head.bias", 1 << 20) == "none"
    assert policy.choose("head.weight", 1 << 20) == "fp16"


def test_policy_override_beats_rules() -> None:
    policy = CodecPolicy(tags=[("*", "int8")], min_lossy_bytes=0)
    assert policy.choose("a", 10, override="int4") == "int4"
    assert policy.choose("a", 10, override="none") == "none"


def test_policy_small_tensors_fall_back_to_the_lossless_part() -> None:
    policy = CodecPolicy(
        default="int8+zstd:5", tags=[("plain", "topk:0.01"), ("z", "zstd:7")], min_lossy_bytes=100
    )
    assert policy.choose("any", 99) == "zstd:5"
    assert policy.choose("any", 100) == "int8+zstd:5"
    assert policy.choose("plain", 99) == "none"
    assert policy.choose("z", 1) == "zstd:7"
    assert policy.choose("any", 99, override="split:0.1/int4") == "none"


def test_policy_non_float_dtypes_fall_back() -> None:
    policy = CodecPolicy(default="int8+zstd", min_lossy_bytes=0)
    assert policy.choose("t", 1 << 20, dtype=np.dtype(np.int32)) == "zstd"
    assert policy.choose("t", 1 << 20, dtype=np.dtype(np.uint16)) == "zstd"
    assert policy.choose("t", 1 << 20, dtype=np.dtype(np.float16)) == "int8+zstd"
    assert policy.choose("t", 1 << 20, dtype=np.dtype(">f8")) == "int8+zstd"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"default": "int7"}, "spec"),
        ({"tags": [("a*", "topk:2")]}, "spec"),
        ({"tags": [("a*",)]}, "pair"),
        ({"min_lossy_bytes": -1}, "negative"),
        ({"min_lossy_bytes": 1.5}, "integer"),
    ],
)
def test_policy_rejects_bad_configuration(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CodecError, match=message):
        CodecPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_rejects_bad_override() -> None:
    with pytest.raises(CodecError):
        CodecPolicy().choose("t", 10, override="gzip")


def test_a_spec_parses_once_and_a_bad_one_fails_every_time() -> None:
    assert parse_spec("int8:64+zstd") is parse_spec("int8:64+zstd")
    for _ in range(2):
        with pytest.raises(CodecError, match="unknown codec"):
            parse_spec("int9")


def test_policy_rules_hold_for_many_tags_however_often_asked() -> None:
    policy = CodecPolicy(default="none", tags=[("layer1*", "int8"), ("layer*", "fp16")])
    tags = [f"layer{i}" for i in range(3000)]  # over what the policy remembers
    for _ in range(2):
        chosen = [policy.choose(tag, 1 << 20, dtype=np.dtype("f4")) for tag in tags]
        assert chosen == ["int8" if tag.startswith("layer1") else "fp16" for tag in tags]
    assert policy.choose("other", 1 << 20) == "none"
    assert policy.tags == (("layer1*", "int8"), ("layer*", "fp16"))
    with pytest.raises(AttributeError):
        policy.tags = ()  # type: ignore[misc]
