"""wangate's native data plane: every datagram of an authenticated path, in C.

aioquic does the handshake, authentication and the control stream; once a path is up,
its datagrams travel in QUIC short-header packets sealed with keys derived from that
path's TLS 1.3 secrets (``proto/engine.md``), handled by ``_engine`` in batches.
"""

from wangate.engine._engine import (
    CID_BYTES,
    DATAGRAM_OVERHEAD_BYTES,
    READ_BATCH_BUFFERS,
    ListenerReader,
    PathChannel,
    ReadDatagrams,
)

__all__ = [
    "CID_BYTES",
    "DATAGRAM_OVERHEAD_BYTES",
    "READ_BATCH_BUFFERS",
    "ListenerReader",
    "PathChannel",
    "ReadDatagrams",
]
