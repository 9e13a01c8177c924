"""The peer listener on a real UDP socket, with real aioquic clients and forged packets."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, QuicEvent

from wangate.certs import create_ca, issue_site_certificate
from wangate.core.admission import AdmissionLimits
from wangate.lab.forge import (
    forged_initial,
    looks_like_token,
    short_header_garbage,
    validated_initials,
)
from wangate.net.drain import open_draining_endpoint
from wangate.net.listener import PeerListener, listen_for_peers

ALPN = ["test"]


class ServerProtocol(QuicConnectionProtocol):
    """Authenticates on HandshakeCompleted when ``admit`` is true, else closes at once."""

    admit = True

    def __init__(self, quic: QuicConnection) -> None:
        super().__init__(quic)
        self.authenticated = False

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted):
            if self.admit:
                self.authenticated = True
            else:
                self.close(error_code=0x2A, reason_phrase="not a configured site")


class RefusingProtocol(ServerProtocol):
    admit = False


class ClientProtocol(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.terminated: ConnectionTerminated | None = None
        self.saw_terminated = asyncio.Event()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self.terminated = event
            self.saw_terminated.set()


def configurations(directory: Path) -> tuple[QuicConfiguration, QuicConfiguration]:
    create_ca(directory)
    cert, key = issue_site_certificate(directory, "bj")
    server = QuicConfiguration(is_client=False, alpn_protocols=ALPN)
    server.load_cert_chain(cert, key)
    client = QuicConfiguration(is_client=True, alpn_protocols=ALPN, server_name="bj")
    client.verify_mode = ssl.CERT_REQUIRED
    client.load_verify_locations(cafile=str(directory / "ca.pem"))
    return server, client


async def start(
    server_cfg: QuicConfiguration,
    limits: AdmissionLimits,
    protocol: Callable[[QuicConnection], QuicConnectionProtocol] = ServerProtocol,
    retry: bool = True,
) -> tuple[PeerListener, int]:
    listener = await listen_for_peers(
        "127.0.0.1",
        0,
        configuration=server_cfg,
        create_protocol=protocol,
        is_established=lambda p: bool(getattr(p, "authenticated", False)),
        limits=limits,
        retry=retry,
    )
    assert listener.transport is not None
    return listener, int(listener.transport.get_extra_info("sockname")[1])


async def poll(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_a_real_client_connects_through_retry_and_forged_initials_leave_no_state(
    tmp_path: Path,
) -> None:
    server_cfg, client_cfg = configurations(tmp_path)

    async def main() -> None:
        # room for every answer below: 50 Retries, 50 token checks, one real client
        listener, port = await start(server_cfg, AdmissionLimits(response_burst=110))
        target = ("127.0.0.1", port)
        forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        forger.bind(("127.0.0.1", 0))
        # in batches that fit the socket's receive buffer, each counted before the next
        for _ in range(50):
            forger.sendto(forged_initial(), target)  # answered with a Retry each
        await poll(lambda: listener.retries_sent == 50)
        for _ in range(50):
            forger.sendto(forged_initial(token=looks_like_token()), target)  # dropped
        await poll(lambda: listener.invalid_tokens == 50)
        for _ in range(50):
            forger.sendto(short_header_garbage(), target)  # dropped
        forger.sendto(forged_initial(size=1199), target)  # too small to be an Initial
        await poll(lambda: listener.dropped == 51)
        assert listener.retries_sent == 50
        assert listener.invalid_tokens == 50
        assert listener.dropped == 51
        assert listener.connections == 0
        assert listener.connection_ids == 0
        async with connect(
            "127.0.0.1", port, configuration=client_cfg, create_protocol=ClientProtocol
        ) as client:
            await client.ping()
            assert client._quic._retry_source_connection_id is not None  # it went via Retry
            assert listener.retries_sent == 51
            assert listener.connections == 1
            assert listener.admission.half_open == 0
            assert listener.admission.established_count == 1
        await poll(lambda: listener.connections == 0)
        assert listener.connection_ids == 0
        listener.close()
        forger.close()

    asyncio.run(main())


def test_validated_half_open_connections_are_capped_per_source_and_in_total_then_expire(
    tmp_path: Path,
) -> None:
    server_cfg, _ = configurations(tmp_path)
    limits = AdmissionLimits(max_half_open=3, max_half_open_per_source=2, handshake_timeout_s=0.5)

    async def main() -> None:
        listener, port = await start(server_cfg, limits)
        target = ("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        first = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        first.bind(("127.0.0.2", 0))
        second = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        second.bind(("127.0.0.3", 0))
        # the Retry exchange needs the listener's loop running: do it in a thread
        from_first = await loop.run_in_executor(None, validated_initials, first, target, 4)
        from_second = await loop.run_in_executor(None, validated_initials, second, target, 4)
        assert len(from_first) == len(from_second) == 4
        for packet in from_first:
            first.sendto(packet, target)
        await poll(lambda: listener.admission.refused_source == 2)
        assert listener.connections == 2  # two from one address, the rest refused
        for packet in from_second:
            second.sendto(packet, target)
        await poll(lambda: listener.admission.refused_total == 3)
        assert listener.connections == 3  # the total cap: one more, from the other source
        assert listener.admission.half_open_from("127.0.0.2") == 2
        assert listener.admission.half_open_from("127.0.0.3") == 1
        # none of them can finish a handshake: the timeout closes and forgets them all
        await poll(lambda: listener.admission.timed_out == 3)
        assert listener.connections == 0
        assert listener.connection_ids == 0
        assert listener.admission.half_open == 0
        listener.close()
        first.close()
        second.close()

    asyncio.run(main())


def test_a_connection_refused_at_authentication_is_forgotten_at_once(tmp_path: Path) -> None:
    server_cfg, client_cfg = configurations(tmp_path)

    async def main() -> None:
        listener, port = await start(server_cfg, AdmissionLimits(), protocol=RefusingProtocol)
        async with connect(
            "127.0.0.1",
            port,
            configuration=client_cfg,
            create_protocol=ClientProtocol,
        ) as client:
            assert isinstance(client, ClientProtocol)
            await asyncio.wait_for(client.saw_terminated.wait(), 5.0)
            assert client.terminated is not None
            assert client.terminated.error_code == 0x2A
            assert client.terminated.reason_phrase == "not a configured site"
            # by the time the client hears the close, the listener holds nothing of it
            # (not after the closing period of RFC 9000 §10.2, three probe timeouts)
            assert listener.connections == 0
            assert listener.connection_ids == 0
            assert listener.admission.half_open == 0
            assert listener.admission.established_count == 0
        listener.close()

    asyncio.run(main())


def test_without_retry_initials_are_admitted_within_the_caps(tmp_path: Path) -> None:
    server_cfg, _ = configurations(tmp_path)
    limits = AdmissionLimits(max_half_open=8, max_half_open_per_source=5, handshake_timeout_s=30)

    async def main() -> None:
        listener, port = await start(server_cfg, limits, retry=False)
        first = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        first.bind(("127.0.0.4", 0))
        second = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        second.bind(("127.0.0.5", 0))
        for _ in range(20):
            first.sendto(forged_initial(), ("127.0.0.1", port))
        await poll(lambda: listener.admission.refused_source == 15)
        for _ in range(20):
            second.sendto(forged_initial(), ("127.0.0.1", port))
        admission = listener.admission
        await poll(lambda: admission.refused_source + admission.refused_total == 32)
        assert listener.admission.refused_total == 17  # 5 + 3 fill the total cap of 8
        assert listener.connections == 8
        assert listener.retries_sent == 0
        listener.close()
        assert listener.connections == 0
        assert listener.connection_ids == 0
        first.close()
        second.close()

    asyncio.run(main())


def test_retries_and_token_checks_stop_when_the_budget_is_spent(tmp_path: Path) -> None:
    server_cfg, _ = configurations(tmp_path)
    limits = AdmissionLimits(responses_per_s=0.001, response_burst=5)

    async def main() -> None:
        listener, port = await start(server_cfg, limits)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as forger:
            forger.bind(("127.0.0.6", 0))
            for _ in range(20):
                forger.sendto(forged_initial(), ("127.0.0.1", port))
            await poll(lambda: listener.admission.responses_dropped == 15)
            for _ in range(20):
                forger.sendto(forged_initial(token=looks_like_token()), ("127.0.0.1", port))
            await poll(lambda: listener.admission.responses_dropped == 35)
        assert listener.retries_sent == 5
        assert listener.invalid_tokens == 0  # no budget left to even look at them
        assert listener.connections == 0
        listener.close()

    asyncio.run(main())


def test_the_socket_is_read_to_empty_in_one_turn() -> None:
    """uvloop reads 32 datagrams per turn of the loop and asyncio's selector loop one;
    the listener's socket is read until the kernel's queue is empty."""

    class Recorder(asyncio.DatagramProtocol):
        def __init__(self) -> None:
            self.received: list[bytes] = []

        def datagram_received(self, data: bytes, addr: Any) -> None:
            self.received.append(data)

    async def main() -> None:
        transport, recorder = await open_draining_endpoint(Recorder, "127.0.0.1", 0)
        address = transport.get_extra_info("sockname")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for i in range(200):  # more than 32, within the default receive buffer
                sender.sendto(i.to_bytes(2, "big"), address)
            transport._read_ready()  # one readiness callback, as the loop would make it
            assert recorder.received == [i.to_bytes(2, "big") for i in range(200)]
            transport.sendto(b"back", sender.getsockname())
            assert sender.recv(16) == b"back"
        transport.close()
        assert transport.is_closing()
        await asyncio.sleep(0)

    asyncio.run(main())
