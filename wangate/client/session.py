"""What a client knows and keeps between calls, besides its connection: the settings
the gateway announced in hello, the codec policy and error feedback per (peer, tag),
the collectives' state and the pool of shared-memory segments for large sends.

The tensor side of the wire lives here: ``encode`` (policy, codec, size check,
checksum from the one pass over the payload) and ``decode``.
"""

from __future__ import annotations

import mmap
import os
from collections import deque
from itertools import count
from typing import Any

import numpy as np

from wangate.checksum import checksum_with_prefix
from wangate.codec import CodecPolicy, ErrorFeedback, encode_tensor
from wangate.codec.tensor import decode_frame
from wangate.collective.api import CollectiveState
from wangate.collective.tags import check_user_tag
from wangate.core.jobs import DEFAULT_JOB, job_name_error
from wangate.errors import ErrorCode, GatewayError, LocalProtocolError
from wangate.localapi.protocol import MAX_ID, MAX_RETURNED
from wangate.localapi.replies import HelloReply
from wangate.localapi.segments import SegmentPool
from wangate.tensorlike import as_wire_array, mark_bfloat16


class Session:
    def __init__(self, path: str, job: str | None = None) -> None:
        if job is not None and job_name_error(job) is not None:
            raise LocalProtocolError(str(job_name_error(job)))
        self.path = path
        self.job = job or DEFAULT_JOB  # every call on the connection is in it
        self._requested_job = job
        self._ids = count(1)
        self.site = ""
        self.settings: dict[str, Any] = {}
        self.max_message_bytes = 0
        self._policy = CodecPolicy()
        self._feedback = ErrorFeedback()  # residuals of lossy encodes, keyed (peer, tag)
        self.collective = CollectiveState()  # per-hop residuals of collectives
        self.segment_min_bytes: int | None = None
        self.segments_return = False  # the gateway takes received segments back for reuse
        self.pool = SegmentPool(0)
        # received segments' ids whose mapping is gone, for the next recv to return
        # (appended from any thread, when the collector takes the last view)
        self.returnable: deque[int] = deque()

    def next_id(self) -> int:
        return next(self._ids) % (MAX_ID + 1)

    def accept_hello(self, reply: HelloReply) -> None:
        settings = reply.client_settings
        compression = settings.get("compression", {})
        self.site = reply.site
        self.job = reply.job
        self.settings = settings
        self.max_message_bytes = int(settings["max_message_bytes"])
        self._policy = CodecPolicy(
            compression.get("default", "none"),
            tuple(tuple(rule) for rule in compression.get("tags", ())),
            compression.get("min_lossy_bytes", 0),
        )
        segments = settings.get("segments")
        # payloads from this size on go in shared memory, if the gateway takes them
        self.segment_min_bytes = None
        self.segments_return = False
        if isinstance(segments, dict):
            self.segments_return = segments.get("returns") is True
            self.segment_min_bytes = int(segments["min_bytes"])
            pool_bytes = int(segments.get("pool_bytes", 2 * self.max_message_bytes))
            self.pool = SegmentPool(pool_bytes)

    def to_return(self) -> tuple[int, ...]:
        """The ids a recv returns now (taken from ``returnable``)."""
        ids: list[int] = []
        while self.returnable and len(ids) < MAX_RETURNED:
            ids.append(self.returnable.popleft())
        return tuple(ids)

    def segment_wanted(self, payload: memoryview) -> bool:
        threshold = self.segment_min_bytes
        return threshold is not None and payload.nbytes >= max(threshold, 1)

    def fill_segment(self, payload: memoryview) -> tuple[int, int, mmap.mmap]:
        """(token, descriptor, mapping) of a segment now holding ``payload``: the one
        copy of the bytes on their way to the gateway (instead of through the socket)."""
        token, fd, mapping = self.pool.lend(payload.nbytes)
        try:
            target = np.frombuffer(mapping, np.uint8, payload.nbytes)
            target[:] = np.frombuffer(payload, np.uint8)
            del target
        except BaseException:
            self.handed_back(token, fd, mapping, failed=True)
            raise
        return token, fd, mapping

    def handed_back(self, token: int, fd: int, mapping: mmap.mmap, *, failed: bool) -> None:
        """After a hand-over: an unpooled segment is closed; a refused one is free."""
        if token == 0:
            mapping.close()
            os.close(fd)
        elif failed:
            self.pool.released([token])

    def encode(
        self, peer: str, tag: str, array: np.ndarray, codec: str | None
    ) -> tuple[bytes, memoryview, int]:
        """Encoded meta, payload view and checksum for ``array`` under the policy."""
        check_user_tag(tag)
        array, bfloat16 = as_wire_array(array)  # torch tensors: a view where possible
        spec = self._policy.choose(tag, array.nbytes, codec, array.dtype)
        encoded = encode_tensor(
            array, spec, feedback=self._feedback, key=(peer, tag), bfloat16=bfloat16
        )
        meta = bytes(encoded.meta)
        payload = memoryview(encoded.payload).cast("B")
        if payload.nbytes > self.max_message_bytes:
            raise GatewayError(
                f"{tag!r} encodes to {payload.nbytes} bytes, over the gateway's "
                f"max_message_bytes of {self.max_message_bytes}: split the tensor",
                code=ErrorCode.TOO_LARGE,
            )
        # the encoder read the payload once; both checksums derive from that pass
        return meta, payload, checksum_with_prefix(meta, encoded.payload_crc, payload.nbytes)

    def choose_spec(self, tag: str, nbytes: int, codec: str | None, dtype: np.dtype[Any]) -> str:
        return self._policy.choose(tag, nbytes, codec, dtype)

    def decode(self, meta: bytes, checksum: int, payload: memoryview) -> np.ndarray:
        # The gateway checked the transport checksum against the bytes before delivery;
        # the frame's own CRC is checked against it without another pass over them.
        array, info = decode_frame(meta, payload, transport_checksum=checksum)
        return mark_bfloat16(array) if info.bfloat16 else array

    def decode_header(self, header: dict[str, Any], payload: memoryview) -> np.ndarray:
        """``decode`` for a recv reply still as its map (``wangate.incoming``)."""
        return self.decode(header["meta"], header["checksum"], payload)
