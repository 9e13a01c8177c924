"""The control channel between the coordinator and one worker (proto/workers.md).

A ``SOCK_SEQPACKET`` Unix socketpair: one msgpack map per packet, keys checked exactly
per kind, and payloads only as shared-memory descriptors (``SCM_RIGHTS``), never in
the packet. Anything else is a ``ChannelError`` naming what is wrong; the coordinator
then restarts that worker, a worker stops.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack

from wangate.errors import ErrorCode, GatewayError
from wangate.shm import close_all, fd_ancillary, fds_from_ancillary

log = logging.getLogger("wangate.workers")

MAX_PACKET_BYTES = 1 << 20
FD_SPACE = socket.CMSG_SPACE(4 * 4)

# kind -> (field -> type, descriptors the packet carries)
_NUMBER = (int, float)
UNKNOWN_HOLDER = -1  # `done`, `failed`: the worker did not know the peer's instance yet
KINDS: dict[str, tuple[dict[str, type | tuple[type, ...]], int]] = {
    # coordinator -> worker
    "send": (
        {
            "sid": int,
            "peer": str,
            "tag": str,
            "step": int,
            "critical": bool,
            "meta": bytes,
            "checksum": int,
            "offset": int,  # of the stripe in the descriptor's file
            "length": int,
            "deadline_s": _NUMBER,  # negative: none
            "job": str,
        },
        1,
    ),
    "taken": ({"peer": str, "msg_id": int, "body_bytes": int, "seq": int}, 0),
    # where to write the stripe that arrived as seq: the message's segment, at offset
    "place": ({"seq": int, "offset": int}, 1),
    "reset": ({"peer": str, "path": str}, 0),
    # worker -> coordinator
    "ready": ({"pid": int}, 0),
    "acked": ({"sid": int}, 0),
    "done": ({"sid": int, "holder": int}, 0),
    "failed": ({"sid": int, "reason": str, "code": str, "holder": int}, 0),
    "arrived": (
        {
            "peer": str,
            "msg_id": int,
            "body_bytes": int,
            "tag": str,
            "step": int,
            "critical": bool,
            "meta": bytes,
            "checksum": int,
            "length": int,
            "seq": int,  # the worker's number for this arrival
            "job": str,
        },
        0,
    ),
    "placed": ({"seq": int}, 0),
    "report": ({"rows": list, "status": dict, "cpu_s": _NUMBER, "queued": int}, 0),
}


class ChannelError(GatewayError):
    """A packet on a coordinator/worker channel that is not one."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.INTERNAL)


def encode(kind: str, fields: dict[str, Any]) -> bytes:
    return msgpack.packb({"k": kind, **fields}, use_bin_type=True)  # type: ignore[no-any-return]


def decode(packet: bytes, fd_count: int) -> tuple[str, dict[str, Any]]:
    """The kind and fields of one packet that came with ``fd_count`` descriptors."""
    try:
        message = msgpack.unpackb(packet, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ChannelError(f"a packet of {len(packet)} bytes is not msgpack: {exc}") from None
    if not isinstance(message, dict):
        raise ChannelError(f"a packet is a {type(message).__name__}, not a map")
    kind = message.pop("k", None)
    if not isinstance(kind, str) or kind not in KINDS:
        raise ChannelError(f"unknown packet kind {kind!r}")
    schema, fds = KINDS[kind]
    if set(message) != set(schema):
        missing = sorted(set(schema) - set(message))
        extra = sorted(str(k) for k in set(message) - set(schema))
        raise ChannelError(f"{kind} packet: missing keys {missing}, unknown keys {extra}")
    for key, kind_of in schema.items():
        value = message[key]
        bad_bool = isinstance(value, bool) and kind_of is not bool
        if bad_bool or not isinstance(value, kind_of):
            raise ChannelError(f"{kind} packet: {key} is a {type(value).__name__}")
    if fd_count != fds:
        raise ChannelError(f"{kind} packet came with {fd_count} descriptors, not {fds}")
    return kind, message


Handler = Callable[[str, dict[str, Any], list[int]], None]


class Channel:
    """One end of a socketpair, on the running event loop.

    ``on_message(kind, fields, fds)`` owns the descriptors it is given;
    ``on_closed(reason)`` runs once, at end of file or on a bad packet.
    """

    def __init__(self, sock: socket.socket, on_message: Handler, on_closed: Callable[[str], None]):
        sock.setblocking(False)
        self.sock = sock
        self._on_message = on_message
        self._on_closed = on_closed
        self._queue: deque[tuple[bytes, list[int]]] = deque()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)
        self._writing = False  # waiting for the socket to take more
        self.closed = False

    def send(self, kind: str, fields: dict[str, Any], fds: list[int] | None = None) -> None:
        """Queue a packet; the descriptors are the channel's from here (closed once sent)."""
        if self.closed:
            close_all(fds or [])
            return
        self._queue.append((encode(kind, fields), fds or []))
        if len(self._queue) == 1:
            self._writable()

    def _writable(self) -> None:
        while self._queue:
            packet, fds = self._queue[0]
            try:
                self.sock.sendmsg([packet], fd_ancillary(fds) if fds else [])
            except BlockingIOError:
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(self.sock.fileno(), self._writable)
                return
            except OSError as exc:
                self._close(f"cannot send: {exc}")
                return
            self._queue.popleft()
            close_all(fds)
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        for _ in range(64):  # then let other work run
            try:
                packet, ancdata, flags, _ = self.sock.recvmsg(
                    MAX_PACKET_BYTES, FD_SPACE, socket.MSG_CMSG_CLOEXEC
                )
            except BlockingIOError:
                return
            except OSError as exc:
                self._close(f"cannot receive: {exc}")
                return
            fds = fds_from_ancillary(ancdata) if ancdata else []
            if not packet and not fds:
                self._close("end of file")
                return
            try:
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    raise ChannelError("a packet or its descriptors were cut short")
                kind, fields = decode(packet, len(fds))
            except ChannelError as exc:
                close_all(fds)
                self._close(f"bad packet: {exc}")
                return
            self._on_message(kind, fields, fds)
            if self.closed:
                return

    def _close(self, reason: str) -> None:
        if self.closed:
            return
        self.close()
        self._on_closed(reason)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self.sock.fileno())
        if self._writing:
            self._loop.remove_writer(self.sock.fileno())
        for _, fds in self._queue:
            close_all(fds)
        self._queue.clear()
        self.sock.close()
