"""Golden vectors in proto/vectors/codec_*.hex: decode exactly, re-encode byte for byte.

Regenerate (only when the format version changes): .venv/bin/python -m tests.test_codec_vectors
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
import zstandard

from wangate.codec import decode_tensor, encode_tensor, read_meta

VECTORS = pathlib.Path(__file__).resolve().parent.parent / "proto" / "vectors"
FIELDS = ("spec", "dtype", "shape", "bfloat16", "input", "meta", "payload", "output")


def _mixed(n: int, dtype: str) -> np.ndarray:
    """n distinct-magnitude values: ((37 i mod 101) - 50.25) / 8, exact in every float dtype."""
    return (((np.arange(n) * 37) % 101 - 50.25) / 8).astype(dtype)


def _inputs() -> dict[str, tuple[str, np.ndarray, bool]]:
    """name -> (spec, input array, bfloat16 flag); fixed forever for format version 1."""
    halves = np.array(
        [1.0, -2.5, 1e5, -1e5, 2.0**-24, 3 * 2.0**-26, 0.1, -0.0, 65504, 65520, 1e-8, 3.0e38],
        dtype=np.float32,
    ).reshape(3, 4)
    return {
        "none_f32": ("none", (np.arange(6, dtype=np.float32) / 4 - 0.5).reshape(2, 3), False),
        "none_bool_0d": ("none", np.array(True), False),
        "none_i16_big_endian": ("none", np.array([1, -2, 300, -32768], dtype=">i2"), False),
        "none_bf16": ("none", np.array([[0x3F80, 0xC020], [0x7F7F, 0x0001]], "<u2"), True),
        "none_empty_u32": ("none", np.zeros((3, 0, 2), dtype=np.uint32), False),
        "zstd_u8": ("zstd:3", (np.arange(64) % 7).astype(np.uint8), False),
        "fp16_f32": ("fp16", halves, False),
        "bf16_f32": ("bf16", halves, False),
        "int8_f32": ("int8", _mixed(300, "<f4"), False),
        "int4_f64": ("int4:16", _mixed(37, "<f8"), False),
        "topk_f32": ("topk:0.05", _mixed(100, "<f4").reshape(10, 10), False),
        "topk_int8_f16": ("topk:0.1/int8:8", _mixed(64, "<f2"), False),
        "split_int8_f32": ("split:0.05/int8", _mixed(200, "<f4"), False),
        "split_int4_fp16_f32": ("split:0.1/int4:16/fp16", _mixed(45, "<f4").reshape(5, 9), False),
        "int8_zstd_f32": ("int8:64+zstd:3", _mixed(512, "<f4"), False),
    }


def _read(path: pathlib.Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition(":")
            fields[name.strip()] = value.strip()
    assert set(fields) == set(FIELDS), path
    return fields


def _input_array(fields: dict[str, str]) -> np.ndarray:
    shape = tuple(int(d) for d in fields["shape"].split(",") if d)
    return np.frombuffer(bytes.fromhex(fields["input"]), dtype=fields["dtype"]).reshape(shape)


def _body(meta: bytes, payload: bytes) -> bytes:
    if read_meta(meta).zstd:
        return zstandard.ZstdDecompressor().decompress(payload)
    return payload


@pytest.mark.parametrize("name", sorted(_inputs()))
def test_vector_decodes_exactly(name: str) -> None:
    fields = _read(VECTORS / f"codec_{name}.hex")
    meta, payload = bytes.fromhex(fields["meta"]), bytes.fromhex(fields["payload"])
    decoded = decode_tensor(meta, payload)
    source = _input_array(fields)
    assert decoded.shape == source.shape
    assert decoded.dtype == source.dtype.newbyteorder("<")
    assert decoded.tobytes() == bytes.fromhex(fields["output"])
    assert read_meta(meta).bfloat16 == (fields["bfloat16"] == "1")


@pytest.mark.parametrize("name", sorted(_inputs()))
def test_vector_reencodes_byte_exactly(name: str) -> None:
    fields = _read(VECTORS / f"codec_{name}.hex")
    spec, array, _ = _inputs()[name]
    assert fields["spec"] == spec
    assert _input_array(fields).tobytes() == array.tobytes()
    encoded = encode_tensor(_input_array(fields), spec, bfloat16=fields["bfloat16"] == "1")
    meta, payload = bytes.fromhex(fields["meta"]), bytes.fromhex(fields["payload"])
    if read_meta(meta).zstd:
        # zstd output is not canonical across library versions: compare what it holds.
        ours, theirs = read_meta(encoded.meta), read_meta(meta)
        assert (ours.codec, ours.dtype_code, ours.shape, ours.params, ours.body_size) == (
            theirs.codec,
            theirs.dtype_code,
            theirs.shape,
            theirs.params,
            theirs.body_size,
        )
        assert _body(encoded.meta, bytes(encoded.payload)) == _body(meta, payload)
    else:
        assert encoded.meta == meta
        assert bytes(encoded.payload) == payload


def write_vectors() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, (spec, array, bfloat16) in _inputs().items():
        encoded = encode_tensor(array, spec, bfloat16=bfloat16)
        decoded = decode_tensor(encoded.meta, encoded.payload)
        lines = [
            f"# wangate codec golden vector {name} (format: proto/codec.md, version 1)",
            f"spec: {spec}",
            f"dtype: {array.dtype.str}",
            f"shape: {','.join(str(d) for d in array.shape)}",
            f"bfloat16: {int(bfloat16)}",
            f"input: {array.tobytes().hex()}",
            f"meta: {encoded.meta.hex()}",
            f"payload: {bytes(encoded.payload).hex()}",
            f"output: {decoded.tobytes().hex()}",
        ]
        (VECTORS / f"codec_{name}.hex").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write_vectors()
    sys.exit(0)
