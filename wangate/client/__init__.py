"""The trainer's side of the local API: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Both speak proto/localapi.md over the gateway's Unix socket, as thin shells over one
client protocol without I/O (``protocol.py``: each call written once). Tensors are
encoded by ``wangate.codec`` under the policy the gateway announces in its hello
reply; error feedback for lossy codecs is kept per (peer, tag) (``session.py``). The
payload is written from the encoded buffer itself and read into one buffer that
becomes the array.

- ``protocol``: the calls, frames in, typed answers (``wangate.localapi.replies``)
- ``session``: hello settings, codec policy, segments, tensors in and out
- ``blocking``: ``Client``; ``aio``: ``AsyncClient``
- ``failures``: the errors raised for a gateway unreachable, lost, or refusing
- ``address``: the socket path and the connect timeout
"""

from __future__ import annotations

from .address import CONNECT_TIMEOUT_S, DEFAULT_SOCKET, SOCKET_ENV
from .aio import AsyncClient
from .blocking import Client

__all__ = ["CONNECT_TIMEOUT_S", "DEFAULT_SOCKET", "SOCKET_ENV", "AsyncClient", "Client"]
