"""One QUIC connection carrying one WAN path to one peer gateway.

A link handshakes, authenticates the peer's site, exchanges the ``Hello`` and from
then on only moves bytes between its :class:`~wangate.net.peer_driver.PeerDriver` and
the wire: datagrams through the path's data-plane channel (``wangate.engine``, keyed
from this handshake), control frames through aioquic's stream. What arrives goes to
the driver; whenever the channel may send, the driver fills it from the session (pull,
not push).

A link's life is explicit (:class:`LinkState`), h11-style: every transition is in
``_TRANSITIONS`` and any other is a :class:`~wangate.errors.LocalProtocolError`::

    handshaking -> authenticated -> up -> closed
         \\______________\\__________________/
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection

from wangate.core.frames import ControlStreamDecoder, Hello, encode_control
from wangate.engine import DATAGRAM_OVERHEAD_BYTES, READ_BATCH_BUFFERS, PathChannel, ReadDatagrams
from wangate.errors import LinkError, LocalProtocolError, RemoteProtocolError, WangateError
from wangate.net import aioquic_compat as compat
from wangate.net.address import host_port
from wangate.net.drain import MAX_DATAGRAMS_PER_TURN, DrainingTransport
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
# uvloop counts timer delays in whole milliseconds: a shorter one fires at once, before
# its deadline, and re-armed it would spin the loop until the deadline passes
MIN_TIMER_DELAY_S = 0.001


# The channel's own timer is mostly the pacer's: under uvloop a delay this short fires on
# the next turn, which polls the pacer as its bucket refills (the 1 ms rule above gave
# no better CPU per byte in three runs each, within this machine's spread).
MIN_CHANNEL_TIMER_S = 0.0002


def timer_delay_s(deadline: float, now: float) -> float:
    """The delay to arm for ``deadline``: now if due, else at least MIN_TIMER_DELAY_S."""
    delay_s = max(0.0, deadline - now)
    return MIN_TIMER_DELAY_S if 0.0 < delay_s < MIN_TIMER_DELAY_S else delay_s


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
        self.state = LinkState.HANDSHAKING
        self.driver: PeerDriver | None = None  # set once up
        self.refused: str | None = None  # why we closed it, if we did
        self._decoder = ControlStreamDecoder()
        self._hello_sent = False
        self._protocol_errors = 0
        install_burstable_pacer(quic)  # the control stream, paced by the model's rate
        # the path's data plane, from the handshake on: every datagram goes through it
        self.channel: PathChannel | None = None
        self._channel_timer: asyncio.TimerHandle | None = None
        self._channel_timer_at: float | None = None
        # aioquic's connection may have packets to send or a timer to re-arm: something
        # reached it (a packet of its own, control data, a close, its timer) since its
        # last transmit. Only then is it asked: a pass costs more than a batch of ours.
        self._quic_due = True
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
    def datagram_bytes(self) -> int:
        """The largest datagram this link sends (its channel's limit too)."""
        return self.max_datagram_size - DATAGRAM_OVERHEAD_BYTES

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
        # Only aioquic's packets come this way: the data plane's are read in batches
        # (``_read_batches``, or the listener's ``ListenerReader``). aioquic transmits
        # after every datagram; one answer after a turn's worth costs one pass.
        self._quic_received(cast(bytes, data), addr)
        if self._after_receive is None:
            self._after_receive = self._loop.call_soon(self._answer_received)

    def _quic_received(self, data: bytes, addr: Any) -> None:
        """Not the data plane's: the handshake, the control stream."""
        self._quic.receive_datagram(data, addr, now=self._loop.time())
        self._quic_due = True
        compat.process_events(self)

    def _read_batches(self) -> None:
        """A dialed link's own socket is readable: its data plane reads it down to empty
        (at most MAX_DATAGRAMS_PER_TURN packets), a batch per recvmmsg, each packet
        opened in C (a buffer the kernel coalesced, cut into its packets); what is not
        the data plane's goes to aioquic."""
        taken = 0
        while taken < MAX_DATAGRAMS_PER_TURN:
            channel = self.channel
            if channel is None:
                return
            try:
                datagrams, foreign, errors, buffers, packets = channel.read(time.monotonic())
            except OSError as exc:  # an ICMP error reported on the socket
                self.error_received(exc)
                break
            taken += packets  # a coalesced buffer holds dozens, forged ones too
            if buffers:
                self.data_plane_read(datagrams, errors)
            for data, addr in foreign:
                self._quic_received(data, addr)
            if buffers < READ_BATCH_BUFFERS:
                break
        if self._after_receive is None:
            self._after_receive = self._loop.call_soon(self._answer_received)

    def data_plane_read(self, datagrams: ReadDatagrams, errors: list[str]) -> None:
        """This link's part of a batch its channel opened (from its own socket, or from
        the listener's, ``ListenerReader``): acknowledged as soon as it is read, before
        the session handles it (one read may hold thousands of packets, UDP GRO, and the
        sender's RTT must not count their handling), then handled as one batch."""
        channel = self.channel
        if channel is None:
            return
        if datagrams:  # an ACK is owed (a read of ACKs alone waits for the link's sending)
            channel.flush(time.monotonic())
        if datagrams and self.driver is not None and self.state is LinkState.UP:
            for error in self.driver.datagrams_received(self, datagrams):
                self._protocol_error(error)
        for reason in errors:  # opened with the peer's key: its fault
            self._protocol_error(RemoteProtocolError(reason))
        if self._after_receive is None:
            self._after_receive = self._loop.call_soon(self._answer_received)

    def _answer_received(self) -> None:
        self._after_receive = None
        if self.state is not LinkState.CLOSED:
            reason = compat.closed_by_peer(self._quic)
            if reason is not None:
                self._mark_closed(f"connection closed: {reason}")
        if self.driver is not None and self.driver.datagrams_handled():
            # A trainer's recv was answered: its task runs first (it was scheduled
            # before this), and only then the control frames and data this link owes.
            self._loop.call_soon(self.send_now)
            return
        self.send_now()

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
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
            if self.dialed and self._transport is not None:
                self._transport.close()  # its own socket: nothing else is sent on it

    def fit_datagrams(self, max_datagram_size: int) -> None:
        """Packets of at most ``max_datagram_size`` bytes (UDP payload) to the peer."""
        self.max_datagram_size = min(self.max_datagram_size, max_datagram_size)
        if self.channel is not None:
            self.channel.fit(self.max_datagram_size)

    def _on_handshake(self) -> None:
        if self.state is not LinkState.HANDSHAKING:
            return
        try:
            self.peer = self._authenticate(self)
        except WangateError as exc:  # an AuthenticationError, or our own misconfiguration
            self.refuse(LinkError.AUTHENTICATION_FAILED, f"site authentication failed: {exc}")
            return
        self._move(LinkState.AUTHENTICATED)
        self._open_channel()
        if self.dialed:
            self._send_hello()

    def _open_channel(self) -> None:
        """The data plane's keys come from this handshake's secrets (proto/engine.md):
        both ends derive the same, so the peer's packets may arrive from now on."""
        suite, send_secret, recv_secret = compat.one_rtt_secrets(self._quic)
        address = compat.peer_address(self._quic)
        assert address is not None and self._transport is not None
        sock = self._transport.get_extra_info("socket")
        self.channel = PathChannel(
            sock.fileno(),
            address,
            suite,
            send_secret,
            recv_secret,
            self.max_datagram_size,
            compat.smoothed_rtt_s(self._quic),
        )
        if not self.dialed:  # a listener's socket is shared: route the ID to this link
            compat.route_connection_id(self, self.channel.recv_cid)
        elif isinstance(self._transport, DrainingTransport):  # a socket of its own
            self._transport.reader = self._read_batches

    def _send_hello(self) -> None:
        assert self.path is not None
        site = self.site
        hello = Hello(site.name, self.path, site.instance_id, site.max_message_bytes)
        self._quic.send_stream_data(CONTROL_STREAM_ID, encode_control(hello))
        self._quic_due = True
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

    def _protocol_error(self, exc: RemoteProtocolError) -> None:
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
        self._close_channel()
        if self.driver is not None:
            self.driver.link_down(self, reason)

    # ------------------------------------------------------------- sending

    def transmit(self) -> None:
        """aioquic's hook, called once its connection changed (a packet, a timer, a
        close): send what it has, and what the session has."""
        self._quic_due = True
        self.send_now()

    def send_now(self) -> None:
        """We may send: the driver fills this link from the session first."""
        if self.driver is None or self.state is not LinkState.UP:
            self.flush()
        else:
            self.driver.fill(self)

    def flush(self) -> None:
        """Send what the channel holds (within its window and pacer), and aioquic's
        control stream."""
        channel = self.channel
        if channel is not None:
            now = time.monotonic()
            channel.flush(now)
            self._arm_channel_timer(channel, now)
        if self._quic_due:
            self._quic_due = False
            super().transmit()

    def _arm_channel_timer(self, channel: PathChannel, now: float) -> None:
        at = channel.timer(now)
        if at == self._channel_timer_at:
            return
        if self._channel_timer is not None:
            self._channel_timer.cancel()
            self._channel_timer = None
        self._channel_timer_at = at
        if at is not None:
            delay_s = max(at - now, MIN_CHANNEL_TIMER_S)
            self._channel_timer = self._loop.call_later(delay_s, self._on_channel_timer)

    def _on_channel_timer(self) -> None:
        self._channel_timer = None
        self._channel_timer_at = None
        if self.channel is not None:
            self.channel.on_timer(time.monotonic())
            self.send_now()

    def _close_channel(self) -> None:
        # the socket may close next, and its descriptor be reused: never send on it again
        self.channel = None
        if self.dialed and isinstance(self._transport, DrainingTransport):
            self._transport.reader = None  # its own socket (a listener's reads on)
        if self._channel_timer is not None:
            self._channel_timer.cancel()
            self._channel_timer = None
            self._channel_timer_at = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_channel()
        super().connection_lost(exc)

    def transmit_soon(self) -> None:
        compat.transmit_soon(self)

    def send_control(self, data: bytes) -> None:
        self._quic.send_stream_data(CONTROL_STREAM_ID, data)
        self._quic_due = True
