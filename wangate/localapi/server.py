"""The Unix socket server trainers talk to: frames in, ``GatewayService`` calls, frames out.

This module owns the listening socket and the set of connections. Around it:

- ``listener``: the socket file (its mode from its first appearance, a stale one
  replaced) and the file-descriptor limit the connections need;
- ``admission``: who may connect, and how many at once, checked before anything is
  read from a new connection;
- ``connection``: one trainer's connection, reading frames, flow control, replies;
- ``dispatch``: a request's call on the service and the reply it makes;
- ``replies`` and ``protocol``: the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from wangate.localapi.access import AccessPolicy
from wangate.localapi.admission import Admission
from wangate.localapi.connection import MAX_REQUESTS_IN_FLIGHT, Connection
from wangate.localapi.listener import bind_unix_socket, ensure_file_limit
from wangate.service import GatewayService

log = logging.getLogger("wangate.localapi")

SOCKET_MODE = 0o660
MAX_CONNECTIONS = 1024  # [limits] max_local_connections
FILE_DESCRIPTOR_MARGIN = 256  # beyond the local connections: UDP sockets, files, logs

__all__ = ["MAX_CONNECTIONS", "MAX_REQUESTS_IN_FLIGHT", "SOCKET_MODE", "LocalApiServer"]


class LocalApiServer:
    def __init__(
        self,
        service: GatewayService,
        socket_path: str | os.PathLike[str],
        *,
        max_message_bytes: int,
        client_budget_bytes: int,
        socket_mode: int = SOCKET_MODE,
        listener: socket.socket | None = None,
        allow_uids: Sequence[int] | None = None,
        allow_gids: Sequence[int] | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.service = service
        # a listening socket inherited from systemd (wangate.socket): its file is not ours
        self._inherited = listener
        self.socket_path = Path(socket_path)
        self.max_message_bytes = max_message_bytes
        self.client_budget_bytes = client_budget_bytes
        self.socket_mode = socket_mode
        self.allow_uids = allow_uids
        self.allow_gids = allow_gids  # None: the socket file's group
        self.max_connections = max_connections
        self._admission: Admission | None = None  # set by start()
        self._listener: socket.socket | None = None
        self._socket_inode: int | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def policy(self) -> AccessPolicy | None:
        """Who is admitted (None until started)."""
        return None if self._admission is None else self._admission.policy

    @property
    def refused_connections(self) -> int:
        return 0 if self._admission is None else self._admission.refused

    async def start(self) -> None:
        if self._inherited is not None:
            self._listener = self._inherited
            socket_stat = os.stat(self.socket_path)
        else:
            self._listener = bind_unix_socket(self.socket_path, self.socket_mode)
            socket_stat = os.stat(self.socket_path)
            self._socket_inode = socket_stat.st_ino
        policy = AccessPolicy.build(self.allow_uids, self.allow_gids, socket_gid=socket_stat.st_gid)
        self._admission = Admission(policy, os.fspath(self.socket_path), self.max_connections)
        log.info("local API at %s admits %s", self.socket_path, policy.description)
        ensure_file_limit(self.max_connections + FILE_DESCRIPTOR_MARGIN)
        self._accept_task = asyncio.create_task(self._accept_loop())

    async def close(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept_task
            self._accept_task = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            # Remove the file only if it is still ours (a successor may have replaced it).
            with contextlib.suppress(OSError):
                if self._socket_inode is not None and (
                    os.stat(self.socket_path).st_ino == self._socket_inode
                ):
                    os.unlink(self.socket_path)

    async def __aenter__(self) -> LocalApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _accept_loop(self) -> None:
        assert self._listener is not None and self._admission is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                log.warning("accept failed on %s: %s", self.socket_path, exc)
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            if self._admission.admit(sock, len(self._connections)):
                connection = Connection(
                    self.service,
                    sock,
                    max_message_bytes=self.max_message_bytes,
                    client_budget_bytes=self.client_budget_bytes,
                )
                task = asyncio.create_task(connection.run())
                self._connections.add(task)
                task.add_done_callback(self._connections.discard)
