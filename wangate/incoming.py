"""A message a trainer reads while it arrives: ``recv(..., stream=True)``.

The gateway answers a streaming recv as soon as a matching message's header is in
(proto/localapi.md, "Streamed delivery"): the reply names the message (source, tag,
step, dtype and shape in its meta) and hands over the shared-memory segment it is
being assembled in. Later replies to the same request say how far the contiguous
prefix reaches (coarsely: a step of max(4 MiB, size/64), never per datagram) and,
last, that the whole message passed its checksum or why it failed.

The state and the array live here; the clients pump the replies (``Client`` reads
them on the caller's thread, ``AsyncClient``'s reader feeds them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from wangate.codec.dtypes import DTYPE_BY_CODE
from wangate.codec.frame import CODEC_NONE
from wangate.codec.tensor import read_meta
from wangate.errors import ErrorCode, GatewayError, RecvTimeout
from wangate.localapi.protocol import FrameError, decode_progress

Decode = Callable[[dict[str, Any], memoryview], np.ndarray]
ErrorFor = Callable[[dict[str, Any]], GatewayError]  # a failure reply as the client raises it


class _Incoming:
    """What both kinds share: the header, the segment, how far it is in, the outcome."""

    def __init__(
        self, reply: dict[str, Any], payload: memoryview, decode: Decode, error_for: ErrorFor
    ) -> None:
        self._error_for = error_for
        self._reply = reply
        self._payload = payload
        self._decode = decode
        self.source: str = reply["source"]
        self.tag: str = reply["tag"]
        self.step: int = reply["step"]
        self.critical: bool = reply["critical"]
        self.size: int = payload.nbytes  # payload bytes, as encoded
        info = read_meta(reply["meta"])
        self.dtype = np.dtype(DTYPE_BY_CODE[info.dtype_code])
        self.shape: tuple[int, ...] = info.shape
        self.codec: str = info.codec_name
        self._raw = info.codec == CODEC_NONE and not info.zstd and not info.bfloat16
        self._array: np.ndarray | None = None
        self.ready_bytes = 0
        self.done = False
        self.error: GatewayError | None = None
        self._result: np.ndarray | None = None
        self._apply(reply)

    @property
    def array(self) -> np.ndarray | None:
        """The tensor over the shared segment, filling in as ``ready_bytes`` grows.

        UNVERIFIED until ``result()`` returns: the bytes are read as they arrive,
        before the message's checksum is checked, and a block may still be repaired.
        Do not write to it before ``result()``: a written page becomes a private copy
        that later bytes do not reach. None when the codec is not raw (compressed or
        lossy payloads are decoded by ``result()`` only).
        """
        if not self._raw:
            return None
        if self._array is None:
            flat = np.frombuffer(self._payload, np.uint8)
            self._array = flat.view(self.dtype).reshape(self.shape)
        return self._array

    @property
    def finished(self) -> bool:
        return self.done or self.error is not None

    def _apply(self, reply: dict[str, Any]) -> None:
        """A reply to the streaming request: the first one, progress, the end."""
        if not reply["ok"]:
            self.error = self._error_for(reply)
            return
        try:
            progress = decode_progress(
                {k: v for k, v in reply.items() if k in ("ok", "id", "ready", "done", "released")},
                self._payload.nbytes,
            )
        except FrameError as exc:
            self.error = GatewayError(
                f"{self._what()}: malformed reply from the gateway: {exc}", code=ErrorCode.BAD_REPLY
            )
            return
        self.ready_bytes = max(self.ready_bytes, progress.ready_bytes)
        self.done = progress.done

    def _what(self) -> str:
        return f"streamed message {self.tag!r} (step {self.step}) from {self.source}"

    def _timed_out(self, what: str, timeout: float | None) -> RecvTimeout:
        return RecvTimeout(
            f"{self._what()}: {what} not in after {timeout:g} s "
            f"({self.ready_bytes} of {self.size} bytes are)",
            code=ErrorCode.TIMEOUT,
        )

    def _outcome(self) -> np.ndarray:
        if self.error is not None:
            raise self.error
        if self._result is None:
            # the gateway verified the whole message against its checksum; the frame's
            # own CRC follows from that one without another pass (proto/localapi.md)
            self._result = self._decode(self._reply, self._payload)
        return self._result

    def __repr__(self) -> str:
        state = "done" if self.done else "failed" if self.error else "arriving"
        return (
            f"<{type(self).__name__} {self.tag!r} step {self.step} from {self.source}: "
            f"{self.ready_bytes}/{self.size} bytes, {state}>"
        )


class IncomingMessage(_Incoming):
    """A message being received by a ``Client`` (blocking).

    ``source``, ``tag``, ``step``, ``critical``, ``dtype``, ``shape``, ``size`` (payload
    bytes) are known at once; ``array`` is a view of the bytes as they arrive and
    ``ready_bytes`` how many of them are in (contiguous from the start); both are
    unverified until ``result()``. ``wait`` and ``result`` read the gateway's replies
    on the calling thread.
    """

    def __init__(
        self,
        reply: dict[str, Any],
        payload: memoryview,
        decode: Decode,
        error_for: ErrorFor,
        pump: Callable[[IncomingMessage, float | None], None],
    ) -> None:
        super().__init__(reply, payload, decode, error_for)
        self._pump = pump

    def wait(self, nbytes: int, *, timeout: float | None = None) -> int:
        """Block until at least ``nbytes`` of the payload are in (unverified), or the
        message is finished; returns ``ready_bytes``. Raises ``RecvTimeout`` after
        ``timeout`` seconds, or why the message failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.ready_bytes < nbytes and not self.finished:
            self._pump(self, deadline)
            late = deadline is not None and time.monotonic() >= deadline
            if late and not self.finished and self.ready_bytes < nbytes:
                raise self._timed_out(f"{nbytes} bytes", timeout)
        if self.error is not None:
            raise self.error
        return self.ready_bytes

    def result(self, *, timeout: float | None = None) -> np.ndarray:
        """The whole array once the gateway verified its checksum. Raises
        ``RecvTimeout`` after ``timeout`` seconds; ``GatewayError`` with code
        ``checksum`` if it failed its checksum, ``PeerUnreachable`` (naming the peer)
        if the sender went silent, ``MessageFailed`` if it was dropped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.finished:
            self._pump(self, deadline)
            if deadline is not None and time.monotonic() >= deadline and not self.finished:
                raise self._timed_out("the whole message", timeout)
        return self._outcome()


class AsyncIncomingMessage(_Incoming):
    """As ``IncomingMessage``, for ``AsyncClient``: ``wait`` and ``result`` are awaited."""

    def __init__(
        self, reply: dict[str, Any], payload: memoryview, decode: Decode, error_for: ErrorFor
    ) -> None:
        self._changed = asyncio.Event()
        super().__init__(reply, payload, decode, error_for)

    def _update(self, reply: dict[str, Any]) -> None:
        self._apply(reply)
        self._changed.set()

    def _lost(self, error: GatewayError) -> None:
        if not self.finished:
            self.error = error
            self._changed.set()

    async def _until(self, ready: Callable[[], bool], what: str, timeout: float | None) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not ready() and not self.finished:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise self._timed_out(what, timeout) from None

    async def wait(self, nbytes: int, *, timeout: float | None = None) -> int:
        """As ``IncomingMessage.wait``."""
        await self._until(lambda: self.ready_bytes >= nbytes, f"{nbytes} bytes", timeout)
        if self.error is not None:
            raise self.error
        return self.ready_bytes

    async def result(self, *, timeout: float | None = None) -> np.ndarray:
        """As ``IncomingMessage.result``."""
        await self._until(lambda: self.finished, "the whole message", timeout)
        return self._outcome()
