"""Every private part of aioquic wangate relies on, in one place, checked at start-up.

aioquic (1.7.2) has no public API for what a gateway needs here: asking a client for
its certificate and reading it, swapping the pacer, the peer's address, the secrets the
data plane's keys come from, a client with zero-length connection IDs, and a listener
of its own routing datagrams to its protocols.
Each access goes through a function below, and
:func:`check_aioquic` exercises all of them on a throw-away connection when the daemon
starts: if an aioquic upgrade renamed or moved one, the daemon refuses to start with
an error naming the attribute, instead of misbehaving on the first peer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable
from typing import Any, TypeVar

import aioquic
from aioquic import tls

# aioquic.buffer's Buffer, from the module that types it: aioquic.buffer imports it
# without re-exporting it, which mypy --strict refuses
from aioquic._buffer import Buffer as Buffer
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection, QuicConnectionState
from aioquic.quic.recovery import QuicPacketPacer
from aioquic.quic.stream import QuicStreamSender

from wangate.errors import WangateError

P = TypeVar("P", bound=QuicPacketPacer)
T = TypeVar("T")

# (object, attribute, what wangate uses it for): what check_aioquic() looks for
_CONNECTION_ATTRIBUTES = (
    ("_network_paths", "the peer's address shown by `wangate paths`"),
    ("_initialize", "the hook that makes a server ask for a client certificate"),
    ("_handshake_complete", "authenticating a peer only after its handshake"),
    ("_loss", "the recovery state holding the pacer"),
    ("_state", "forgetting a refused half-open connection"),
    ("_close_pending", "forgetting a refused half-open connection"),
    ("_close_event", "a path down as soon as the peer closed its connection"),
    ("_peer_cid", "a client's first Initial connection ID, the short header's size"),
    ("_original_destination_connection_id", "a client's first Initial connection ID"),
    ("_replenish_connection_ids", "a client that issues no connection IDs"),
    ("_streams", "the bytes a stream has yet to send"),
    ("_cryptos", "the path's TLS 1.3 secrets, from which the data plane's keys come"),
)
_PROTOCOL_ATTRIBUTES = (
    # what a QuicConnectionProtocol subclass (wangate.net.link.PathLink) reads of itself
    ("_quic", "the connection a protocol drives"),
    ("_loop", "a link's clock and callbacks"),
    ("_transport", "a link's socket"),
    ("_process_events", "a link handling a batch of datagrams"),
    ("_transmit_soon", "a link's deferred transmit"),
    # what a listener of wangate's own sets, as aioquic's QuicServer does
    ("_timer", "forgetting a refused half-open connection"),
    ("_connection_id_issued_handler", "routing datagrams by connection ID"),
    ("_connection_id_retired_handler", "routing datagrams by connection ID"),
    ("_connection_terminated_handler", "routing datagrams by connection ID"),
)
# A client's first Initial carries a Destination Connection ID of at least 8 bytes
# (RFC 9000 §7.2), whatever the length of the IDs it issues itself.
MIN_INITIAL_DCID_BYTES = 8
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
    if not isinstance(getattr(connection._peer_cid, "cid", None), bytes):
        raise _missing("QuicConnectionId", "cid", "the peer's connection ID")
    if not hasattr(QuicStreamSender(stream_id=0, writable=True), "_buffer"):
        raise _missing("QuicStreamSender", "_buffer", "the bytes a stream has yet to send")
    recovery = connection._loss
    pacer = getattr(recovery, "_pacer", None)
    if not isinstance(pacer, QuicPacketPacer):
        raise _missing("QuicPacketRecovery", "_pacer", "sending critical data unpaced")
    for attribute in _PACER_ATTRIBUTES:
        if not hasattr(pacer, attribute):
            raise _missing("QuicPacketPacer", attribute, "copying the pacer's state")
    for attribute in ("_rtt_smoothed", "_rtt_initialized", "_rtt_initial"):
        if not hasattr(recovery, attribute):
            raise _missing("QuicPacketRecovery", attribute, "the data plane's first RTT")
    initialized: list[bool] = []
    after_initialize(connection, lambda: initialized.append(True))
    connection.connect(("127.0.0.1", 9), now=0.0)  # builds the TLS context; sends nothing
    if not initialized:
        raise _missing("QuicConnection", "_initialize", "a hook that connect() no longer calls")
    for attribute, why in _TLS_ATTRIBUTES:
        if not hasattr(connection.tls, attribute):
            raise _missing("tls.Context", attribute, why)
    one_rtt = connection._cryptos.get(tls.Epoch.ONE_RTT)
    for attribute in ("secret", "cipher_suite"):
        if not hasattr(getattr(one_rtt, "send", None), attribute):
            raise _missing("CryptoContext", attribute, "the data plane's keys")
    client = client_connection(QuicConfiguration(is_client=True), 0)
    if client.host_cid != b"" or len(client.original_destination_connection_id) < 8:
        raise _missing("QuicConnection", "_peer_cid", "a client's first Initial connection ID")
    protocol = _in_a_running_loop(lambda: QuicConnectionProtocol(client))
    for attribute, why in _PROTOCOL_ATTRIBUTES:
        if not hasattr(protocol, attribute):
            raise _missing("QuicConnectionProtocol", attribute, why)
    server = _in_a_running_loop(lambda: QuicServer(configuration=QuicConfiguration()))
    if not hasattr(server, "_transport"):
        raise _missing("QuicServer", "_transport", "a server's socket")


def _in_a_running_loop(make: Callable[[], T]) -> T:
    """``make()`` with an event loop running: aioquic's protocols take the running one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()

        async def run() -> T:
            return make()

        try:
            return loop.run_until_complete(run())
        finally:
            loop.close()
    return make()


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


def closed_by_peer(connection: QuicConnection) -> str | None:
    """The reason the peer gave, once its CONNECTION_CLOSE arrived. aioquic reports the
    close only when the draining period ends (three PTOs, RFC 9000 §10.2.2), and in it
    the connection sends nothing: whatever went to it meanwhile was lost."""
    if connection._state is not QuicConnectionState.DRAINING:
        return None
    event = connection._close_event
    if event is None:
        return "closed by the peer"
    return event.reason_phrase or f"error 0x{event.error_code:x}"


def one_rtt_secrets(connection: QuicConnection) -> tuple[int, bytes, bytes]:
    """The cipher suite and the application traffic secrets (ours, the peer's) of a
    connection whose handshake completed (RFC 8446 §7.1), before any key update."""
    pair = connection._cryptos[tls.Epoch.ONE_RTT]
    send, recv = pair.send, pair.recv
    if send.secret is None or recv.secret is None or send.cipher_suite is None:
        raise AioquicIncompatible("aioquic: no 1-RTT secrets after the handshake")
    return int(send.cipher_suite), bytes(send.secret), bytes(recv.secret)


def smoothed_rtt_s(connection: QuicConnection) -> float:
    """aioquic's RTT estimate, from the handshake on (RFC 9002 §5.3)."""
    recovery = connection._loss
    return float(recovery._rtt_smoothed if recovery._rtt_initialized else recovery._rtt_initial)


def route_connection_id(protocol: QuicConnectionProtocol, cid: bytes) -> None:
    """Route datagrams carrying ``cid`` to ``protocol``, as for the IDs aioquic issues."""
    protocol._connection_id_issued_handler(cid)


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


def client_connection(configuration: QuicConfiguration, cid_bytes: int) -> QuicConnection:
    """A client connection that issues connection IDs of ``cid_bytes`` (0: none) while
    its first Initial's Destination Connection ID is 8 random bytes, as RFC 9000 §7.2
    wants; aioquic draws both at ``connection_id_length``, which the connection's own
    copy of ``configuration`` sets to ``cid_bytes``."""
    configuration = dataclasses.replace(configuration, connection_id_length=cid_bytes)
    connection = QuicConnection(configuration=configuration)
    if len(connection._peer_cid.cid) < MIN_INITIAL_DCID_BYTES:
        cid = os.urandom(MIN_INITIAL_DCID_BYTES)
        connection._peer_cid.cid = cid
        connection._original_destination_connection_id = cid
    if cid_bytes == 0:
        # An endpoint with a zero-length connection ID issues no others (RFC 9000
        # §5.1.1); aioquic would send NEW_CONNECTION_ID frames its peer must refuse.
        setattr(connection, "_replenish_connection_ids", _no_new_ids)  # noqa: B010
    return connection


def _no_new_ids() -> None:
    return None


def congestion_control(connection: QuicConnection) -> Any:
    """The connection's congestion controller (the pacer takes its rate from ours)."""
    return getattr(connection._loss, "_cc", None)


def stream_unsent_bytes(connection: QuicConnection, stream_id: int) -> int:
    """The bytes a stream holds that its peer has not acknowledged (0 once it is gone)."""
    stream = connection._streams.get(stream_id)
    return 0 if stream is None else len(stream.sender._buffer)


def pacer_datagram_size(pacer: QuicPacketPacer) -> int:
    """The packet size a pacer paces, as its connection set it."""
    size: int = pacer._max_datagram_size
    return size


# ------------------------------------------------------- protocols and servers


def connection_of(protocol: QuicConnectionProtocol) -> QuicConnection:
    """The connection a protocol drives."""
    return protocol._quic


def transport_of(endpoint: QuicConnectionProtocol | QuicServer) -> asyncio.DatagramTransport | None:
    """The UDP transport of a protocol or server, once it has one."""
    return endpoint._transport


def process_events(protocol: QuicConnectionProtocol) -> None:
    """Hand what the connection has to tell to ``protocol.quic_event_received``."""
    protocol._process_events()


def transmit_soon(protocol: QuicConnectionProtocol) -> None:
    """Transmit at the next turn of the loop, once however often this is called."""
    protocol._transmit_soon()


def route_connection_ids(
    protocol: QuicConnectionProtocol,
    *,
    issued: Callable[[bytes], None],
    retired: Callable[[bytes], None],
    terminated: Callable[[], None],
) -> None:
    """Tell a listener of ours each connection ID ``protocol`` issues or retires, and its
    end: how aioquic's QuicServer routes datagrams to its protocols."""
    protocol._connection_id_issued_handler = issued
    protocol._connection_id_retired_handler = retired
    protocol._connection_terminated_handler = terminated


def stop_timer(protocol: QuicConnectionProtocol) -> None:
    """Cancel the protocol's timer: it sends nothing more (in its closing period)."""
    if protocol._timer is not None:
        protocol._timer.cancel()
        protocol._timer = None
