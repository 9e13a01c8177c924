"""The gateway daemon: sessions per peer, QUIC links per path, the local API.

This is the asyncio shell around the pure ``PeerSession``: it dials and accepts path
connections, hands their bytes to the sessions, drives the sessions' timers, and
turns session events into deliveries for trainers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import random
import socket
import time
from typing import Any

from aioquic.asyncio.server import QuicServer, serve
from aioquic.quic.connection import QuicConnection

from wangate import __version__
from wangate.config import Config, PathConfig
from wangate.core.events import (
    MessageDelivered,
    MessageDropped,
    MessageFailed,
    MessageReceived,
    PathStateChanged,
)
from wangate.core.frames import Hello
from wangate.core.governor import BulkGovernor
from wangate.core.message import MessageHeader
from wangate.core.outbound import CodingPolicy
from wangate.core.selector import RouteChanged
from wangate.core.session import PeerSession
from wangate.errors import GatewayError, LocalProtocolError
from wangate.localapi.inbox import Inbox
from wangate.localapi.server import LocalApiServer
from wangate.metrics import GatewayMetrics
from wangate.metrics_http import MetricsServer
from wangate.net.link import (
    DATAGRAM_OVERHEAD_BYTES,
    ERROR_DUPLICATE,
    ERROR_PROTOCOL,
    ERROR_RESET,
    ERROR_SHUTDOWN,
    LinkHost,
    PathLink,
)
from wangate.net.tls import (
    authenticate_peer,
    client_quic_configuration,
    require_client_certificate,
    server_quic_configuration,
)
from wangate.service import Delivery, Submission, local_delivery

log = logging.getLogger("wangate.daemon")

DIAL_TIMEOUT_S = 5.0
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0
SOCKET_BUFFER_BYTES = 8 * 1024 * 1024


class PeerState:
    """The shell's side of one peer: its session, links, timer and counters."""

    def __init__(self, session: PeerSession) -> None:
        self.session = session
        self.links: dict[str, PathLink] = {}
        self.instance_id: int | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at: float | None = None
        self.pump_scheduled = False
        self.backlog_freed = asyncio.Event()
        self.failures: list[str] = []


class Gateway(LinkHost):
    """One site's gateway; implements ``GatewayService`` for the local API."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.site_name = config.site.name
        self.instance_id = random.getrandbits(63) | 1
        self.max_message_bytes = config.limits.max_message_bytes
        self.started_at = time.monotonic()
        self.inbox = Inbox(config.limits.peer_inbox_bytes)
        now = time.monotonic()
        target_ms = config.critical.host_delay_target_ms
        host_delay_target_s = target_ms / 1000 if target_ms else math.inf
        self.peers: dict[str, PeerState] = {
            peer.name: PeerState(
                PeerSession(
                    self.site_name,
                    peer.name,
                    max_message_bytes=self.max_message_bytes,
                    inbox_window_bytes=config.limits.peer_inbox_bytes,
                    now=now,
                    coding=CodingPolicy(
                        k=config.fec.k if config.fec.enabled else 0,
                        min_repair=config.fec.min_repair,
                        max_repair=config.fec.max_repair,
                        critical_min_repair=config.fec.critical_min_repair,
                    ),
                    governor=BulkGovernor(target_delay_s=host_delay_target_s),
                    partial_idle_s=config.limits.partial_message_idle_s,
                )
            )
            for peer in config.peers
        }
        self._servers: list[QuicServer] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._local_api: LocalApiServer | None = None
        self._closing = False
        self._accept_datagram_bytes = min(
            (p.max_datagram_size for peer in config.peers for p in peer.paths), default=1452
        )
        self.local_messages = 0
        self.metrics = GatewayMetrics()  # fed by submit() and _drain_events()
        self._metrics_server: MetricsServer | None = None

    # ----------------------------------------------------------- lifecycle

    async def start(self) -> None:
        server_cfg = server_quic_configuration(
            self.config, max_datagram_size=self._accept_datagram_bytes
        )

        def accept(connection: QuicConnection, stream_handler: Any = None) -> PathLink:
            require_client_certificate(connection)
            return PathLink(
                connection,
                stream_handler,
                host=self,
                dialed=False,
                datagram_bytes=self._accept_datagram_bytes,
            )

        for host, port in self.config.site.listen:
            server = await serve(host, port, configuration=server_cfg, create_protocol=accept)
            if server._transport is not None:
                enlarge_socket_buffers(server._transport.get_extra_info("socket"))
            self._servers.append(server)
            log.info("listening for peer gateways on %s", _fmt(host, port))
        for peer in self.config.peers:
            for path in peer.paths:
                if path.remote is not None:
                    self._spawn(self._dial_loop(peer.name, path))
        self._local_api = LocalApiServer(
            self,
            self.config.site.socket,
            max_message_bytes=self.max_message_bytes,
            client_budget_bytes=self.config.limits.client_budget_bytes,
            socket_mode=self.config.site.socket_mode,
        )
        await self._local_api.start()
        log.info("site %s: trainers connect at %s", self.site_name, self.config.site.socket)
        if self.config.metrics.listen is not None:
            self._metrics_server = MetricsServer(
                lambda: self.metrics.render(self.paths(), self.status())
            )
            await self._metrics_server.start(*self.config.metrics.listen)

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for state in self.peers.values():
            for link in list(state.links.values()):
                link.close(error_code=ERROR_SHUTDOWN, reason_phrase="gateway shutting down")
            if state.timer is not None:
                state.timer.cancel()
        for server in self._servers:
            server.close()
        if self._local_api is not None:
            await self._local_api.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()
        await asyncio.sleep(0)  # let the close frames go out

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------- dialing

    async def _dial_loop(self, peer: str, path: PathConfig) -> None:
        backoff_s = BACKOFF_INITIAL_S
        state = self.peers[peer]
        while not self._closing:
            existing = state.links.get(path.name)
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
        assert path.remote is not None
        loop = asyncio.get_running_loop()
        remote_host, remote_port = path.remote
        family = ipaddress.ip_address(remote_host).version
        local_host = path.local or ("::" if family == 6 else "0.0.0.0")
        configuration = client_quic_configuration(
            self.config, peer, max_datagram_size=path.max_datagram_size
        )
        _, link = await loop.create_datagram_endpoint(
            lambda: PathLink(
                QuicConnection(configuration=configuration),
                host=self,
                dialed=True,
                peer=peer,
                path=path.name,
                datagram_bytes=path.max_datagram_size,
            ),
            local_addr=(local_host, 0),
            family=socket.AF_INET6 if family == 6 else socket.AF_INET,
        )
        if link._transport is not None:
            enlarge_socket_buffers(link._transport.get_extra_info("socket"))
        link.connect((remote_host, remote_port))
        try:
            await asyncio.wait_for(link.wait_connected(), DIAL_TIMEOUT_S)
        except BaseException:
            link.close()
            raise
        return link

    # ------------------------------------------------------------ LinkHost

    def authenticate(self, link: PathLink) -> str:
        return authenticate_peer(
            link._quic,
            ca_path=self.config.tls.ca,
            allowed_sites=self.peers.keys(),
            expected_site=link.peer if link.dialed else None,
        )

    def link_ready(self, link: PathLink, hello: Hello) -> PeerSession | None:
        assert link.peer is not None and link.path is not None
        peer_cfg = self.config.peer(link.peer)
        if hello.path not in {p.name for p in peer_cfg.paths}:
            link.refuse(ERROR_PROTOCOL, f"path {hello.path!r} is not configured for {link.peer}")
            return None
        state = self.peers[link.peer]
        now = time.monotonic()
        if state.instance_id is not None and state.instance_id != hello.instance_id:
            log.warning("peer %s restarted: messages in progress with it fail", link.peer)
            state.session.peer_restarted(now)
            # connections to the old instance are dead even if they have not timed out
            for old in list(state.links.values()):
                if old is not link:
                    old.refuse(ERROR_DUPLICATE, "peer restarted")
        state.instance_id = hello.instance_id
        existing = state.links.get(hello.path)
        if existing is not None and existing is not link:
            # Both sides dialed the same path: keep the connection dialed by the site
            # whose name sorts first, on both sides alike.
            if existing.dialer_site <= link.dialer_site:
                link.refuse(ERROR_DUPLICATE, f"path {hello.path} is already connected")
                return None
            existing.refuse(ERROR_DUPLICATE, f"path {hello.path} replaced by the peer's dial")
        state.session.set_peer_limits(hello.max_message_bytes)
        if not link.dialed:  # accepted with the listener's size: fit this path's MTU too
            path_mtu_bytes = peer_cfg.path(hello.path).max_datagram_size
            link.datagram_bytes = min(link.datagram_bytes, path_mtu_bytes - DATAGRAM_OVERHEAD_BYTES)
        state.links[hello.path] = link
        log.info(
            "%s/%s up: %s -> %s (%s)",
            link.peer,
            hello.path,
            link.local_address,
            link.remote_address,
            "dialed" if link.dialed else "accepted",
        )
        self._touch(state)
        return state.session

    def link_closed(self, link: PathLink, reason: str) -> None:
        if link.peer is None or link.peer not in self.peers or link.path is None:
            return
        state = self.peers[link.peer]
        if state.links.get(link.path) is link:
            del state.links[link.path]
            state.session.path_down(link.path, time.monotonic(), reason)
            log.info("%s/%s down: %s", link.peer, link.path, reason)
            self._touch(state)

    def session_touched(self, session: PeerSession) -> None:
        self._touch(self.peers[session.peer])

    def datagram_handled(self, session: PeerSession) -> None:
        # deliver what completed, re-arm the timer; this link transmits right after
        self._touch(self.peers[session.peer], pump=False)

    # ------------------------------------------------------- session driving

    def _touch(self, state: PeerState, pump: bool = True) -> None:
        self._drain_events(state)
        self._arm_timer(state)
        if pump and not state.pump_scheduled:
            state.pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump, state)

    def _pump(self, state: PeerState) -> None:
        state.pump_scheduled = False
        for link in list(state.links.values()):
            link.transmit()

    def _arm_timer(self, state: PeerState) -> None:
        deadline = state.session.get_timer()
        if deadline == state.timer_at:
            return
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        state.timer_at = deadline
        if deadline is not None:
            delay_s = max(0.0, deadline - time.monotonic())
            state.timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer, state)

    def _on_timer(self, state: PeerState) -> None:
        state.timer = None
        state.timer_at = None
        state.session.handle_timer(time.monotonic())
        self._touch(state)

    def _drain_events(self, state: PeerState) -> None:
        session = state.session
        while (event := session.next_event()) is not None:
            if isinstance(event, MessageReceived):
                self._deliver(session.peer, event)
            elif isinstance(event, MessageDelivered):
                self.metrics.message_delivered(session.peer, event.critical, event.elapsed_s)
                state.backlog_freed.set()
            elif isinstance(event, MessageFailed):
                log.warning("message %d to %s failed: %s", event.msg_id, session.peer, event.reason)
                state.failures = [*state.failures[-9:], event.reason]
                self.metrics.message_failed(session.peer)
                state.backlog_freed.set()
            elif isinstance(event, MessageDropped):
                log.warning(
                    "dropped message %d from %s: %s", event.msg_id, session.peer, event.reason
                )
            elif isinstance(event, PathStateChanged):
                log.warning(
                    "path %s/%s %s: %s", session.peer, event.path, event.state, event.reason
                )
            elif isinstance(event, RouteChanged):
                log.warning(
                    "critical route to %s: %s -> %s (%s)",
                    session.peer,
                    event.previous or "none",
                    event.current or "none",
                    event.reason,
                )

    def _deliver(self, source: str, event: MessageReceived) -> None:
        header = event.header
        delivery = Delivery(
            source=source,
            tag=header.tag,
            step=header.step,
            critical=header.critical,
            meta=header.meta,
            payload=event.payload,
            checksum=header.checksum,
        )
        if not self.inbox.try_deliver(delivery):
            self._spawn(self.inbox.deliver(delivery))

    # ------------------------------------------------------ GatewayService

    def submit_now(self, submission: Submission) -> int | None:
        arrived_at = time.monotonic()
        if submission.peer == self.site_name:
            if not self.inbox.try_deliver(local_delivery(self.site_name, submission)):
                return None
            self.local_messages += 1
            return 0
        state = self._peer_for(submission)
        if self._backlogged(state, submission):
            return None
        return self._submit(state, submission, arrived_at)

    async def submit(self, submission: Submission) -> int:
        arrived_at = time.monotonic()  # a deadline counts from here, backpressure included
        if submission.peer == self.site_name:
            await self.inbox.deliver(local_delivery(self.site_name, submission))
            self.local_messages += 1
            return 0
        state = self._peer_for(submission)
        while self._backlogged(state, submission):
            state.backlog_freed.clear()
            await state.backlog_freed.wait()
        return self._submit(state, submission, arrived_at)

    def _peer_for(self, submission: Submission) -> PeerState:
        state = self.peers.get(submission.peer)
        if state is None:
            known = ", ".join(sorted(self.peers)) or "none"
            raise GatewayError(
                f"unknown peer {submission.peer!r}: this gateway ({self.site_name}) knows "
                f"{known}; check [[peers]] in {self.config.path}",
                code="unknown_peer",
            )
        return state

    def _backlogged(self, state: PeerState, submission: Submission) -> bool:
        """At most one inbox window of unsent bytes waits per peer."""
        pending = state.session.pending_bytes()
        size = len(memoryview(submission.payload).cast("B"))
        return pending > 0 and pending + size > self.config.limits.peer_inbox_bytes

    def _submit(self, state: PeerState, submission: Submission, arrived_at: float) -> int:
        header = MessageHeader(
            submission.tag,
            submission.step,
            submission.critical,
            submission.checksum,
            submission.meta,
        )
        deadline_s = submission.deadline_s
        try:
            msg_id = state.session.submit(
                header,
                submission.payload,
                time.monotonic(),
                deadline_at=None if deadline_s is None else arrived_at + deadline_s,
            )
        except LocalProtocolError as exc:
            raise GatewayError(str(exc), code="too_large") from exc
        if submission.critical:
            # leaves now: on a busy loop, the next turn can be milliseconds away
            self._touch(state, pump=False)
            self._pump(state)
        else:
            self._touch(state)
        return msg_id

    async def receive(
        self, tag: str, source: str | None, step: int | None, timeout_s: float | None
    ) -> Delivery:
        delivery = await self.inbox.receive(tag, source, step, timeout_s)
        state = self.peers.get(delivery.source)
        if state is not None:
            # the payload is a view into the message body the session counted
            payload = memoryview(delivery.payload)
            state.session.consumed(memoryview(payload.obj).nbytes)
            self._touch(state)
        return delivery

    def paths(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        rows: list[dict[str, Any]] = []
        for peer in self.config.peers:
            state = self.peers[peer.name]
            for path in peer.paths:
                link = state.links.get(path.name)
                row: dict[str, Any] = {
                    "peer": peer.name,
                    "path": path.name,
                    "local": link.local_address if link else (path.local or "*"),
                    "remote": link.remote_address if link else _fmt_remote(path),
                    "state": "down",
                    "state_reason": "not connected",
                    "srtt_ms": None,
                    "min_rtt_ms": None,
                    "jitter_ms": None,
                    "loss": None,
                    "loss_samples": 0,
                    "rate_mbps": None,
                    "sent_bytes": 0,
                    "recv_bytes": 0,
                    "role": "bulk",
                }
                if path.name in state.session.path_names:
                    snap = state.session.path_snapshot(path.name, now)
                    row.update({k: snap[k] for k in snap if k != "usable"})
                    if link is None:
                        row["state"] = "down"
                        row["state_reason"] = "not connected"
                rows.append(row)
        return rows

    def status(self) -> dict[str, Any]:
        peers: dict[str, Any] = {}
        for name, state in self.peers.items():
            peers[name] = {
                "paths_up": sorted(state.links),
                **state.session.status(),
                "recent_failures": list(state.failures),
            }
        return {
            "site": self.site_name,
            "version": __version__,
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "peers": peers,
            "local_messages": self.local_messages,
            "inbox": {
                "queued": self.inbox.mailbox.queued_count(),
                "waiting_recvs": self.inbox.mailbox.waiter_count(),
            },
        }

    def reset_path(self, peer: str, path: str) -> None:
        state = self.peers.get(peer)
        if state is None or path not in {p.name for p in self.config.peer(peer).paths}:
            raise GatewayError(
                f"no path {path!r} to peer {peer!r} in {self.config.path}", code="unknown_path"
            )
        link = state.links.get(path)
        if link is None:
            raise GatewayError(f"path {peer}/{path} is not connected", code="path_down")
        log.warning("%s/%s: connection reset by operator", peer, path)
        link.refuse(ERROR_RESET, "reset by operator")

    def client_settings(self) -> dict[str, Any]:
        compression = self.config.compression
        return {
            "compression": {
                "default": compression.default,
                "tags": [list(t) for t in compression.tags],
                "min_lossy_bytes": compression.min_lossy_bytes,
            },
            "max_message_bytes": self.max_message_bytes,
            "collective": self.config.collective_settings(),
        }


def _fmt(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _fmt_remote(path: PathConfig) -> str:
    return _fmt(*path.remote) if path.remote else "(peer dials)"


async def run_gateway(config: Config, *, ready: Any = None) -> None:
    """Run until cancelled (SIGTERM/SIGINT handling lives in the CLI)."""
    gateway = Gateway(config)
    await gateway.start()
    if ready is not None:
        ready(gateway)
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await gateway.close()


def enlarge_socket_buffers(sock: socket.socket | None) -> None:
    """Room for bursts: the kernel's default UDP buffers drop packets at high rates.

    As root, SO_*BUFFORCE goes past net.core.[rw]mem_max; otherwise we get what the
    limit allows.
    """
    if sock is None:
        return
    for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):  # SO_*BUFFORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER_BYTES)
        except OSError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER_BYTES)


def sd_notify(message: str) -> None:
    """Tell systemd about our state (Type=notify); a no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
        sock.sendto(message.encode(), address)
