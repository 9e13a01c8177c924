"""Mutual TLS site authentication over real QUIC (aioquic) on loopback UDP.

A tiny gated server, following the gateway's own policy: every connection asks for a
client certificate, holds all events back from the application until
``authenticate_peer`` accepts the peer site, and is closed if it does not. Clients send
stream data the moment their handshake completes, in the same flight as their TLS
Finished, so a refused client's data reaches the server's QUIC stack and must be held.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import (
    ConnectionTerminated,
    HandshakeCompleted,
    QuicEvent,
    StreamDataReceived,
)
from aioquic.quic.packet import QuicErrorCode
from aioquic.tls import AlertDescription

from wangate.certs import create_ca, issue_site_certificate
from wangate.config import Config, parse_config
from wangate.errors import AuthenticationError, ConfigError, LocalProtocolError
from wangate.net.tls import (
    ALPN,
    AUTHENTICATION_FAILED_ERROR_CODE,
    CIPHER_SUITES,
    IDLE_TIMEOUT_S,
    authenticate_peer,
    client_quic_configuration,
    require_client_certificate,
    server_quic_configuration,
)

pytestmark = pytest.mark.timeout(60)

DATAGRAM_BYTES = 1452
STEP_TIMEOUT_S = 5.0
PAYLOAD = b"gradient bytes sent right after the handshake"
BAD_CERTIFICATE = QuicErrorCode.CRYPTO_ERROR + AlertDescription.bad_certificate


@dataclass
class Pki:
    ours: Path  # our CA: ca.pem, bj.*, sh.*, gz.*
    theirs: Path  # another CA: ca.pem, bj.*, sh.*


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    pki = Pki(ours=root / "ours", theirs=root / "theirs")
    create_ca(pki.ours)
    create_ca(pki.theirs, name="someone else's CA")
    for site in ("bj", "sh", "gz"):
        issue_site_certificate(pki.ours, site)
    for site in ("bj", "sh"):
        issue_site_certificate(pki.theirs, site)
    return pki


def site_config(directory: Path, site: str, peer: str) -> Config:
    text = f"""
[site]
name = "{site}"
socket = "{site}.sock"
listen = ["127.0.0.1:7443"]

[tls]
ca = "ca.pem"
cert = "{site}.pem"
key = "{site}.key"

[[peers]]
name = "{peer}"
[[peers.paths]]
name = "loopback"
remote = "127.0.0.1:7443"
"""
    return parse_config(text, directory / f"{site}.toml")


@dataclass
class ServerLog:
    """What the gated server saw: admitted to the app, held back, and each connection."""

    app_data: list[tuple[int, bytes]] = field(default_factory=list)
    held_back: list[QuicEvent] = field(default_factory=list)
    connections: list[GatedServerProtocol] = field(default_factory=list)
    authenticated: asyncio.Event = field(default_factory=asyncio.Event)


class GatedServerProtocol(QuicConnectionProtocol):
    def __init__(
        self, quic: QuicConnection, *args: Any, log: ServerLog, config: Config, **kwargs: Any
    ) -> None:
        super().__init__(quic, *args, **kwargs)
        require_client_certificate(quic)
        self._log = log
        self._config = config
        self.site: str | None = None  # the authenticated peer site
        self.failure: AuthenticationError | None = None
        log.connections.append(self)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted):
            self._authenticate()
        if self.site is None:
            self._log.held_back.append(event)
            return
        if isinstance(event, HandshakeCompleted):
            self._log.authenticated.set()
        elif isinstance(event, StreamDataReceived):
            self._log.app_data.append((event.stream_id, event.data))
            if event.end_stream:
                self._quic.send_stream_data(event.stream_id, b"ack:" + event.data, True)
                self.transmit()

    def _authenticate(self) -> None:
        try:
            self.site = authenticate_peer(
                self._quic,
                ca_path=self._config.tls.ca,
                allowed_sites=[p.name for p in self._config.peers],
            )
        except AuthenticationError as exc:
            self.failure = exc
            self._quic.close(
                error_code=AUTHENTICATION_FAILED_ERROR_CODE,
                reason_phrase=f"site authentication failed: {exc}",
            )


class EagerClientProtocol(QuicConnectionProtocol):
    """Sends PAYLOAD as soon as its own handshake completes, before any reply."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.terminated: ConnectionTerminated | None = None
        self.replies: list[bytes] = []
        self.replied = asyncio.Event()
        self.handshake_events: list[HandshakeCompleted] = []

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted):
            self.handshake_events.append(event)
            stream_id = self._quic.get_next_available_stream_id()
            self._quic.send_stream_data(stream_id, PAYLOAD, end_stream=True)
        elif isinstance(event, StreamDataReceived):
            self.replies.append(event.data)
            if event.end_stream:
                self.replied.set()
        elif isinstance(event, ConnectionTerminated):
            self.terminated = event


async def _start_server(config: Config, log: ServerLog) -> tuple[QuicServer, int]:
    server = await serve(
        "127.0.0.1",
        0,
        configuration=server_quic_configuration(config, max_datagram_size=DATAGRAM_BYTES),
        create_protocol=partial(GatedServerProtocol, log=log, config=config),
    )
    assert server._transport is not None
    port: int = server._transport.get_extra_info("sockname")[1]
    return server, port


def attacker_configuration(cert: Path | None, key: Path | None) -> QuicConfiguration:
    """A client that trusts any server and presents whatever it is given."""
    configuration = QuicConfiguration(
        is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE, server_name="sh"
    )
    if cert is not None:
        configuration.load_cert_chain(cert, key)
    return configuration


async def _refused_by_server(server_config: Config, client: QuicConfiguration) -> None:
    log = ServerLog()
    server, port = await _start_server(server_config, log)
    try:
        async with connect(
            "127.0.0.1", port, configuration=client, create_protocol=EagerClientProtocol
        ) as protocol:
            assert isinstance(protocol, EagerClientProtocol)
            # The client's own handshake completed and it sent its data at once.
            assert len(protocol.handshake_events) == 1
            await asyncio.wait_for(protocol.wait_closed(), STEP_TIMEOUT_S)
            terminated = protocol.terminated
    finally:
        server.close()

    assert log.app_data == []
    assert not log.authenticated.is_set()
    assert terminated is not None
    assert terminated.error_code == AUTHENTICATION_FAILED_ERROR_CODE
    assert terminated.reason_phrase.startswith("site authentication failed: ")
    [connection] = log.connections
    assert connection.site is None
    assert connection.failure is not None
    assert terminated.reason_phrase == f"site authentication failed: {connection.failure}"
    # The data did reach the server's QUIC stack, in the flight after the handshake, and
    # was held back from the application.
    held_data = [e for e in log.held_back if isinstance(e, StreamDataReceived)]
    assert [(e.stream_id, e.data) for e in held_data] == [(0, PAYLOAD)]
    raise connection.failure


def test_a_site_from_our_ca_is_accepted_and_its_data_delivered(pki: Pki) -> None:
    async def main() -> None:
        server_config = site_config(pki.ours, "sh", peer="bj")
        client_config = site_config(pki.ours, "bj", peer="sh")
        log = ServerLog()
        server, port = await _start_server(server_config, log)
        configuration = client_quic_configuration(
            client_config, "sh", max_datagram_size=DATAGRAM_BYTES
        )
        try:
            async with connect(
                "127.0.0.1",
                port,
                configuration=configuration,
                create_protocol=EagerClientProtocol,
            ) as protocol:
                assert isinstance(protocol, EagerClientProtocol)
                # The client checks the server's site too.
                assert (
                    authenticate_peer(
                        protocol._quic,
                        ca_path=client_config.tls.ca,
                        allowed_sites={"sh"},
                        expected_site="sh",
                    )
                    == "sh"
                )
                await asyncio.wait_for(protocol.replied.wait(), STEP_TIMEOUT_S)
                assert protocol.replies == [b"ack:" + PAYLOAD]
        finally:
            server.close()
        assert log.app_data == [(0, PAYLOAD)]
        [connection] = log.connections
        assert (connection.site, connection.failure) == ("bj", None)
        # Only ProtocolNegotiated (before the handshake completed) was held back.
        assert [type(e).__name__ for e in log.held_back] == ["ProtocolNegotiated"]

    asyncio.run(main())


def test_a_client_without_certificate_is_refused(pki: Pki) -> None:
    server_config = site_config(pki.ours, "sh", peer="bj")
    with pytest.raises(AuthenticationError, match=r"^peer presented no certificate$"):
        asyncio.run(_refused_by_server(server_config, attacker_configuration(None, None)))


def test_a_client_from_another_ca_is_refused(pki: Pki) -> None:
    server_config = site_config(pki.ours, "sh", peer="bj")
    client = attacker_configuration(pki.theirs / "bj.pem", pki.theirs / "bj.key")
    with pytest.raises(AuthenticationError, match="does not verify against our CA"):
        asyncio.run(_refused_by_server(server_config, client))


def test_a_client_naming_an_unknown_site_is_refused(pki: Pki) -> None:
    server_config = site_config(pki.ours, "sh", peer="bj")
    client = attacker_configuration(pki.ours / "gz.pem", pki.ours / "gz.key")
    with pytest.raises(AuthenticationError, match="names site 'gz', not a configured peer"):
        asyncio.run(_refused_by_server(server_config, client))


def test_a_client_presenting_the_server_own_certificate_is_refused(pki: Pki) -> None:
    # sh's certificate is from our CA, but sh is not a peer of itself.
    server_config = site_config(pki.ours, "sh", peer="bj")
    client = attacker_configuration(pki.ours / "sh.pem", pki.ours / "sh.key")
    with pytest.raises(AuthenticationError, match="names site 'sh', not a configured peer"):
        asyncio.run(_refused_by_server(server_config, client))


def test_a_client_with_a_stolen_certificate_but_not_its_key_fails_the_handshake(
    tmp_path: Path, pki: Pki
) -> None:
    create_ca(tmp_path)
    issue_site_certificate(tmp_path, "bj")  # a key that is not bj's from our CA

    async def main() -> None:
        server_config = site_config(pki.ours, "sh", peer="bj")
        log = ServerLog()
        server, port = await _start_server(server_config, log)
        client = attacker_configuration(pki.ours / "bj.pem", tmp_path / "bj.key")
        try:
            async with connect(
                "127.0.0.1",
                port,
                configuration=client,
                create_protocol=EagerClientProtocol,
            ) as protocol:
                assert isinstance(protocol, EagerClientProtocol)
                await asyncio.wait_for(protocol.wait_closed(), STEP_TIMEOUT_S)
                terminated = protocol.terminated
        finally:
            server.close()
        # CertificateVerify does not check out: TLS itself aborts the handshake.
        assert terminated is not None
        assert terminated.error_code == QuicErrorCode.CRYPTO_ERROR + AlertDescription.decrypt_error
        assert log.app_data == []
        assert not log.authenticated.is_set()
        assert [c.site for c in log.connections] == [None]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("server_side", "reason"),
    [
        (("theirs", "sh"), "unable to get local issuer certificate"),
        (("ours", "gz"), "hostname 'sh' doesn't match"),
    ],
)
def test_the_client_refuses_a_server_from_another_ca_or_of_another_site(
    pki: Pki, server_side: tuple[str, str], reason: str
) -> None:
    authority, server_site = server_side

    async def main() -> None:
        server_config = site_config(getattr(pki, authority), server_site, peer="bj")
        client_config = site_config(pki.ours, "bj", peer="sh")
        log = ServerLog()
        server, port = await _start_server(server_config, log)
        configuration = client_quic_configuration(
            client_config, "sh", max_datagram_size=DATAGRAM_BYTES
        )
        protocols: list[EagerClientProtocol] = []

        def create_protocol(*args: Any, **kwargs: Any) -> EagerClientProtocol:
            protocols.append(EagerClientProtocol(*args, **kwargs))
            return protocols[-1]

        try:
            with pytest.raises(ConnectionError):
                async with connect(
                    "127.0.0.1",
                    port,
                    configuration=configuration,
                    create_protocol=create_protocol,
                ):
                    pass
        finally:
            server.close()
        [protocol] = protocols
        assert protocol.handshake_events == []
        assert protocol.terminated is not None
        assert protocol.terminated.error_code == BAD_CERTIFICATE
        assert reason in protocol.terminated.reason_phrase
        assert log.app_data == []

    asyncio.run(main())


def test_configurations(pki: Pki) -> None:
    config = site_config(pki.ours, "bj", peer="sh")
    server = server_quic_configuration(config, max_datagram_size=1400)
    client = client_quic_configuration(config, "sh", max_datagram_size=1300)
    for configuration, is_client, size in ((server, False, 1400), (client, True, 1300)):
        assert configuration.is_client is is_client
        assert configuration.alpn_protocols == ["wangate/1"]
        assert configuration.max_datagram_size == size
        # no DATAGRAM frames in aioquic: datagrams travel in the data plane's packets
        assert configuration.max_datagram_frame_size is None
        assert [int(c) for c in configuration.cipher_suites] == [int(c) for c in CIPHER_SUITES]
        assert int(configuration.cipher_suites[0]) == 0x1301  # the cheapest to seal
        assert configuration.idle_timeout == IDLE_TIMEOUT_S == 10.0
        assert configuration.cafile == str(pki.ours / "ca.pem")
        assert configuration.session_ticket is None
        assert configuration.certificate.subject.rfc4514_string() == "CN=bj"
        assert configuration.private_key.public_key() == configuration.certificate.public_key()
    assert client.server_name == "sh"
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert server.verify_mode is None  # the server's check is authenticate_peer()
    with pytest.raises(ConfigError, match="no peer named 'gz'"):
        client_quic_configuration(config, "gz", max_datagram_size=1300)


def _client_connection(pki: Pki) -> QuicConnection:
    configuration = client_quic_configuration(
        site_config(pki.ours, "bj", peer="sh"), "sh", max_datagram_size=DATAGRAM_BYTES
    )
    return QuicConnection(configuration=configuration)


def _server_connection(config: Config, client: QuicConnection, **kwargs: Any) -> QuicConnection:
    return QuicConnection(
        configuration=server_quic_configuration(config, max_datagram_size=DATAGRAM_BYTES),
        original_destination_connection_id=client.original_destination_connection_id,
        **kwargs,
    )


CLIENT_ADDR, SERVER_ADDR = ("127.0.0.1", 1), ("127.0.0.1", 2)


def _exchange(client: QuicConnection, server: QuicConnection) -> Iterator[None]:
    """Move datagrams between two connections in memory until both fall silent."""
    for _ in range(20):
        moved = False
        for sender, receiver, source in (
            (client, server, CLIENT_ADDR),
            (server, client, SERVER_ADDR),
        ):
            for data, _addr in sender.datagrams_to_send(now=0.0):
                receiver.receive_datagram(data, source, now=0.0)
                moved = True
        yield
        if not moved:
            return


def _events(connection: QuicConnection) -> list[QuicEvent]:
    events = []
    while (event := connection.next_event()) is not None:
        events.append(event)
    return events


def test_misuse_is_refused_locally(pki: Pki) -> None:
    config = site_config(pki.ours, "sh", peer="bj")
    client = _client_connection(pki)
    with pytest.raises(LocalProtocolError, match="for server connections"):
        require_client_certificate(client)
    server = _server_connection(config, client)
    with pytest.raises(LocalProtocolError, match="needs a completed handshake"):
        authenticate_peer(server, ca_path=config.tls.ca, allowed_sites={"bj"})
    client.connect(SERVER_ADDR, now=0.0)
    for data, _addr in client.datagrams_to_send(now=0.0):
        server.receive_datagram(data, CLIENT_ADDR, now=0.0)  # creates its TLS context
    with pytest.raises(LocalProtocolError, match="before the connection receives data"):
        require_client_certificate(server)


def test_a_server_connection_that_never_asked_for_a_certificate_is_refused_locally(
    pki: Pki,
) -> None:
    server_config = site_config(pki.ours, "sh", peer="bj")
    client = _client_connection(pki)
    server = _server_connection(server_config, client)  # no require_client_certificate()
    client.connect(SERVER_ADDR, now=0.0)
    for _ in _exchange(client, server):
        pass
    server_events = _events(server)
    # The handshake completes without the client showing any certificate ...
    assert [e for e in server_events if isinstance(e, HandshakeCompleted)] != []
    assert server.tls._peer_certificate is None
    # ... so authenticate_peer() refuses to vouch for it rather than report "no certificate".
    with pytest.raises(
        LocalProtocolError, match=r"^call require_client_certificate\(\) on server connections$"
    ):
        authenticate_peer(server, ca_path=server_config.tls.ca, allowed_sites={"bj"})


def test_resumption_is_off_on_gated_server_connections(pki: Pki) -> None:
    server_config = site_config(pki.ours, "sh", peer="bj")
    tickets: list[Any] = []
    client = QuicConnection(
        configuration=client_quic_configuration(
            site_config(pki.ours, "bj", peer="sh"), "sh", max_datagram_size=DATAGRAM_BYTES
        ),
        session_ticket_handler=tickets.append,
    )
    # A driver that passes a ticket store by mistake still gets no resumption.
    server = _server_connection(
        server_config,
        client,
        session_ticket_fetcher=lambda label: None,
        session_ticket_handler=tickets.append,
    )
    require_client_certificate(server)
    client.connect(SERVER_ADDR, now=0.0)
    for _ in _exchange(client, server):
        pass
    assert authenticate_peer(server, ca_path=server_config.tls.ca, allowed_sites={"bj"}) == "bj"
    assert server.tls.get_session_ticket_cb is None
    assert server.tls.new_session_ticket_cb is None
    assert tickets == []  # no ticket issued: no later 0-RTT or certificate-less resumption


def test_authenticate_peer_checks_the_expected_and_allowed_sites(pki: Pki) -> None:
    server_config = site_config(pki.ours, "sh", peer="bj")
    client = _client_connection(pki)
    server = _server_connection(server_config, client)
    require_client_certificate(server)
    client.connect(SERVER_ADDR, now=0.0)
    for _ in _exchange(client, server):
        pass
    ca = pki.ours / "ca.pem"
    assert authenticate_peer(client, ca_path=ca, allowed_sites={"sh"}, expected_site="sh") == "sh"
    assert authenticate_peer(server, ca_path=ca, allowed_sites={"bj", "gz"}) == "bj"
    with pytest.raises(
        AuthenticationError, match="names site 'sh', but this connection is to 'gz'"
    ):
        authenticate_peer(client, ca_path=ca, allowed_sites={"sh", "gz"}, expected_site="gz")
    with pytest.raises(AuthenticationError, match="names site 'bj', not a configured peer"):
        authenticate_peer(server, ca_path=ca, allowed_sites={"gz"})
    with pytest.raises(AuthenticationError, match="does not verify against our CA"):
        authenticate_peer(server, ca_path=pki.theirs / "ca.pem", allowed_sites={"bj"})
    with pytest.raises(AuthenticationError, match="cannot check the peer: cannot read CA file"):
        authenticate_peer(server, ca_path=pki.ours / "missing.pem", allowed_sites={"bj"})
