"""The gateway daemon: listeners, dialers, one driver per peer, the local API.

``Gateway`` accepts and dials path connections (``PathLink``), authenticates them and
hands each to its peer's ``PeerDriver`` (wangate.net.peer_driver), which drives that
peer's pure ``PeerSession``. It implements ``GatewayService`` for the local API: a
trainer's message goes server -> ``Gateway.submit`` -> ``PeerDriver.submit`` ->
session -> ``PeerDriver.pump`` -> link. See wangate/net/README.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import math
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

from aioquic.quic.connection import QuicConnection

from wangate import __version__
from wangate.config import Config, PathConfig, PeerConfig
from wangate.core.frames import Hello
from wangate.core.governor import BulkGovernor
from wangate.core.liveness import PEER_QUIET_S
from wangate.core.message import MAX_HEADER_BYTES, MessageHeader
from wangate.core.outbound import CodingPolicy
from wangate.core.session import PeerSession
from wangate.errors import (
    DeadlineExceeded,
    GatewayError,
    LinkError,
    PeerUnreachable,
    RecvTimeout,
)
from wangate.errors import MessageFailed as MessageFailedError
from wangate.localapi.inbox import Inbox
from wangate.localapi.segments import InboundSegments
from wangate.localapi.server import LocalApiServer
from wangate.localapi.streams import InboundStreams, IncomingStream
from wangate.metrics import GatewayCollector, GatewayMetrics
from wangate.metrics import render as render_metrics
from wangate.metrics_http import MetricsServer
from wangate.net.address import host_port
from wangate.net.aioquic_compat import AioquicIncompatible, check_aioquic, client_connection
from wangate.net.link import CLIENT_CID_BYTES, LocalSite, PathLink
from wangate.net.listener import PeerListener, listen_for_peers
from wangate.net.peer_driver import MAX_OUTCOMES, PeerDriver
from wangate.net.sockbuf import enlarge_socket_buffers
from wangate.net.tls import (
    authenticate_peer,
    client_quic_configuration,
    require_client_certificate,
    server_quic_configuration,
)
from wangate.reload import ReloadPlan
from wangate.rows import GatewayStatus, PathRow, PeerStatus
from wangate.service import Delivery, Submission, local_delivery
from wangate.systemd import inherited_unix_listener
from wangate.workers.stripes import refuse_stripes

log = logging.getLogger("wangate.daemon")

DIAL_TIMEOUT_S = 5.0
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0


class Gateway:
    """One site's gateway; implements ``GatewayService`` for the local API."""

    def __init__(
        self, config: Config, inbox: Inbox | None = None, *, carries_stripes: bool = False
    ) -> None:
        self.config = config
        # a worker's sessions carry stripes; any other gateway refuses them (its
        # trainers would get a part of a message: the peer runs workers, this one not)
        self.carries_stripes = carries_stripes
        self.site_name = config.site.name
        self.instance_id = random.getrandbits(63) | 1
        self.max_message_bytes = config.limits.max_message_bytes  # of a payload
        # the limit on a message body says so in the hello: a payload at the limit, plus
        # the largest header, must pass
        self.site = LocalSite(
            self.site_name, self.instance_id, self.max_message_bytes + MAX_HEADER_BYTES
        )
        self.started_at = time.monotonic()
        # a worker process forwards its deliveries to the coordinator (wangate.workers)
        self.inbox = inbox or Inbox(config.limits.peer_inbox_bytes)
        # told each stripe's outcome in a worker: (peer, msg_id, None or why it failed),
        # and when the peer has it whole: (peer, msg_id)
        self.on_outcome: Callable[[str, int, str | None], None] | None = None
        self.on_acked: Callable[[str, int], None] | None = None
        self.inbound_segments = InboundSegments()  # large inbound bodies: shared memory
        self.streams = InboundStreams(self.inbound_segments)  # taken while they arrive
        self.metrics = GatewayMetrics()  # fed by submit() and the drivers' events
        now = time.monotonic()
        self.peers: dict[str, PeerDriver] = {
            peer.name: self._new_driver(peer.name, now) for peer in config.peers
        }
        self._dial_tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._servers: list[PeerListener] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._local_api: LocalApiServer | None = None
        self._closing = False
        self._accept_datagram_bytes = min(
            (p.max_datagram_size for peer in config.peers for p in peer.paths), default=1452
        )
        self.local_messages = 0
        self._metrics_server: MetricsServer | None = None

    def _new_driver(self, peer: str, now: float) -> PeerDriver:
        config = self.config
        target_ms = config.critical.host_delay_target_ms
        host_delay_target_s = target_ms / 1000 if target_ms else math.inf
        driver = PeerDriver(
            PeerSession(
                self.site_name,
                peer,
                max_message_bytes=self.site.max_message_bytes,
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
                peer_dead_s=config.limits.peer_dead_s,
                configured_paths=len(config.peer(peer).paths),
                screen=None if self.carries_stripes else refuse_stripes,
            ),
            inbox=self.inbox,
            metrics=self.metrics,
            clock=time.monotonic,
            on_unreachable=lambda: self.inbox.fail_waiters(self._hopeless_recv),
            on_outcome=lambda msg_id, failure: self._outcome(peer, msg_id, failure),
            on_acked=lambda msg_id: self.on_acked and self.on_acked(peer, msg_id),
            streams=self.streams,
        )
        segments = self.inbound_segments
        driver.session.use_body_buffers(segments.allocate, segments.free, segments.min_bytes)
        return driver

    def _outcome(self, peer: str, msg_id: int, failure: str | None) -> None:
        if self.on_outcome is not None:
            self.on_outcome(peer, msg_id, failure)

    # ----------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self.start_peering()
        await self.start_local()

    async def start_peering(self) -> None:
        """Listen for peers and dial them (a worker process does only this)."""
        try:
            check_aioquic()
        except AioquicIncompatible as exc:
            raise GatewayError(str(exc), code="startup") from None
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
                self._start_dialing(peer.name, path)

    async def start_local(self) -> None:
        """The local API for trainers, and the metrics endpoint."""
        self._local_api = LocalApiServer(
            self,
            self.config.site.socket,
            max_message_bytes=self.max_message_bytes,
            client_budget_bytes=self.config.limits.client_budget_bytes,
            socket_mode=self.config.site.socket_mode,
            listener=inherited_unix_listener(self.config.site.socket),
            allow_uids=self.config.site.allow_uids,
            allow_gids=self.config.site.allow_gids,
            max_connections=self.config.limits.max_local_connections,
        )
        try:
            await self._local_api.start()
        except GatewayError as exc:
            raise self._startup_error("site.socket", str(exc)) from None
        log.info("site %s: trainers connect at %s", self.site_name, self.config.site.socket)
        if self.config.metrics.listen is not None:
            collector = GatewayCollector(self.metrics, self._rows_and_status)
            self._metrics_server = MetricsServer(lambda: render_metrics(collector))
            try:
                await self._metrics_server.start(*self.config.metrics.listen)
            except GatewayError as exc:
                cause = exc.__cause__
                if not isinstance(cause, OSError):
                    raise self._startup_error("metrics.listen", str(exc)) from None
                where = host_port(*self.config.metrics.listen)
                raise self._startup_error(
                    "metrics.listen", f"cannot listen on {where}", cause
                ) from None

    def _startup_error(self, key: str, what: str, exc: OSError | None = None) -> GatewayError:
        reason = ""
        if exc is not None:
            # uvloop words it differently and keeps the errno on the cause
            cause = exc.__cause__ if exc.errno is None else exc
            errno = cause.errno if isinstance(cause, OSError) else None
            reason = f": {os.strerror(errno) if errno else exc}"
        return GatewayError(f"{self.config.path}: {key}: {what}{reason}", code="startup")

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for driver in self.peers.values():
            driver.close(LinkError.SHUTDOWN, "gateway shutting down")
        for server in self._servers:
            server.close()
        if self._local_api is not None:
            await self._local_api.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()
        await asyncio.sleep(0)  # let the close frames go out

    # -------------------------------------------------------------- reload

    def apply_reload(self, plan: ReloadPlan) -> None:
        """Switch to ``plan.effective``: peers and paths come and go without a restart."""
        self.config = plan.effective  # first: accepted links are checked against it
        for peer, path_name in plan.paths_removed:
            self.remove_path(peer, path_name)
        for name in plan.peers_removed:
            self.remove_peer(name)
        for peer_cfg in plan.peers_added:
            self.add_peer(peer_cfg)
        for peer, path in plan.paths_added:
            self.add_path(peer, path)

    def add_peer(self, peer: PeerConfig) -> None:
        self.peers[peer.name] = self._new_driver(peer.name, time.monotonic())
        for path in peer.paths:
            self._start_dialing(peer.name, path)

    def remove_peer(self, name: str) -> None:
        state = self.peers.pop(name, None)
        if state is None:
            return
        for key in [key for key in self._dial_tasks if key[0] == name]:
            self._dial_tasks.pop(key).cancel()
        waiting = state.session.status()["messages_in_flight"]
        state.close(LinkError.SHUTDOWN, "peer removed from the configuration")
        if waiting:
            log.warning("peer %s removed: %d messages to it are given up", name, waiting)

    def add_path(self, peer: str, path: PathConfig) -> None:
        self._count_paths(peer)
        self._start_dialing(peer, path)

    def remove_path(self, peer: str, path_name: str) -> None:
        task = self._dial_tasks.pop((peer, path_name), None)
        if task is not None:
            task.cancel()
        state = self.peers.get(peer)
        link = state.links.get(path_name) if state is not None else None
        if link is not None:
            link.refuse(LinkError.SHUTDOWN, "path removed from the configuration")
        self._count_paths(peer)

    def _count_paths(self, peer: str) -> None:
        state = self.peers.get(peer)
        configured = [p for p in self.config.peers if p.name == peer]
        if state is not None and configured:  # "up" only with every configured path up
            state.session.configured_paths = len(configured[0].paths)

    def status_counts(self) -> tuple[int, int, int, int, int]:
        """Peers up, peers, paths up, paths, messages in flight (for ``STATUS=``)."""
        paths = sum(len(peer.paths) for peer in self.config.peers)
        paths_up = sum(len(state.links) for state in self.peers.values())
        peers_up = sum(1 for state in self.peers.values() if state.links)
        in_flight = sum(
            state.session.status()["messages_in_flight"] for state in self.peers.values()
        )
        return peers_up, len(self.peers), paths_up, paths, in_flight

    # ------------------------------------------------------------- dialing

    def _start_dialing(self, peer: str, path: PathConfig) -> None:
        if path.remote is None:
            return  # the peer dials this path
        task = asyncio.ensure_future(self._dial_loop(peer, path))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._dial_tasks[(peer, path.name)] = task

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
        link = await self._open_link(peer, path)
        try:
            await link.wait_handshake(DIAL_TIMEOUT_S)
        except BaseException:
            link.close()
            raise
        return link

    async def _open_link(self, peer: str, path: PathConfig) -> PathLink:
        """A connection on ``path`` with its handshake started (not awaited)."""
        assert path.remote is not None
        loop = asyncio.get_running_loop()
        remote_host, remote_port = path.remote
        family = ipaddress.ip_address(remote_host).version
        local_host = path.local or ("::" if family == 6 else "0.0.0.0")
        configuration = client_quic_configuration(
            self.config, peer, max_datagram_size=path.max_datagram_size
        )
        _, link = await loop.create_datagram_endpoint(
            lambda: self._new_link(
                client_connection(configuration, CLIENT_CID_BYTES),
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
            link._quic,
            ca_path=self.config.tls.ca,
            allowed_sites=self.peers.keys(),
            expected_site=link.peer if link.dialed else None,
        )

    def _attach(self, link: PathLink, hello: Hello) -> PeerDriver | None:
        """The driver of the peer ``link`` is a path to, if the path is configured and
        the driver takes it."""
        assert link.peer is not None
        driver = self.peers.get(link.peer)
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

    # ------------------------------------------------------ GatewayService

    def submit_now(self, submission: Submission) -> int | None:
        arrived_at = time.monotonic()
        if submission.peer == self.site_name:
            delivery = self._local_delivery(submission)
            if not self.inbox.try_deliver(delivery):
                self._forget(delivery)
                return None
            self.local_messages += 1
            return 0
        state = self._peer_for(submission)
        state.check_reachable()
        if self._backlogged(state, submission):
            return None
        return self._submit(state, submission, arrived_at)

    async def submit(self, submission: Submission) -> int:
        arrived_at = time.monotonic()  # a deadline counts from here, backpressure included
        if submission.peer == self.site_name:
            delivery = self._local_delivery(submission)
            try:
                await self.inbox.deliver(delivery)
            except BaseException:  # the client went away while the inbox was full
                self._forget(delivery)
                raise
            self.local_messages += 1
            return 0
        state = self._peer_for(submission)
        deadline_s = submission.deadline_s
        deadline_at = None if deadline_s is None else arrived_at + deadline_s
        while True:
            state.check_reachable()  # never wait for room behind a dead peer
            if not self._backlogged(state, submission):
                break
            state.backlog_freed.clear()
            remaining_s = None if deadline_at is None else deadline_at - time.monotonic()
            try:
                if remaining_s is not None and remaining_s <= 0:
                    raise TimeoutError
                await asyncio.wait_for(state.backlog_freed.wait(), remaining_s)
            except TimeoutError:
                raise DeadlineExceeded(
                    f"send {submission.tag!r} (step {submission.step}) to {submission.peer}: "
                    f"deadline of {deadline_s:g} s passed while waiting for room "
                    f"({state.session.pending_bytes()} bytes already queued for it); "
                    "nothing was sent"
                ) from None
            if self.peers.get(submission.peer) is not state:
                raise GatewayError(f"peer {submission.peer!r} was removed", code="unknown_peer")
        return self._submit(state, submission, arrived_at)

    def _local_delivery(self, submission: Submission) -> Delivery:
        """Within the site, a payload from a segment is copied into a segment of the
        gateway's own (shared memory the receiving trainer maps): no private copy."""
        segments = self.inbound_segments
        return local_delivery(self.site_name, submission, segments.allocate, segments.free)

    def _forget(self, delivery: Delivery) -> None:
        payload = delivery.payload
        if isinstance(payload, memoryview):
            self.inbound_segments.free(payload)

    def _peer_for(self, submission: Submission) -> PeerDriver:
        state = self.peers.get(submission.peer)
        if state is None:
            known = ", ".join(sorted(self.peers)) or "none"
            raise GatewayError(
                f"unknown peer {submission.peer!r}: this gateway ({self.site_name}) knows "
                f"{known}; check [[peers]] in {self.config.path}",
                code="unknown_peer",
            )
        return state

    def _backlogged(self, state: PeerDriver, submission: Submission) -> bool:
        """At most one inbox window of unsent bytes waits per peer; nothing more waits
        behind a peer gone quiet (until it is heard again or declared unreachable)."""
        session = state.session
        pending = session.pending_bytes()
        if pending == 0:
            return False
        if session.silent_s(time.monotonic()) > PEER_QUIET_S:
            return True
        size = len(memoryview(submission.payload).cast("B"))
        return pending + size > self.config.limits.peer_inbox_bytes

    def _submit(self, state: PeerDriver, submission: Submission, arrived_at: float) -> int:
        header = MessageHeader(
            submission.tag,
            submission.step,
            submission.critical,
            submission.checksum,
            submission.meta,
        )
        deadline_s = submission.deadline_s
        return state.submit(
            header,
            submission.payload,
            deadline_at=None if deadline_s is None else arrived_at + deadline_s,
        )

    async def receive(
        self, tag: str, source: str | None, step: int | None, timeout_s: float | None
    ) -> Delivery:
        delivery = await self.inbox.receive(tag, source, step, timeout_s, self._hopeless_recv)
        return self._taken(delivery)

    async def receive_stream(
        self, tag: str, source: str | None, step: int | None, timeout_s: float | None
    ) -> Delivery | IncomingStream:
        """``receive``, or sooner: a large message whose header is in, still arriving
        (proto/localapi.md, "Streamed delivery"). A whole one waiting comes first."""
        delivery = self.inbox.take(tag, source, step)
        if delivery is not None:
            return self._taken(delivery)
        stream = self.streams.take(tag, source, step)
        if stream is not None:
            return stream
        whole = asyncio.ensure_future(self.receive(tag, source, step, None))
        early = self.streams.wait(tag, source, step)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wait((whole, early), return_when=asyncio.FIRST_COMPLETED)
        except BaseException as exc:
            self.streams.cancel_wait(early)
            whole.cancel()  # the inbox puts back what it handed over just now
            await asyncio.gather(whole, return_exceptions=True)
            got = whole.result() if whole.done() and not whole.cancelled() else None
            if isinstance(exc, TimeoutError):
                if got is not None:  # it came as the time ran out
                    return got
                what = f"{tag!r}" + (f" from {source!r}" if source else "")
                what += f" at step {step}" if step is not None else ""
                raise RecvTimeout(
                    f"no message {what} arrived within {timeout_s:g} s", code="timeout"
                ) from None
            if got is not None and got.segment_fd is not None:
                os.close(got.segment_fd)  # nobody will take it now
            raise
        if whole.done():
            self.streams.cancel_wait(early)  # a stream it got too is offered again
            return whole.result()
        whole.cancel()
        await asyncio.gather(whole, return_exceptions=True)
        return early.result()

    def _taken(self, delivery: Delivery) -> Delivery:
        state = self.peers.get(delivery.source)
        if state is not None:
            state.consumed(delivery.body_bytes, delivery.msg_id)
        return self._with_segment(delivery)

    def _with_segment(self, delivery: Delivery) -> Delivery:
        """A delivery assembled in a segment carries its sealed descriptor from here."""
        fd = self.inbound_segments.claim(memoryview(delivery.payload))
        return delivery if fd is None else dataclasses.replace(delivery, segment_fd=fd)

    def _hopeless_recv(self, tag: str, source: str | None) -> PeerUnreachable | None:
        """Why a recv can never be satisfied, or None (proto/delivery.md, "Receives").

        With a source: that peer is unreachable. Without: every source that has sent
        this tag here is an unreachable peer (every peer, if none has sent it yet).
        """
        now = time.monotonic()
        if source is not None:
            state = self.peers.get(source)
            if state is None or not state.session.unreachable:
                return None
            return PeerUnreachable(
                f"recv {tag!r} from {source}: peer {source} is unreachable "
                f"(silent for {state.session.silent_s(now):.1f} s)"
            )
        sources = self.inbox.mailbox.sources_of(tag) or frozenset(self.peers)
        states = [self.peers.get(name) for name in sorted(sources)]
        if not states or any(st is None or not st.session.unreachable for st in states):
            return None
        silent = ", ".join(
            f"{st.session.peer} silent for {st.session.silent_s(now):.1f} s"
            for st in states
            if st is not None
        )
        return PeerUnreachable(
            f"recv {tag!r}: every peer that could send it is unreachable ({silent})"
        )

    async def wait_message(self, peer: str, msg_id: int, timeout_s: float | None) -> None:
        if peer == self.site_name and msg_id == 0:
            return  # within the site: delivered into the inbox at once
        state = self.peers.get(peer)
        if state is None:
            raise GatewayError(f"unknown peer {peer!r}", code="unknown_peer")
        session = state.session
        deadline_at = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if msg_id in state.outcomes:
                failure = state.outcomes[msg_id]
                if failure is None:
                    return
                raise MessageFailedError(failure)
            if session.message_state(msg_id) is None:
                if not 0 < msg_id <= session.last_msg_id:
                    raise GatewayError(
                        f"no message {msg_id} was sent to {peer}", code="unknown_message"
                    )
                raise GatewayError(
                    f"the outcome of message {msg_id} to {peer} is no longer known "
                    f"(the last {MAX_OUTCOMES} are kept)",
                    code="unknown_message",
                )
            state.check_reachable()
            state.outcome_changed.clear()
            remaining_s = None if deadline_at is None else deadline_at - time.monotonic()
            try:
                if remaining_s is not None and remaining_s <= 0:
                    raise TimeoutError
                await asyncio.wait_for(state.outcome_changed.wait(), remaining_s)
            except TimeoutError:
                raise RecvTimeout(
                    f"message {msg_id} to {peer} is still {session.message_state(msg_id)} "
                    f"after {timeout_s:g} s",
                    code="timeout",
                ) from None

    def paths(self) -> list[PathRow]:
        now = time.monotonic()
        rows: list[PathRow] = []
        for peer in self.config.peers:
            state = self.peers[peer.name]
            session = state.session
            peer_state = session.peer_state(now)[0]  # one per peer, not per path
            for path in peer.paths:
                link = state.links.get(path.name)
                row: dict[str, Any] = {
                    "peer": peer.name,
                    "path": path.name,
                    "local": link.local_address if link else (path.local or "*"),
                    "remote": link.remote_address if link else _fmt_remote(path),
                }
                if path.name in session.path_names:
                    row.update(session.path_snapshot(path.name, now))
                    if link is None:
                        row.update(state="down", state_reason="not connected")
                    rows.append(PathRow.from_dict({**row, "peer_state": peer_state}))
                else:
                    rows.append(PathRow.not_connected(**row, peer_state=peer_state))
            state.drain_events()
        return rows

    def _rows_and_status(self) -> tuple[list[PathRow], GatewayStatus]:
        rows = self.paths()  # a scrape reads both: build the rows once
        return rows, self.status(rows)

    def status(self, rows: list[PathRow] | None = None) -> GatewayStatus:
        now = time.monotonic()
        if rows is None:
            rows = self.paths()
        peers: dict[str, PeerStatus] = {}
        for name, state in self.peers.items():
            liveness = state.session.liveness(now)
            state.drain_events()
            peers[name] = PeerStatus.from_dict(
                {
                    **liveness,
                    "paths_up": sorted(
                        r.path for r in rows if r.peer == name and r.state != "down"
                    ),
                    **state.session.status(),
                    "recent_failures": list(state.failures),
                }
            )
        return GatewayStatus(
            site=self.site_name,
            version=__version__,
            uptime_s=round(time.monotonic() - self.started_at, 3),
            peers=peers,
            local_messages=self.local_messages,
            inbox_queued=self.inbox.mailbox.queued_count(),
            inbox_waiting_recvs=self.inbox.mailbox.waiter_count(),
        )

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
        link.refuse(LinkError.RESET, "reset by operator")

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
            "segments": {
                "min_bytes": self.inbound_segments.min_bytes,
                "pool_bytes": self.config.limits.client_budget_bytes,
            },
        }


def _fmt_remote(path: PathConfig) -> str:
    return host_port(*path.remote) if path.remote else "(peer dials)"
