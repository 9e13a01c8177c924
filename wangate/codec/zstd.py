"""zstd stage: compress a body, and inflate one with a hard bound.

A zstd frame declares its content size and the decompressor would trust it, so the decoder
checks ``frame_content_size`` against the size the meta declares (itself checked against the
shape), then reads through ``stream_reader`` into a buffer of exactly that size and refuses any
byte beyond it (a further frame concatenated after the first included).
"""

from __future__ import annotations

import numpy as np
import zstandard

from wangate.errors import CodecError


def compress(body: memoryview, level: int) -> bytes:
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return compressor.compress(body)


def decompress(payload: memoryview, body_size: int) -> np.ndarray:
    """The body as a fresh uint8 array of exactly ``body_size`` bytes."""
    try:
        params = zstandard.get_frame_parameters(payload)
    except zstandard.ZstdError as exc:
        raise CodecError(f"payload is not a zstd frame: {exc}") from None
    if params.content_size != body_size:
        raise CodecError(
            f"zstd frame declares {params.content_size} bytes, the meta declares {body_size}"
        )
    body = np.empty(body_size, dtype=np.uint8)
    view = body.data
    filled = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(payload, read_across_frames=True)
        with reader:
            while filled < body_size:
                got = reader.readinto(view[filled:])
                if got == 0:
                    break
                filled += got
            extra = reader.read(1)
    except zstandard.ZstdError as exc:
        raise CodecError(f"zstd payload is corrupt: {exc}") from None
    if filled != body_size or extra:
        raise CodecError("zstd payload inflates to a size other than declared")
    return body
