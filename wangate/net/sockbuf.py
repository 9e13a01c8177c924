"""UDP socket buffers large enough for bursts, for the gateway and the probe alike."""

from __future__ import annotations

import contextlib
import socket

SOCKET_BUFFER_BYTES = 8 * 1024 * 1024
_SO_RCVBUFFORCE, _SO_SNDBUFFORCE = 33, 32  # Linux socket(7); not in the socket module


def enlarge_socket_buffers(sock: socket.socket | None) -> None:
    """Room for bursts: the kernel's default UDP buffers drop packets at high rates.

    As root, SO_*BUFFORCE goes past net.core.[rw]mem_max; otherwise we get what the
    limit allows.
    """
    if sock is None:
        return
    for force, plain in ((_SO_RCVBUFFORCE, socket.SO_RCVBUF), (_SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER_BYTES)
        except OSError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER_BYTES)
