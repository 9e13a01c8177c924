"""One QUIC connection carrying one WAN path to one peer gateway (the asyncio shell).

It only moves bytes: DATAGRAM frames and control-stream bytes go to the peer's
``PeerSession``, and whenever aioquic can send, the link pulls datagrams from it
(pull, not push: the session decides what goes where at transmit time, and aioquic's
own datagram queue stays a few entries long, so nothing waits behind a full window).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection

from wangate.core.frames import ControlStreamDecoder, Hello, encode_control
from wangate.errors import RemoteProtocolError, WangateError
from wangate.net.address import host_port
from wangate.net.pacing import install_burstable_pacer
from wangate.net.tls import AUTHENTICATION_FAILED_ERROR_CODE

if TYPE_CHECKING:
    from wangate.core.session import PeerSession

log = logging.getLogger("wangate.link")

CONTROL_STREAM_ID = 0  # the dialer's first bidirectional stream (RFC 9000 §2.1)
ERROR_PROTOCOL = 0x102
ERROR_DUPLICATE = 0x103
ERROR_SHUTDOWN = 0x104
ERROR_RESET = 0x105
DATAGRAM_OVERHEAD_BYTES = 40  # short header, packet number, AEAD tag, frame type+length
PENDING_LOW_WATER = 4  # datagrams queued inside aioquic before we stop adding
FILL_ROUNDS = 16  # pull rounds per transmit before yielding to the event loop
MAX_PROTOCOL_ERRORS = 100  # malformed datagrams tolerated before the peer is cut off


class LinkHost:
    """What a link needs from its gateway (implemented by ``wangate.daemon.Gateway``)."""

    site_name: str
    instance_id: int
    max_message_bytes: int

    def authenticate(self, link: PathLink) -> str:  # returns the peer's site name
        raise NotImplementedError

    def link_ready(self, link: PathLink, hello: Hello) -> PeerSession | None:
        raise NotImplementedError

    def link_closed(self, link: PathLink, reason: str) -> None:
        raise NotImplementedError

    def session_touched(self, session: PeerSession) -> None:
        raise NotImplementedError

    def datagram_handled(self, session: PeerSession) -> None:
        raise NotImplementedError


class PathLink(QuicConnectionProtocol):
    def __init__(
        self,
        quic: QuicConnection,
        stream_handler: Callable[..., None] | None = None,
        *,
        host: LinkHost,
        dialed: bool,
        peer: str | None = None,
        path: str | None = None,
        datagram_bytes: int = 1200,
    ) -> None:
        super().__init__(quic, stream_handler)
        self.host = host
        self.dialed = dialed
        self.peer = peer  # known up front when we dial; from the certificate when we accept
        self.path = path
        self.datagram_bytes = datagram_bytes - DATAGRAM_OVERHEAD_BYTES
        self.session: PeerSession | None = None
        self.authenticated = False
        self.refused: str | None = None
        self._decoder = ControlStreamDecoder()
        self._hello_sent = False
        self._protocol_errors = 0
        self._closed_reported = False
        self._pacer = install_burstable_pacer(quic._loss)
        self._after_receive: asyncio.Handle | None = None
        self._datagrams_handled = False
        # Resolved by the handshake itself, whoever waits and whenever: aioquic's
        # wait_connected() only counts a handshake that completes while someone waits.
        self._handshake_done: asyncio.Future[None] = self._loop.create_future()

    @property
    def dialer_site(self) -> str:
        assert self.peer is not None
        return self.host.site_name if self.dialed else self.peer

    @property
    def remote_address(self) -> str:
        paths = self._quic._network_paths
        if paths:
            host, port = paths[0].addr[:2]
            return host_port(str(host), port)
        return "?"

    @property
    def local_address(self) -> str:
        if self._transport is None:
            return "?"
        host, port = self._transport.get_extra_info("sockname")[:2]
        return host_port(str(host), port)

    # ------------------------------------------------------------- events

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        # aioquic transmits after every datagram; one turn of the loop may read dozens,
        # and one answer after all of them costs one pass instead of one each.
        self._quic.receive_datagram(cast(bytes, data), addr, now=self._loop.time())
        self._process_events()
        if self._after_receive is None:
            self._after_receive = self._loop.call_soon(self._answer_received)

    def _answer_received(self) -> None:
        self._after_receive = None
        if self._datagrams_handled and self.session is not None:
            self._datagrams_handled = False
            # deliver what completed, re-arm the timer; then acks and whatever else is due
            self.host.datagram_handled(self.session)
        self.transmit()

    async def wait_handshake(self, timeout_s: float) -> None:
        """Return once the handshake completed (even before this call); raise
        ``ConnectionError`` if the connection closed first, ``TimeoutError`` after
        ``timeout_s``."""
        await asyncio.wait_for(asyncio.shield(self._handshake_done), timeout_s)

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.HandshakeCompleted):
            if not self._handshake_done.done():
                self._handshake_done.set_result(None)
            self._on_handshake()
        elif isinstance(event, events.ConnectionTerminated):
            reason = event.reason_phrase or f"error 0x{event.error_code:x}"
            if not self._handshake_done.done():
                self._handshake_done.set_exception(ConnectionError(reason))
                self._handshake_done.exception()  # retrieved: nobody need be waiting
            self._report_closed(f"connection closed: {reason}")
        elif self.refused is not None or not self.authenticated:
            return  # nothing from an unauthenticated peer is ever looked at
        elif isinstance(event, events.StreamDataReceived):
            self._on_stream_data(event)
        elif isinstance(event, events.DatagramFrameReceived):
            self._on_datagram(event.data)

    def _on_handshake(self) -> None:
        try:
            self.peer = self.host.authenticate(self)
        except WangateError as exc:  # an AuthenticationError, or our own misconfiguration
            self.refuse(AUTHENTICATION_FAILED_ERROR_CODE, f"site authentication failed: {exc}")
            return
        self.authenticated = True
        if self.dialed:
            self._send_hello()

    def _send_hello(self) -> None:
        assert self.path is not None
        hello = Hello(
            self.host.site_name, self.path, self.host.instance_id, self.host.max_message_bytes
        )
        self._quic.send_stream_data(CONTROL_STREAM_ID, encode_control(hello))
        self._hello_sent = True

    def _on_stream_data(self, event: events.StreamDataReceived) -> None:
        if event.stream_id != CONTROL_STREAM_ID:
            self.refuse(ERROR_PROTOCOL, f"unexpected stream {event.stream_id}")
            return
        try:
            frames = self._decoder.feed(event.data)
            now = time.monotonic()
            for frame in frames:
                if self.session is None:
                    if not isinstance(frame, Hello):
                        raise RemoteProtocolError("first control frame is not a hello")
                    self._on_hello(frame)
                    if self.session is None:
                        return
                else:
                    self.session.handle_control(self.path or "", frame, now)
        except WangateError as exc:
            self.refuse(ERROR_PROTOCOL, f"control stream: {exc}")
            return
        if self.session is not None:
            self.host.session_touched(self.session)

    def _on_hello(self, hello: Hello) -> None:
        if hello.site != self.peer:
            raise RemoteProtocolError(
                f"hello names site {hello.site!r} but the certificate is {self.peer!r}"
            )
        if self.dialed and hello.path != self.path:
            raise RemoteProtocolError(f"peer answered for path {hello.path!r}, not {self.path!r}")
        self.path = hello.path
        if not self._hello_sent:
            self._send_hello()
        session = self.host.link_ready(self, hello)
        if session is None:
            return
        self.session = session
        session.path_up(self.path, datagram_bytes=self.datagram_bytes, now=time.monotonic())

    def _on_datagram(self, data: bytes) -> None:
        if self.session is None or self.path is None:
            return
        try:
            self.session.handle_datagram(self.path, data, time.monotonic())
            # a message may be complete, and an ack deadline may be new: without this
            # both would wait for whatever timer happened to be armed
            self._datagrams_handled = True
        except RemoteProtocolError as exc:
            self._protocol_errors += 1
            log.warning("%s/%s: dropped a datagram: %s", self.peer, self.path, exc)
            if self._protocol_errors >= MAX_PROTOCOL_ERRORS:
                self.refuse(ERROR_PROTOCOL, f"{self._protocol_errors} malformed datagrams")

    def refuse(self, code: int, reason: str) -> None:
        if self.refused is None:
            self.refused = reason
            # both sites dialing one path is expected (one connection is kept): not a warning
            level = logging.INFO if code in (ERROR_DUPLICATE, ERROR_SHUTDOWN) else logging.WARNING
            log.log(level, "closing connection with %s: %s", self.remote_address, reason)
        self.close(error_code=code, reason_phrase=reason[:200])
        self._report_closed(reason)

    def _report_closed(self, reason: str) -> None:
        if not self._closed_reported:
            self._closed_reported = True
            self.host.link_closed(self, reason)

    # ------------------------------------------------------------- sending

    def transmit(self) -> None:
        session, path = self.session, self.path
        if session is None or path is None or self._closed_reported:
            super().transmit()
            return
        quic = self._quic
        pending = quic._datagrams_pending  # aioquic 1.7.2: no public view of this queue
        for _ in range(FILL_ROUNDS):
            now = time.monotonic()
            control = session.control_to_send(path, now)
            if control:
                quic.send_stream_data(CONTROL_STREAM_ID, control)
            added = 0
            # unpaced while critical data waits: what is pulled now must not wait for it
            critical = session.has_critical_for(path)
            while len(pending) < PENDING_LOW_WATER:
                datagram = session.datagram_to_send(path, now)
                if datagram is None:
                    break
                quic.send_datagram_frame(datagram)
                added += 1
            self._pacer.burst = critical or session.has_critical_for(path)
            super().transmit()
            if added == 0 or pending:
                break  # nothing more to send, or aioquic's window/pacer is full
        else:
            self._transmit_soon()  # more to send: continue after other work had a turn
