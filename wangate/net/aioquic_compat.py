"""Every private part of aioquic wangate relies on, in one place, checked at start-up.

aioquic (1.7.2) has no public API for what a gateway needs here: asking a client for
its certificate and reading it, swapping the pacer, looking at the DATAGRAM queue and
the peer's address. Each access goes through a function below, and
:func:`check_aioquic` exercises all of them on a throw-away connection when the daemon
starts: if an aioquic upgrade renamed or moved one, the daemon refuses to start with
an error naming the attribute, instead of misbehaving on the first peer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import aioquic
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection, QuicConnectionState
from aioquic.quic.recovery import QuicPacketPacer

from wangate.errors import WangateError

P = TypeVar("P", bound=QuicPacketPacer)

# (object, attribute, what wangate uses it for): what check_aioquic() looks for
_CONNECTION_ATTRIBUTES = (
    ("_datagrams_pending", "the DATAGRAM queue the links keep short"),
    ("_network_paths", "the peer's address shown by `wangate paths`"),
    ("_initialize", "the hook that makes a server ask for a client certificate"),
    ("_handshake_complete", "authenticating a peer only after its handshake"),
    ("_loss", "the recovery state holding the pacer"),
    ("_state", "forgetting a refused half-open connection"),
    ("_close_pending", "forgetting a refused half-open connection"),
)
_OPEN_STATES = (QuicConnectionState.FIRSTFLIGHT, QuicConnectionState.CONNECTED)
_PACER_ATTRIBUTES = (
    "_max_datagram_size",
    "bucket_max",
    "bucket_time",
    "evaluation_time",
    "packet_time",
)
_TLS_ATTRIBUTES = (
    ("_request_client_certificate", "asking the client for its site certificate"),
    ("_peer_certificate", "the certificate the peer proved it holds the key of"),
    ("_peer_certificate_chain", "the intermediates sent with it"),
    ("get_session_ticket_cb", "turning session resumption off"),
    ("new_session_ticket_cb", "turning session tickets off"),
)


class AioquicIncompatible(WangateError):
    """The installed aioquic lacks a private attribute wangate relies on."""


def _missing(owner: str, attribute: str, why: str) -> AioquicIncompatible:
    return AioquicIncompatible(
        f"aioquic {aioquic.__version__} is not compatible with this wangate: {owner} has "
        f"no attribute {attribute!r} (used for {why}); install aioquic 1.7.x"
    )


def check_aioquic() -> None:
    """Raise :class:`AioquicIncompatible` naming the first private part that moved."""
    connection = QuicConnection(configuration=QuicConfiguration(is_client=True))
    for attribute, why in _CONNECTION_ATTRIBUTES:
        if not hasattr(connection, attribute):
            raise _missing("QuicConnection", attribute, why)
    if not isinstance(connection._datagrams_pending, deque):
        raise _missing("QuicConnection", "_datagrams_pending", "a deque of datagrams")
    recovery = connection._loss
    pacer = getattr(recovery, "_pacer", None)
    if not isinstance(pacer, QuicPacketPacer):
        raise _missing("QuicPacketRecovery", "_pacer", "sending critical data unpaced")
    for attribute in _PACER_ATTRIBUTES:
        if not hasattr(pacer, attribute):
            raise _missing("QuicPacketPacer", attribute, "copying the pacer's state")
    initialized: list[bool] = []
    after_initialize(connection, lambda: initialized.append(True))
    connection.connect(("127.0.0.1", 9), now=0.0)  # builds the TLS context; sends nothing
    if not initialized:
        raise _missing("QuicConnection", "_initialize", "a hook that connect() no longer calls")
    for attribute, why in _TLS_ATTRIBUTES:
        if not hasattr(connection.tls, attribute):
            raise _missing("tls.Context", attribute, why)


# ----------------------------------------------------------------- accessors


def after_initialize(connection: QuicConnection, hook: Callable[[], None]) -> None:
    """Run ``hook`` right after ``connection`` builds its TLS context (first Initial)."""
    original = connection._initialize

    def initialize(peer_cid: bytes) -> None:
        original(peer_cid)
        hook()

    setattr(connection, "_initialize", initialize)  # noqa: B010 - instance override


def request_client_certificate(tls: Any) -> None:
    """Make a server's TLS context send a CertificateRequest (RFC 8446 §4.3.2)."""
    tls._request_client_certificate = True


def peer_certificate(tls: Any) -> Any:
    """The certificate the peer proved it holds the key of, or None."""
    return tls._peer_certificate


def peer_certificate_chain(tls: Any) -> list[Any]:
    return list(tls._peer_certificate_chain)


def handshake_complete(connection: QuicConnection) -> bool:
    return bool(getattr(connection, "_handshake_complete", False))


def closing(connection: QuicConnection) -> bool:
    """Closed, or its close is on its way out."""
    return connection._state not in _OPEN_STATES or connection._close_pending


def datagrams_pending(connection: QuicConnection) -> deque[bytes]:
    """aioquic's queue of DATAGRAM frames not yet sent (no public view of it)."""
    return connection._datagrams_pending


def peer_address(connection: QuicConnection) -> tuple[str, int] | None:
    paths = connection._network_paths
    if not paths:
        return None
    host, port = paths[0].addr[:2]
    return str(host), int(port)


def replace_pacer(connection: QuicConnection, make: Callable[[QuicPacketPacer], P]) -> P:
    """Swap a fresh connection's pacer for ``make(old)``."""
    recovery = connection._loss
    pacer = make(recovery._pacer)
    recovery._pacer = pacer
    return pacer


def congestion_control(connection: QuicConnection) -> Any:
    """The connection's congestion controller (the pacer takes its rate from ours)."""
    return getattr(connection._loss, "_cc", None)
