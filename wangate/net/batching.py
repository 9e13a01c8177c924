"""Send a turn's QUIC datagrams in batches: one ``sendmsg`` per run of equal-sized
datagrams to one address, with UDP generic segmentation offload (Linux ``UDP_SEGMENT``).

One ``sendto`` per datagram made the system call the largest single cost of a busy
gateway (about a third of its CPU in the WAN lab). With ``UDP_SEGMENT`` the kernel cuts
one buffer into datagrams of the given size (the last may be shorter), so the socket,
route and firewall are walked once per batch, not once per datagram; the peer receives
ordinary datagrams. Where the option is missing or refused (not Linux, an old kernel, a
route that cannot segment) the batcher falls back to one ``sendto`` per datagram for
good. It also does so while the event loop's transport holds unsent data, so datagrams
never overtake ones queued before them.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import sys
from collections.abc import Iterable
from typing import Any

SOL_UDP = 17
UDP_SEGMENT = 103  # linux/udp.h
MAX_SEGMENTS = 64  # UDP_MAX_SEGMENTS is 64 on older kernels
MAX_BATCH_BYTES = 65000  # below the 65507-byte UDP payload limit
# errors that mean "this socket or route cannot segment": stop trying
_UNSUPPORTED = {errno.EINVAL, errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP}


class DatagramBatcher:
    def __init__(self, transport: asyncio.DatagramTransport) -> None:
        self._transport = transport
        self._sock: socket.socket | None = None
        raw = transport.get_extra_info("socket")
        if sys.platform == "linux" and raw is not None:
            # our own descriptor for the same socket: uvloop's transport exposes no sendmsg
            self._sock = socket.socket(fileno=os.dup(raw.fileno()))
        self.batches = 0  # sendmsg calls that carried more than one datagram

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def send(self, datagrams: Iterable[tuple[bytes, Any]]) -> None:
        run: list[bytes] = []
        run_addr: Any = None
        for data, addr in datagrams:
            if run and (
                addr != run_addr
                or len(data) > len(run[0])
                or len(run[-1]) < len(run[0])  # only the last may be shorter
                or len(run) >= MAX_SEGMENTS
                or (len(run) + 1) * len(run[0]) > MAX_BATCH_BYTES
            ):
                self._flush(run, run_addr)
                run = []
            run.append(data)
            run_addr = addr
        if run:
            self._flush(run, run_addr)

    def _queued(self) -> int:
        """Bytes the transport holds unsent (a transport that never queues: 0)."""
        size = getattr(self._transport, "get_write_buffer_size", None)
        return int(size()) if size is not None else 0

    def _flush(self, run: list[bytes], addr: Any) -> None:
        sock = self._sock
        if sock is None or len(run) == 1 or self._queued():
            for data in run:
                self._transport.sendto(data, addr)
            return
        segment = struct.pack("=H", len(run[0]))
        try:
            sock.sendmsg([b"".join(run)], [(SOL_UDP, UDP_SEGMENT, segment)], 0, addr)
        except OSError as exc:  # full buffer, unreachable, ...: the transport handles it
            if exc.errno in _UNSUPPORTED:
                self.close()  # this socket or route cannot segment: one datagram per call
        else:
            self.batches += 1
            return
        for data in run:
            self._transport.sendto(data, addr)
