"""Gradient compression: a pure library the client calls in the trainer's process.

Compression runs on the trainer side, inside the client library (ideally on a worker thread:
numpy and zstd release the GIL for the bulk of the work), so the daemon only moves opaque
``meta`` + ``payload`` bytes and never spends its transport CPU on codecs. Error-feedback
state (``ErrorFeedback``) lives there too, keyed by (destination peer, tag): the sender alone
knows what it dropped, so that is where the residual is cheapest to keep correct.

Codecs (spec strings, see ``spec.py``): none, fp16, bf16, int8 and int4 blockwise, top-k
sparse, split (largest fraction exact, the rest quantised), each optionally followed by
``+zstd[:level]``. Wire format: proto/codec.md.
"""

from __future__ import annotations

from .feedback import ErrorFeedback
from .frame import FrameInfo
from .policy import CodecPolicy
from .spec import CodecSpec, parse_spec
from .tensor import (
    DEFAULT_MAX_DECODED_BYTES,
    EncodedTensor,
    decode_tensor,
    encode_tensor,
    read_meta,
    validate_codec_spec,
)

__all__ = [
    "DEFAULT_MAX_DECODED_BYTES",
    "CodecPolicy",
    "CodecSpec",
    "EncodedTensor",
    "ErrorFeedback",
    "FrameInfo",
    "decode_tensor",
    "encode_tensor",
    "parse_spec",
    "read_meta",
    "validate_codec_spec",
]
