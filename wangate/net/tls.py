"""QUIC TLS between gateways: mutual certificate authentication of sites.

Both ends present their site certificate and both check the other's against the site
CA. aioquic (1.7.2) checks the server's certificate itself, but on the server side it
neither asks for a client certificate nor checks one. So, on every server connection:

1. :func:`require_client_certificate` right after the connection is built makes its TLS
   context send a CertificateRequest (RFC 8446 section 4.3.2) and turns session
   resumption off: a resumed session (or its 0-RTT data) carries no certificate at all.
2. On ``HandshakeCompleted``, :func:`authenticate_peer` checks the certificate the peer
   proved it holds the key of (CertificateVerify): that it chains to our CA, is valid
   now, and names a configured peer site. Clients call it too, for the site check.
3. Until that succeeds the connection's owner passes nothing from it to the
   application, and on failure closes it with ``AUTHENTICATION_FAILED_ERROR_CODE``.
"""

from __future__ import annotations

import ssl
from collections.abc import Collection
from pathlib import Path

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.tls import CipherSuite

from wangate.certs import load_ca_certificates, verify_site_certificate
from wangate.config import Config
from wangate.errors import (
    AuthenticationError,
    ConfigError,
    LinkError,
    LocalProtocolError,
    WangateError,
)
from wangate.net import aioquic_compat as compat
from wangate.net.congestion import CONGESTION_CONTROL_NAME
from wangate.net.link import SERVER_CID_BYTES

ALPN = "wangate/1"
IDLE_TIMEOUT_S = 10.0
# Application error code closing a connection whose peer failed site authentication.
# 0x2A mirrors the TLS alert bad_certificate(42) (RFC 8446 section 6.2).
AUTHENTICATION_FAILED_ERROR_CODE = LinkError.AUTHENTICATION_FAILED


def server_quic_configuration(config: Config, *, max_datagram_size: int) -> QuicConfiguration:
    """Configuration for connections peers dial to us: our certificate, their CA check."""
    return _configuration(config, is_client=False, max_datagram_size=max_datagram_size)


def client_quic_configuration(
    config: Config, peer: str, *, max_datagram_size: int
) -> QuicConfiguration:
    """Configuration for dialling ``peer``: aioquic checks its certificate names ``peer``."""
    config.peer(peer)  # an unknown peer is a ConfigError
    configuration = _configuration(config, is_client=True, max_datagram_size=max_datagram_size)
    configuration.server_name = peer
    configuration.verify_mode = ssl.CERT_REQUIRED
    return configuration


# The data plane seals every datagram with the suite negotiated here (proto/engine.md):
# AES-128-GCM first, the cheapest with AES-NI; aioquic's own order starts with AES-256.
CIPHER_SUITES = [
    CipherSuite.AES_128_GCM_SHA256,
    CipherSuite.AES_256_GCM_SHA384,
    CipherSuite.CHACHA20_POLY1305_SHA256,
]


def _configuration(config: Config, *, is_client: bool, max_datagram_size: int) -> QuicConfiguration:
    configuration = QuicConfiguration(
        is_client=is_client,
        alpn_protocols=[ALPN],
        idle_timeout=IDLE_TIMEOUT_S,
        max_datagram_size=max_datagram_size,
        congestion_control_algorithm=CONGESTION_CONTROL_NAME,  # loss-tolerant, model-based
        cipher_suites=CIPHER_SUITES,
        # the IDs a server issues; a client's: aioquic_compat.client_connection
        connection_id_length=SERVER_CID_BYTES,
        session_ticket=None,  # no resumption, no 0-RTT: every connection shows its cert
    )
    try:
        configuration.load_cert_chain(config.tls.cert, config.tls.key)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"{config.path}: tls: cannot load {config.tls.cert} / {config.tls.key}: {exc}"
        ) from exc
    configuration.load_verify_locations(cafile=str(config.tls.ca))
    return configuration


def require_client_certificate(connection: QuicConnection) -> None:
    """Make a server-side connection ask the client for its certificate.

    Call right after constructing the connection, before it receives any datagram: its
    TLS context is created when the first Initial packet arrives, inside
    ``QuicConnection._initialize``, which is wrapped here to set the request flag.
    """
    if connection.configuration.is_client:
        raise LocalProtocolError("require_client_certificate() is for server connections")
    if getattr(connection, "tls", None) is not None:
        raise LocalProtocolError(
            "require_client_certificate() must be called before the connection receives data"
        )

    def initialized() -> None:
        context = connection.tls
        compat.request_client_certificate(context)
        # Without a ticket fetcher a client's PSK (and its 0-RTT data) is never accepted,
        # and without a handler no ticket is ever issued.
        context.get_session_ticket_cb = None
        context.new_session_ticket_cb = None

    compat.after_initialize(connection, initialized)
    setattr(connection, "_wangate_requests_client_certificate", True)  # noqa: B010


def authenticate_peer(
    connection: QuicConnection,
    *,
    ca_path: Path,
    allowed_sites: Collection[str],
    expected_site: str | None = None,
) -> str:
    """Return the site the peer of ``connection`` proved to be, after its handshake.

    Raises :class:`AuthenticationError` unless the peer presented a certificate that
    chains to the CA in ``ca_path``, is valid now, and names a site in ``allowed_sites``
    (and ``expected_site``, when given). An unreadable CA file is an authentication
    failure too. Calling it before the handshake completed, or on a server connection
    that did not :func:`require_client_certificate`, is a :class:`LocalProtocolError`.
    """
    if not compat.handshake_complete(connection):
        raise LocalProtocolError("authenticate_peer() needs a completed handshake")
    is_server = not connection.configuration.is_client
    if is_server and not getattr(connection, "_wangate_requests_client_certificate", False):
        raise LocalProtocolError("call require_client_certificate() on server connections")
    context = connection.tls
    if context.session_resumed:
        raise AuthenticationError("peer resumed a session instead of presenting a certificate")
    certificate = compat.peer_certificate(context)
    if certificate is None:
        raise AuthenticationError("peer presented no certificate")
    try:
        trusted_cas = load_ca_certificates(ca_path)
    except WangateError as exc:  # fail closed: no CA to check against, no peer
        raise AuthenticationError(f"cannot check the peer: {exc}") from exc
    chain = compat.peer_certificate_chain(context)
    site = verify_site_certificate(certificate, chain, trusted_cas)
    if expected_site is not None and site != expected_site:
        raise AuthenticationError(
            f"peer certificate names site {site!r}, but this connection is to {expected_site!r}"
        )
    if site not in allowed_sites:
        raise AuthenticationError(f"peer certificate names site {site!r}, not a configured peer")
    return site
