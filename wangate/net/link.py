"""One QUIC connection carrying one WAN path to one peer gateway.

A link handshakes, authenticates the peer's site, exchanges the ``Hello`` and from
then on only moves bytes between aioquic and its :class:`~wangate.net.peer_driver.
PeerDriver`: what arrives (DATAGRAM frames, control frames) goes to the driver, and
whenever aioquic may send, the driver fills the link from the session (pull, not push).

A link's life is explicit (:class:`LinkState`), h11-style: every transition is in
``_TRANSITIONS`` and any other is a :class:`~wangate.errors.LocalProtocolError`::

    handshaking -> authenticated -> up -> closed
         \\______________\\__________________/
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection

from wangate.core.frames import ControlStreamDecoder, Hello, encode_control
from wangate.errors import LinkError, LocalProtocolError, RemoteProtocolError, WangateError
from wangate.net import aioquic_compat as compat
from wangate.net.address import host_port
from wangate.net.pacing import install_burstable_pacer

if TYPE_CHECKING:
    from wangate.net.peer_driver import PeerDriver

log = logging.getLogger("wangate.link")

CONTROL_STREAM_ID = 0  # the dialer's first bidirectional stream (RFC 9000 §2.1)
# Connection IDs (RFC 9000 §5.1): a server's tell apart the connections sharing its
# listener's port, and 4 random bytes do for a few hundred of them; a client has a
# socket of its own for each connection and issues zero-length IDs, so packets to a
# client carry no ID at all.
SERVER_CID_BYTES = 4
CLIENT_CID_BYTES = 0
# What QUIC adds to a full DATAGRAM frame's data in a 1-RTT packet: the short header (1
# byte, the peer's connection ID, aioquic's 2-byte packet number; RFC 9000 §17.3), the
# AEAD tag (16, RFC 9001 §5.3) and the frame's type (RFC 9221 §4: a frame that fills its
# packet goes without its length, `aioquic_compat.datagram_frames_without_length`).
# A datagram that does not fit an empty packet would block the queue for good.
QUIC_PACKET_OVERHEAD_BYTES = 1 + 2 + 16 + 1  # plus the peer's connection ID
# Room for an ACK frame of one range beside a full datagram (type 1, largest
# acknowledged 4, delay 2, range count 1, first range 1; RFC 9000 §19.3): without it
# (datagrams filling the packet exactly) each ACK took a packet of its own, about 3400
# more packets per 128 MiB on a 1500-byte path, each taking a pacing slot. Without an
# ACK the frame takes 2 of the 10 bytes for its length.
ACK_ROOM_BYTES = 10


def datagram_overhead_bytes(peer_cid_bytes: int) -> int:
    """What a packet adds to the largest datagram a link sends (its ACK room included)."""
    return QUIC_PACKET_OVERHEAD_BYTES + peer_cid_bytes + ACK_ROOM_BYTES


MAX_PROTOCOL_ERRORS = 100  # malformed datagrams tolerated before the peer is cut off


class LinkState(enum.Enum):
    HANDSHAKING = "handshaking"
    AUTHENTICATED = "authenticated"  # the peer's certificate names a configured site
    UP = "up"  # hellos exchanged; attached to the peer's driver
    CLOSED = "closed"


_TRANSITIONS: dict[LinkState, frozenset[LinkState]] = {
    LinkState.HANDSHAKING: frozenset({LinkState.AUTHENTICATED, LinkState.CLOSED}),
    LinkState.AUTHENTICATED: frozenset({LinkState.UP, LinkState.CLOSED}),
    LinkState.UP: frozenset({LinkState.CLOSED}),
    LinkState.CLOSED: frozenset(),
}


@dataclass(frozen=True)
class LocalSite:
    """What a link says of its own site in its ``Hello``."""

    name: str
    instance_id: int
    max_message_bytes: int


Authenticate = Callable[["PathLink"], str]  # the peer's site name, or raises
Attach = Callable[["PathLink", Hello], "PeerDriver | None"]  # None: refused


class PathLink(QuicConnectionProtocol):
    def __init__(
        self,
        quic: QuicConnection,
        stream_handler: Callable[..., None] | None = None,
        *,
        site: LocalSite,
        authenticate: Authenticate,
        attach: Attach,
        dialed: bool,
        peer: str | None = None,
        path: str | None = None,
        datagram_bytes: int = 1200,
    ) -> None:
        super().__init__(quic, stream_handler)
        self.site = site
        self._authenticate = authenticate
        self._attach = attach
        self.dialed = dialed
        self.peer = peer  # known up front when we dial; from the certificate when we accept
        self.path = path
        self.max_datagram_size = datagram_bytes  # of the UDP payload; the packets' limit
        # the largest datagram this link sends, once the peer's connection ID is known
        self.datagram_bytes = datagram_bytes - datagram_overhead_bytes(compat.peer_cid_bytes(quic))
        self.state = LinkState.HANDSHAKING
        self.driver: PeerDriver | None = None  # set once up
        self.refused: str | None = None  # why we closed it, if we did
        self._decoder = ControlStreamDecoder()
        self._hello_sent = False
        self._protocol_errors = 0
        self.pacer = install_burstable_pacer(quic)
        self.pending = compat.datagrams_pending(quic)  # aioquic's DATAGRAM queue
        self.send_datagram = quic.send_datagram_frame  # per datagram: no wrapper call
        compat.datagram_frames_without_length(quic)
        self._after_receive: asyncio.Handle | None = None
        # Resolved by the handshake itself, whoever waits and whenever: aioquic's
        # wait_connected() only counts a handshake that completes while someone waits.
        self._handshake_done: asyncio.Future[None] = self._loop.create_future()

    def _move(self, to: LinkState) -> None:
        if to not in _TRANSITIONS[self.state]:
            raise LocalProtocolError(
                f"link {self.peer}/{self.path}: {self.state.value} -> {to.value} is not allowed"
            )
        self.state = to

    @property
    def authenticated(self) -> bool:
        """Authenticated and not closed (the listener's test for an established link)."""
        return self.state in (LinkState.AUTHENTICATED, LinkState.UP)

    @property
    def dialer_site(self) -> str:
        assert self.peer is not None
        return self.site.name if self.dialed else self.peer

    @property
    def remote_address(self) -> str:
        address = compat.peer_address(self._quic)
        return "?" if address is None else host_port(*address)

    @property
    def local_address(self) -> str:
        if self._transport is None:
            return "?"
        host, port = self._transport.get_extra_info("sockname")[:2]
        return host_port(str(host), int(port))

    async def wait_handshake(self, timeout_s: float) -> None:
        """Return once the handshake completed (even before this call); raise
        ``ConnectionError`` if the connection closed first, ``TimeoutError`` after
        ``timeout_s``."""
        await asyncio.wait_for(asyncio.shield(self._handshake_done), timeout_s)

    # ------------------------------------------------------------- receiving

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        # aioquic transmits after every datagram; one turn of the loop may read dozens,
        # and one answer after all of them costs one pass instead of one each.
        self._quic.receive_datagram(cast(bytes, data), addr, now=self._loop.time())
        compat.process_events(self)
        if self._after_receive is None:
            self._after_receive = self._loop.call_soon(self._answer_received)

    def _answer_received(self) -> None:
        self._after_receive = None
        if self.state is not LinkState.CLOSED:
            reason = compat.closed_by_peer(self._quic)
            if reason is not None:
                self._mark_closed(f"connection closed: {reason}")
        if self.driver is not None:
            self.driver.datagrams_handled()
        self.transmit()

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.DatagramFrameReceived):
            if self.state is LinkState.UP:  # nothing from an unauthenticated peer
                self._on_datagram(event.data)
        elif isinstance(event, events.StreamDataReceived):
            if self.state in (LinkState.AUTHENTICATED, LinkState.UP):
                self._on_stream_data(event)
        elif isinstance(event, events.HandshakeCompleted):
            if not self._handshake_done.done():
                self._handshake_done.set_result(None)
            self._on_handshake()
        elif isinstance(event, events.ConnectionTerminated):
            reason = event.reason_phrase or f"error 0x{event.error_code:x}"
            if not self._handshake_done.done():
                self._handshake_done.set_exception(ConnectionError(reason))
                self._handshake_done.exception()  # retrieved: nobody need be waiting
            self._mark_closed(f"connection closed: {reason}")

    def fit_datagrams(self, max_datagram_size: int) -> None:
        """Size datagrams for packets of at most ``max_datagram_size`` bytes (UDP payload)
        to the peer, with the connection ID it gave us."""
        self.max_datagram_size = min(self.max_datagram_size, max_datagram_size)
        overhead = datagram_overhead_bytes(compat.peer_cid_bytes(self._quic))
        self.datagram_bytes = self.max_datagram_size - overhead

    def _on_handshake(self) -> None:
        if self.state is not LinkState.HANDSHAKING:
            return
        self.fit_datagrams(self.max_datagram_size)  # the peer's connection ID is known now
        try:
            self.peer = self._authenticate(self)
        except WangateError as exc:  # an AuthenticationError, or our own misconfiguration
            self.refuse(LinkError.AUTHENTICATION_FAILED, f"site authentication failed: {exc}")
            return
        self._move(LinkState.AUTHENTICATED)
        if self.dialed:
            self._send_hello()

    def _send_hello(self) -> None:
        assert self.path is not None
        site = self.site
        hello = Hello(site.name, self.path, site.instance_id, site.max_message_bytes)
        self._quic.send_stream_data(CONTROL_STREAM_ID, encode_control(hello))
        self._hello_sent = True

    def _on_stream_data(self, event: events.StreamDataReceived) -> None:
        if event.stream_id != CONTROL_STREAM_ID:
            self.refuse(LinkError.PROTOCOL, f"unexpected stream {event.stream_id}")
            return
        try:
            frames = self._decoder.feed(event.data)
            if frames and self.state is LinkState.AUTHENTICATED:
                first = frames.pop(0)
                if not isinstance(first, Hello):
                    raise RemoteProtocolError("first control frame is not a hello")
                if not self._on_hello(first):
                    return
            if frames and self.driver is not None:
                self.driver.control_received(self, frames)
        except WangateError as exc:
            self.refuse(LinkError.PROTOCOL, f"control stream: {exc}")

    def _on_hello(self, hello: Hello) -> bool:
        if hello.site != self.peer:
            raise RemoteProtocolError(
                f"hello names site {hello.site!r} but the certificate is {self.peer!r}"
            )
        if self.dialed and hello.path != self.path:
            raise RemoteProtocolError(f"peer answered for path {hello.path!r}, not {self.path!r}")
        self.path = hello.path
        if not self._hello_sent:
            self._send_hello()
        driver = self._attach(self, hello)
        if driver is None or self.state is LinkState.CLOSED:
            return False
        self._move(LinkState.UP)
        self.driver = driver
        driver.link_up(self)
        return True

    def _on_datagram(self, data: bytes) -> None:
        assert self.driver is not None
        try:
            self.driver.datagram_received(self, data)
        except RemoteProtocolError as exc:
            self._protocol_errors += 1
            log.warning("%s/%s: dropped a datagram: %s", self.peer, self.path, exc)
            if self._protocol_errors >= MAX_PROTOCOL_ERRORS:
                self.refuse(LinkError.PROTOCOL, f"{self._protocol_errors} malformed datagrams")

    # --------------------------------------------------------------- closing

    def refuse(self, code: LinkError, reason: str) -> None:
        """Close the connection with ``code``, telling the peer why."""
        if self.refused is None:
            self.refused = reason
            # both sites dialing one path is expected (one connection is kept): not a warning
            level = logging.WARNING if code.unexpected else logging.INFO
            log.log(level, "closing connection with %s: %s", self.remote_address, reason)
        self.close(error_code=code.value, reason_phrase=reason[:200])
        self._mark_closed(reason)

    def _mark_closed(self, reason: str) -> None:
        if self.state is LinkState.CLOSED:
            return
        self._move(LinkState.CLOSED)
        if self.driver is not None:
            self.driver.link_down(self, reason)

    # ------------------------------------------------------------- sending

    def transmit(self) -> None:
        """aioquic may send: the driver fills this link from the session first."""
        if self.driver is None or self.state is not LinkState.UP:
            super().transmit()
        else:
            self.driver.fill(self)

    def flush(self) -> None:
        """Hand what is queued to aioquic's packet builder (within window and pacer)."""
        super().transmit()

    def transmit_soon(self) -> None:
        compat.transmit_soon(self)

    def send_control(self, data: bytes) -> None:
        self._quic.send_stream_data(CONTROL_STREAM_ID, data)
