"""encode_tensor / decode_tensor: spec -> codec body -> optional zstd -> sealed meta."""

from __future__ import annotations

import struct
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import zstandard

from wangate.checksum import crc32
from wangate.errors import CodecError

from . import dense, zstd
from .chunks import as_float32, store_as
from .dtypes import DTYPE_BY_CODE, FLOAT_CODES, wire_array
from .feedback import ErrorFeedback
from .frame import (
    CODEC_BF16,
    CODEC_FP16,
    CODEC_INT4,
    CODEC_INT8,
    CODEC_NONE,
    CODEC_SPLIT,
    CODEC_TOPK,
    FrameInfo,
    pack_meta,
    parse_meta,
    verify_by_transport,
    verify_checksum,
)
from .spec import CodecSpec, DenseKind, parse_spec, selected_count
from .topk import decode_indices, encode_indices, index_width, select_largest

DEFAULT_MAX_DECODED_BYTES = 1 << 34  # 16 GiB: callers that know the size pass a tighter bound

_BLOCK = struct.Struct("<I")
_TOPK = struct.Struct("<QBBI")  # k, index width, value carrier, value block
_SPLIT = struct.Struct("<QBBBI")  # k, index width, key carrier, rest carrier, rest block
_DENSE_CODEC = {"fp16": CODEC_FP16, "bf16": CODEC_BF16, "int8": CODEC_INT8, "int4": CODEC_INT4}
_CODEC_DENSE = {ident: name for name, ident in _DENSE_CODEC.items()}
_NO_CARRIER = DenseKind("fp32")  # codec none's layout names no carrier; this stands in


@dataclass(frozen=True)
class EncodedTensor:
    meta: bytes  # <= 4096 bytes, self-describing and versioned (proto/codec.md)
    payload: bytes | bytearray | memoryview  # the bulk
    payload_crc: int  # CRC-32 of the payload alone: other checksums derive from it


def validate_codec_spec(spec: str) -> None:
    """Raise CodecError unless ``spec`` is a valid codec spec string."""
    parse_spec(spec)


def encode_tensor(
    array: np.ndarray,
    spec: str = "none",
    *,
    feedback: ErrorFeedback | None = None,
    key: Hashable | None = None,
    bfloat16: bool = False,
) -> EncodedTensor:
    """Encode ``array`` with ``spec``. With ``feedback`` (and ``key``), a lossy codec first adds
    the key's residual and stores what it dropped; lossless codecs leave feedback untouched.

    "none" does not copy a C-contiguous little-endian array: the payload is a view of it, so do
    not modify the array until the payload has been sent. ``bfloat16=True`` marks a uint16
    array as bfloat16 bits (an ml_dtypes bfloat16 array is recognised by itself); it is carried
    bit-exactly by the lossless codecs and comes back as uint16.
    """
    parsed = parse_spec(spec)
    if not isinstance(array, np.ndarray):
        raise CodecError(f"encode_tensor needs a numpy array, got {type(array).__name__}")
    wired, code, is_bf16 = wire_array(array)
    if bfloat16 and not is_bf16:
        if wired.dtype != np.uint16:
            raise CodecError(f"bfloat16=True needs the bits as a uint16 array, got {wired.dtype}")
        is_bf16 = True
    bfloat16 = is_bf16
    shape = wired.shape
    if not parsed.lossy:
        # C-contiguous (wire_array): its bytes in order (an empty one cannot be cast)
        body = wired.data.cast("B") if wired.nbytes else memoryview(b"")
        return _seal(
            FrameInfo(CODEC_NONE, code, shape, b"", body.nbytes, body.nbytes, bfloat16=bfloat16),
            body,
            parsed.zstd_level,
        )
    if code not in FLOAT_CODES or bfloat16:
        what = "bfloat16 (as uint16)" if bfloat16 else str(wired.dtype)
        raise CodecError(
            f"codec {spec!r} needs a float16/float32/float64 array, got {what}; "
            "use 'none' or 'zstd', or let CodecPolicy.choose(..., dtype=...) fall back"
        )
    flat = wired.reshape(-1)
    if feedback is None:
        work = as_float32(flat)
        codec, params, body_array = _encode_lossy(parsed, work, keep_residual=False)
    else:
        if key is None:
            raise CodecError("error feedback needs a key (the client uses (peer, tag))")
        work = feedback.checkout(key, flat, shape)
        codec, params, body_array = _encode_lossy(parsed, work, keep_residual=True)
        feedback.commit(key, shape, work)
    body = body_array.data
    info = FrameInfo(codec, code, shape, params, body.nbytes, body.nbytes)
    return _seal(info, body, parsed.zstd_level)


def _seal(info: FrameInfo, body: memoryview, zstd_level: int | None) -> EncodedTensor:
    """The frame of ``body``; ``info`` says its payload is ``body`` (zstd replaces it)."""
    payload: bytes | memoryview = body
    if zstd_level is not None:
        payload = zstd.compress(body, zstd_level)
        info = FrameInfo(
            info.codec,
            info.dtype_code,
            info.shape,
            info.params,
            info.body_size,
            len(payload),
            zstd=True,
            bfloat16=info.bfloat16,
        )
    payload_crc = crc32(payload)  # the one pass over the encoded bytes
    return EncodedTensor(pack_meta(info, payload_crc), payload, payload_crc)


def _encode_lossy(
    parsed: CodecSpec, work: np.ndarray, keep_residual: bool
) -> tuple[int, bytes, np.ndarray]:
    """(codec id, params, body). With ``keep_residual`` ``work`` ends holding what was dropped."""
    n = work.size
    values = parsed.values
    assert values is not None
    if parsed.kind in _DENSE_CODEC:
        body = np.empty(dense.body_size(values, n), dtype=np.uint8)
        dense.encode(values, work, body, keep_residual)
        params = _BLOCK.pack(values.block) if values.block else b""
        return _DENSE_CODEC[parsed.kind], params, body
    k = selected_count(parsed.fraction, n)
    chosen = select_largest(work, k)
    width = index_width(chosen)
    index_bytes = k * width
    picked = work[chosen]
    if parsed.kind == "topk":
        body = np.empty(index_bytes + dense.body_size(values, k), dtype=np.uint8)
        encode_indices(chosen, width, body[:index_bytes])
        dense.encode(values, picked, body[index_bytes:], keep_residual)
        if keep_residual:
            work[chosen] = picked  # what the values lost; elsewhere work already is the residual
        params = _TOPK.pack(k, width, dense.DENSE_IDS[values.name], values.block)
        return CODEC_TOPK, params, body
    key = parsed.key
    assert key is not None
    key_bytes = dense.body_size(key, k)
    body = np.empty(index_bytes + key_bytes + dense.body_size(values, n), dtype=np.uint8)
    encode_indices(chosen, width, body[:index_bytes])
    dense.encode(key, picked, body[index_bytes : index_bytes + key_bytes], keep_residual)
    rest = work if keep_residual else work.copy()
    rest[chosen] = 0.0  # the outliers go exactly; without them the rest's scales shrink
    dense.encode(values, rest, body[index_bytes + key_bytes :], keep_residual)
    if keep_residual:
        work[chosen] = picked
    params = _SPLIT.pack(
        k, width, dense.DENSE_IDS[key.name], dense.DENSE_IDS[values.name], values.block
    )
    return CODEC_SPLIT, params, body


def read_meta(meta: bytes | bytearray | memoryview) -> FrameInfo:
    """What a meta block declares (codec, dtype, shape, sizes), structure checked, so a
    receiver can bound memory before it reads the payload."""
    try:
        return parse_meta(meta)
    except (TypeError, ValueError, struct.error) as exc:
        raise CodecError(f"malformed frame meta: {exc}") from None


def decode_tensor(
    meta: bytes | bytearray | memoryview,
    payload: bytes | bytearray | memoryview,
    *,
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    transport_checksum: int | None = None,
) -> np.ndarray:
    """The array ``encode_tensor`` was given (shape, dtype; values exact or within the codec's
    error). Raises CodecError for anything malformed. A bfloat16 frame returns uint16 bits.
    A lossless frame whose payload is writable may come back as a view of it.

    ``transport_checksum``, a CRC-32 of meta then payload that was already verified
    against the bytes, replaces the pass over the payload for the frame's own CRC."""
    return decode_frame(
        meta, payload, max_decoded_bytes=max_decoded_bytes, transport_checksum=transport_checksum
    )[0]


def decode_frame(
    meta: bytes | bytearray | memoryview,
    payload: bytes | bytearray | memoryview,
    *,
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    transport_checksum: int | None = None,
) -> tuple[np.ndarray, FrameInfo]:
    """``decode_tensor``, and what the meta declared (read once)."""
    try:
        return _decode(meta, payload, max_decoded_bytes, transport_checksum)
    except CodecError:
        raise
    except MemoryError:
        # A frame may declare (and checksum) sizes far beyond this host's memory.
        raise CodecError(
            "frame declares more memory than this process can allocate "
            f"(limit max_decoded_bytes={max_decoded_bytes})"
        ) from None
    except (
        TypeError,
        ValueError,
        IndexError,
        OverflowError,
        struct.error,
        zstandard.ZstdError,
    ) as exc:
        raise CodecError(f"malformed frame: {exc}") from None


def _decode(
    meta: bytes | bytearray | memoryview,
    payload: bytes | bytearray | memoryview,
    max_decoded_bytes: int,
    transport_checksum: int | None = None,
) -> tuple[np.ndarray, FrameInfo]:
    info = parse_meta(meta)
    view = memoryview(payload)
    if not view.c_contiguous:
        raise CodecError("payload buffer must be contiguous")
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    if view.nbytes != info.payload_size:
        raise CodecError(f"payload is {view.nbytes} bytes, the meta declares {info.payload_size}")
    if transport_checksum is None:
        verify_checksum(meta, view)
    else:
        verify_by_transport(meta, transport_checksum, view.nbytes)
    n = info.element_count
    if info.decoded_bytes > max_decoded_bytes:
        raise CodecError(
            f"frame decodes to {info.decoded_bytes} bytes, above the limit {max_decoded_bytes}"
        )
    expected, layout = _layout(info, n)
    if expected != info.body_size:
        raise CodecError(f"frame declares a {info.body_size}-byte body, its shape needs {expected}")
    if info.zstd:
        body = zstd.decompress(view, info.body_size)
    elif info.payload_size != info.body_size:
        raise CodecError("uncompressed frame has payload size different from body size")
    else:
        body = np.frombuffer(view, dtype=np.uint8)
    dtype = DTYPE_BY_CODE[info.dtype_code]
    if info.codec == CODEC_NONE:
        out = body.view(dtype)
        flags = out.flags
        if not (flags.writeable and flags.aligned):
            out = body.copy().view(dtype)
        return out.reshape(info.shape), info
    if info.dtype_code not in FLOAT_CODES:
        raise CodecError(f"lossy codec {info.codec_name} on a non-float dtype {dtype}")
    values, key, k, width = layout
    # Top-k leaves most elements zero: calloc'd pages are only touched where values land.
    out = np.zeros(n, dtype=dtype) if info.codec == CODEC_TOPK else np.empty(n, dtype=dtype)
    if info.codec in _CODEC_DENSE:
        target = out if dtype == np.float32 else np.empty(n, dtype=np.float32)
        dense.decode(values, body, target)
    elif info.codec == CODEC_TOPK:
        chosen = decode_indices(body[: k * width], width, n)
        picked = np.empty(k, dtype=np.float32)
        dense.decode(values, body[k * width :], picked)
        target = np.empty(k, dtype=dtype)
        store_as(target, picked)
        out[chosen] = target
        return out.reshape(info.shape), info
    else:
        assert key is not None
        chosen = decode_indices(body[: k * width], width, n)
        key_end = k * width + dense.body_size(key, k)
        picked = np.empty(k, dtype=np.float32)
        dense.decode(key, body[k * width : key_end], picked)
        target = out if dtype == np.float32 else np.empty(n, dtype=np.float32)
        dense.decode(values, body[key_end:], target)
        target[chosen] = picked
    if target is not out:
        store_as(out, target)
    return out.reshape(info.shape), info


def _layout(info: FrameInfo, n: int) -> tuple[int, tuple[DenseKind, DenseKind | None, int, int]]:
    """(expected body size, (values carrier, key carrier, k, index width)) from the meta."""
    if info.codec == CODEC_NONE:
        if info.params:
            raise CodecError("codec none takes no parameters")
        return n * DTYPE_BY_CODE[info.dtype_code].itemsize, (_NO_CARRIER, None, 0, 0)
    if info.codec in _CODEC_DENSE:
        name = _CODEC_DENSE[info.codec]
        if name in dense.BLOCKWISE:
            if len(info.params) != _BLOCK.size:
                raise CodecError(f"codec {name} needs a 4-byte block parameter")
            (block,) = _BLOCK.unpack(info.params)
        elif info.params:
            raise CodecError(f"codec {name} takes no parameters")
        else:
            block = 0
        values = dense.check_dense(dense.DENSE_IDS[name], block, (name,))
        return dense.body_size(values, n), (values, None, 0, 0)
    if info.codec == CODEC_TOPK:
        if len(info.params) != _TOPK.size:
            raise CodecError("codec topk needs 14 parameter bytes")
        k, width, value_id, block = _TOPK.unpack(info.params)
        values = dense.check_dense(value_id, block, ("fp16", "bf16", "fp32", "int8", "int4"))
        _check_k(k, width, n)
        return k * width + dense.body_size(values, k), (values, None, k, width)
    if len(info.params) != _SPLIT.size:
        raise CodecError("codec split needs 15 parameter bytes")
    k, width, key_id, rest_id, block = _SPLIT.unpack(info.params)
    key = dense.check_dense(key_id, 0, ("fp32", "fp16"))
    values = dense.check_dense(rest_id, block, ("int8", "int4", "fp16", "bf16"))
    _check_k(k, width, n)
    size = k * width + dense.body_size(key, k) + dense.body_size(values, n)
    return size, (values, key, k, width)


def _check_k(k: int, width: int, n: int) -> None:
    if width not in (1, 2, 4, 8):
        raise CodecError(f"frame declares index width {width}")
    if k > n or (n > 0 and k == 0):
        raise CodecError(f"frame declares {k} selected elements out of {n}")
