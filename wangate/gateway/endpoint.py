"""Where path connections come from: listening, dialing, authenticating, attaching.

The endpoint accepts and dials QUIC connections (``PathLink``), has each one prove
the peer's site (its certificate chains to the site CA and names a configured peer,
wangate.net.tls) and, once the hellos are exchanged, attaches it to that peer's
``PeerDriver`` if the path is configured. A dialed path is dialed again, with
backoff, whenever its connection ends; a path the peer dialed itself is not dialed
too (the two would only collide).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aioquic.quic.connection import QuicConnection

from wangate.config import Config, PathConfig
from wangate.core.frames import Hello
from wangate.errors import ErrorCode, GatewayError, LinkError
from wangate.net.address import host_port
from wangate.net.aioquic_compat import (
    AioquicIncompatible,
    check_aioquic,
    client_connection,
    connection_of,
)
from wangate.net.drain import open_draining_endpoint
from wangate.net.link import CLIENT_CID_BYTES, LocalSite, PathLink
from wangate.net.listener import PeerListener, listen_for_peers
from wangate.net.peer_driver import PeerDriver
from wangate.net.sockbuf import enlarge_socket_buffers
from wangate.net.tls import (
    authenticate_peer,
    client_quic_configuration,
    require_client_certificate,
    server_quic_configuration,
)

log = logging.getLogger("wangate.daemon")

DIAL_TIMEOUT_S = 5.0
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0

# a start-up failure: (config key, what failed, the OS error) -> the error to raise
StartupError = Callable[[str, str, OSError], GatewayError]


def startup_error(
    config_path: Path, key: str, what: str, exc: OSError | None = None
) -> GatewayError:
    """The one line a start-up failure exits with: file, key, what, the OS error."""
    reason = ""
    if exc is not None:
        # uvloop words it differently and keeps the errno on the cause
        cause = exc.__cause__ if exc.errno is None else exc
        errno = cause.errno if isinstance(cause, OSError) else None
        reason = f": {os.strerror(errno) if errno else exc}"
    return GatewayError(f"{config_path}: {key}: {what}{reason}", code=ErrorCode.STARTUP)


class Endpoint:
    def __init__(
        self,
        config: Config,
        site: LocalSite,
        drivers: Mapping[str, PeerDriver],
        startup_error: StartupError,
    ) -> None:
        self.config = config  # replaced on reload: accepted links are checked against it
        self.site = site
        self._drivers = drivers  # the backend's, as it changes
        self._startup_error = startup_error
        self._dial_tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._servers: list[PeerListener] = []
        self._closing = False
        self._accept_datagram_bytes = min(
            (p.max_datagram_size for peer in config.peers for p in peer.paths), default=1452
        )

    async def start(self) -> None:
        """Listen for peers and dial every configured path."""
        try:
            check_aioquic()
        except AioquicIncompatible as exc:
            raise GatewayError(str(exc), code=ErrorCode.STARTUP) from None
        server_cfg = server_quic_configuration(
            self.config, max_datagram_size=self._accept_datagram_bytes
        )

        def accept(connection: QuicConnection) -> PathLink:
            require_client_certificate(connection)
            return self._new_link(
                connection, dialed=False, datagram_bytes=self._accept_datagram_bytes
            )

        def authenticated(link: Any) -> bool:
            return bool(link.authenticated)

        for index, (host, port) in enumerate(self.config.site.listen):
            try:
                # peers prove their address (QUIC Retry) before any state is kept for them
                server = await listen_for_peers(
                    host,
                    port,
                    configuration=server_cfg,
                    create_protocol=accept,
                    is_established=authenticated,
                )
            except OSError as exc:
                raise self._startup_error(
                    f"site.listen[{index}]", f"cannot listen on {host_port(host, port)}", exc
                ) from None
            if server.transport is not None:
                enlarge_socket_buffers(server.transport.get_extra_info("socket"))
            self._servers.append(server)
            log.info("listening for peer gateways on %s", host_port(host, port))
        for peer in self.config.peers:
            for path in peer.paths:
                self.start_dialing(peer.name, path)

    async def stop(self) -> None:
        """Dial no more: every dial loop ends."""
        self._closing = True
        tasks = list(self._dial_tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        """Close the listening sockets (after the links they carry said goodbye)."""
        for server in self._servers:
            server.close()

    # ------------------------------------------------------------- dialing

    def start_dialing(self, peer: str, path: PathConfig) -> None:
        if path.remote is None:
            return  # the peer dials this path
        key = (peer, path.name)
        task = asyncio.ensure_future(self._dial_loop(peer, path))
        self._dial_tasks[key] = task

        def ended(done: asyncio.Task[None]) -> None:
            if self._dial_tasks.get(key) is done:
                del self._dial_tasks[key]

        task.add_done_callback(ended)

    def stop_dialing(self, peer: str, path: str | None = None) -> None:
        """Stop dialing ``path`` to ``peer`` (every path, if None)."""
        for key in [key for key in self._dial_tasks if key[0] == peer]:
            if path is None or key[1] == path:
                self._dial_tasks.pop(key).cancel()

    async def _dial_loop(self, peer: str, path: PathConfig) -> None:
        backoff_s = BACKOFF_INITIAL_S
        driver = self._drivers[peer]
        while not self._closing:
            existing = driver.links.get(path.name)
            if existing is not None:
                # the peer dialed this path itself; ours would only collide with it
                await existing.wait_closed()
                continue
            try:
                link = await self._dial(peer, path)
            except (TimeoutError, OSError, ConnectionError) as exc:
                log.info("%s/%s: cannot connect to %s: %s", peer, path.name, path.remote, exc)
            else:
                backoff_s = BACKOFF_INITIAL_S
                await link.wait_closed()
                if self._closing:
                    return
                log.info("%s/%s: connection closed (%s)", peer, path.name, link.refused or "")
            await asyncio.sleep(backoff_s * random.uniform(0.5, 1.0))
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)

    async def _dial(self, peer: str, path: PathConfig) -> PathLink:
        link = await self.open_link(peer, path)
        try:
            await link.wait_handshake(DIAL_TIMEOUT_S)
        except BaseException:
            link.close()
            raise
        return link

    async def open_link(self, peer: str, path: PathConfig) -> PathLink:
        """A connection on ``path`` with its handshake started (not awaited)."""
        assert path.remote is not None
        remote_host, remote_port = path.remote
        family = ipaddress.ip_address(remote_host).version
        local_host = path.local or ("::" if family == 6 else "0.0.0.0")
        configuration = client_quic_configuration(
            self.config, peer, max_datagram_size=path.max_datagram_size
        )
        # a socket of the link's own, read down to empty each turn; once the path is up
        # its data plane reads it in batches (PathLink._read_batches)
        transport, link = await open_draining_endpoint(
            lambda: self._new_link(
                client_connection(configuration, CLIENT_CID_BYTES),
                dialed=True,
                peer=peer,
                path=path.name,
                datagram_bytes=path.max_datagram_size,
            ),
            local_host,
            0,
        )
        enlarge_socket_buffers(transport.get_extra_info("socket"))
        link.connect((remote_host, remote_port))
        return link

    # --------------------------------------------------------------- links

    def _new_link(
        self,
        connection: QuicConnection,
        *,
        dialed: bool,
        datagram_bytes: int,
        peer: str | None = None,
        path: str | None = None,
    ) -> PathLink:
        return PathLink(
            connection,
            site=self.site,
            authenticate=self._authenticate,
            attach=self._attach,
            dialed=dialed,
            peer=peer,
            path=path,
            datagram_bytes=datagram_bytes,
        )

    def _authenticate(self, link: PathLink) -> str:
        return authenticate_peer(
            connection_of(link),
            ca_path=self.config.tls.ca,
            allowed_sites=self._drivers.keys(),
            expected_site=link.peer if link.dialed else None,
        )

    def _attach(self, link: PathLink, hello: Hello) -> PeerDriver | None:
        """The driver of the peer ``link`` is a path to, if the path is configured and
        the driver takes it."""
        assert link.peer is not None
        driver = self._drivers.get(link.peer)
        if driver is None:  # removed by a reload since it authenticated
            link.refuse(LinkError.PROTOCOL, f"peer {link.peer} is not configured")
            return None
        peer_cfg = self.config.peer(link.peer)
        if hello.path not in {p.name for p in peer_cfg.paths}:
            link.refuse(
                LinkError.PROTOCOL, f"path {hello.path!r} is not configured for {link.peer}"
            )
            return None
        if not driver.admit(link, hello):
            return None
        if not link.dialed:  # accepted with the listener's size: fit this path's MTU too
            link.fit_datagrams(peer_cfg.path(hello.path).max_datagram_size)
        return driver
