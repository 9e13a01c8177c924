"""One peer gateway, driven: its ``PeerSession``, its path links, its timer, its pump.

The driver is the only caller of the session, the way aioquic's
``QuicConnectionProtocol`` is the only caller of its ``QuicConnection``: it builds the
session, and everyone else reads it through ``view`` (``SessionView``, reads only).
Every input (a datagram, control frames, a path up or down, a submitted message, a
trainer taking a message, the timer) is handed to the session, and then the driver
services the session in one order, always the same (:meth:`PeerDriver._service`):

1. **events**: what arrived goes to the ``DeliverySink`` (the site's trainers, or a
   worker's coordinator), outcomes to the ``DriverListener``, the rest to the log.
   First, so that a trainer waiting for a message has it before anything else runs.
2. **timer**: the session's next deadline, re-armed only if it moved.
3. **transmit**: every link pulls what the session has for its path. After a critical
   submission at once (the next turn of a busy loop can be milliseconds away);
   otherwise once, at the next turn of the loop, for all the inputs of this turn.
   After datagrams arrive, the link that received them transmits right away (acks
   are due) and the others are not pumped.

quinn polls a connection the other way round (transmit, then timeout, then events):
there the application pulls events when it likes. Here events go first because they
are what a waiting trainer needs. A link also pulls whenever aioquic may send
(:meth:`fill`): acks opened the window, the pacer allows the next packet.

Draining events never re-enters itself: what a drain does to the session (giving the
credit of a message a trainer took while it arrived back) only queues more events,
which the same drain takes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from wangate.core.buffer import Buffer
from wangate.core.events import (
    MessageDelivered,
    MessageDropped,
    MessageProgress,
    MessageReceived,
    MessageTaken,
    PathStateChanged,
    PeerStateChanged,
    RouteChanged,
    SendFailed,
)
from wangate.core.fairqueue import JobSendStats
from wangate.core.frames import ControlFrame, Hello
from wangate.core.governor import BulkGovernor
from wangate.core.inbound import Allocate, Free
from wangate.core.jobs import JobPolicy
from wangate.core.message import MessageHeader
from wangate.core.outbound import CodingPolicy
from wangate.core.session import PeerSession
from wangate.core.states import PeerStateKind
from wangate.engine import ReadDatagrams
from wangate.errors import (
    ErrorCode,
    GatewayError,
    LinkError,
    LocalProtocolError,
    RemoteProtocolError,
    failure_text,
)
from wangate.metrics import GatewayMetrics
from wangate.net.link import PathLink, timer_delay_s

log = logging.getLogger("wangate.daemon")

# Datagrams queued in a channel before we stop adding: what the path sends in
# FILL_AHEAD_S at its pacing rate, within [PENDING_LOW_WATER, PENDING_HIGH_WATER]. A
# slow path commits only a few datagrams ahead (which path carries a shard is decided
# at transmit time); a fast one takes dozens per call and per sendmmsg, not a few.
PENDING_LOW_WATER = 16
PENDING_HIGH_WATER = 128
FILL_AHEAD_S = 0.0005
FILL_ROUNDS = 16  # pull rounds per transmit before yielding to the event loop

Clock = Callable[[], float]
# why a session refuses a message it is handed (None: it takes it)
Screen = Callable[[MessageHeader], str | None]
BodyBuffers = tuple[Allocate, Free, int]


class DeliverySink(Protocol):
    """Where what arrives from the peer goes (wangate.delivery.trainers for a site's
    trainers; a worker forwards it to its coordinator)."""

    def body_buffers(self) -> BodyBuffers:
        """(allocate, free, min size): where inbound bodies from that size on are
        assembled (``PeerSession.use_body_buffers``)."""
        ...

    def received(self, source: str, event: MessageReceived) -> bool:
        """A whole, verified message; True if a trainer already holds it (streamed)."""
        ...

    def progress(self, source: str, event: MessageProgress) -> None: ...

    def dropped(self, source: str, event: MessageDropped) -> None: ...

    def peer_gone(self, source: str, event: PeerStateChanged) -> None:
        """The peer became unreachable or restarted."""
        ...


class DriverListener(Protocol):
    """Who hears what became of our messages to the peer (the gateway's outcomes)."""

    def taken(self, peer: str, msg_id: int) -> None:
        """A trainer at the peer took message ``msg_id``."""
        ...

    def failed(
        self, peer: str, msg_id: int, tag: str, step: int, reason: str, restarted: bool = False
    ) -> None:
        """Message ``msg_id`` will never reach a trainer at the peer, for ``reason``
        (``restarted``: the peer restarted, and its old instance may have had it)."""
        ...

    def acked(self, peer: str, msg_id: int) -> None:
        """The peer holds message ``msg_id`` whole (no trainer took it yet)."""
        ...

    def changed(self, peer: str) -> None:
        """Room for more, an outcome, or the peer's state changed: waiters look again."""
        ...


class SessionView(Protocol):
    """What anyone but the driver may read of a session (reads change nothing)."""

    @property
    def path_names(self) -> list[str]: ...

    @property
    def unreachable(self) -> bool: ...

    @property
    def last_msg_id(self) -> int: ...

    def silent_s(self, now: float) -> float: ...

    def peer_state(self, now: float) -> tuple[PeerStateKind, str]: ...

    def message_state(self, msg_id: int) -> str | None: ...

    def pending_bytes(self) -> int: ...

    def path_snapshot(self, path: str, now: float) -> dict[str, object]: ...

    def liveness(self, now: float) -> dict[str, object]: ...

    def status(self) -> dict[str, int]: ...

    def job_stats(self) -> dict[str, JobSendStats]: ...


@dataclass(frozen=True)
class SessionSettings:
    """What every session of a gateway is built with (from its configuration)."""

    site: str
    max_message_bytes: int  # of a message body, header included
    inbox_window_bytes: int
    coding: CodingPolicy
    host_delay_target_s: float
    partial_idle_s: float
    peer_dead_s: float
    screen: Screen | None = None


def pending_low_water(pacing_rate_bytes: float, datagram_bytes: int) -> int:
    """How many datagrams a channel pacing at ``pacing_rate_bytes`` is kept filled to."""
    ahead = int(pacing_rate_bytes * FILL_AHEAD_S) // max(datagram_bytes, 1)
    return min(max(ahead, PENDING_LOW_WATER), PENDING_HIGH_WATER)


class PeerDriver:
    def __init__(
        self,
        peer: str,
        settings: SessionSettings,
        *,
        configured_paths: int,
        sink: DeliverySink,
        listener: DriverListener,
        metrics: GatewayMetrics,
        clock: Clock,
    ) -> None:
        self.peer = peer
        self._session = PeerSession(
            settings.site,
            peer,
            max_message_bytes=settings.max_message_bytes,
            inbox_window_bytes=settings.inbox_window_bytes,
            now=clock(),
            coding=settings.coding,
            governor=BulkGovernor(target_delay_s=settings.host_delay_target_s),
            partial_idle_s=settings.partial_idle_s,
            peer_dead_s=settings.peer_dead_s,
            configured_paths=configured_paths,
            screen=settings.screen,
        )
        self._session.use_body_buffers(*sink.body_buffers())
        self.links: dict[str, PathLink] = {}
        self.instance_id: int | None = None  # the peer's, from its hello
        self._sink = sink
        self._listener = listener
        self._metrics = metrics
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._pump_scheduled = False
        self._datagrams_handled = False
        self._handed_to_trainer = False  # since the last datagrams_handled
        self._draining = False

    @property
    def view(self) -> SessionView:
        return self._session

    def set_configured_paths(self, count: int) -> None:
        """The peer is "up" only with this many paths up."""
        self._session.configured_paths = count

    def set_jobs(self, policies: Mapping[str, JobPolicy]) -> None:
        """The site's jobs: how each shares the paths to this peer, and (their names)
        the only jobs whose messages from it are taken."""
        self._session.set_served_jobs(frozenset(policies))
        self._session.set_jobs(policies, self._clock())

    # ------------------------------------------------------------- links

    def admit(self, link: PathLink, hello: Hello) -> bool:
        """Whether ``link`` (authenticated, hellos exchanged) carries its path from now on.

        A new instance of the peer (it restarted) ends every link to the old one. Two
        links for one path: when one site dialed both, the newer wins (that site only
        dials again once it has given the older up, though its close may have been
        lost); when each site dialed one, the one dialed by the site whose name sorts
        first wins, on both sides alike.
        """
        assert link.path is not None
        # the new instance first: what the restart fails is judged against it
        previous, self.instance_id = self.instance_id, hello.instance_id
        if previous is not None and previous != hello.instance_id:
            log.warning("peer %s restarted: messages in progress with it fail", self.peer)
            self._session.peer_restarted(self._clock())
            # connections to the old instance are dead even if they have not timed out
            for old in list(self.links.values()):
                if old is not link:
                    old.refuse(LinkError.DUPLICATE, "peer restarted")
        existing = self.links.get(link.path)
        if existing is not None and existing is not link:
            if existing.dialer_site == link.dialer_site:
                existing.refuse(LinkError.DUPLICATE, f"path {link.path} reconnected")
            elif existing.dialer_site < link.dialer_site:
                link.refuse(LinkError.DUPLICATE, f"path {link.path} is already connected")
                return False
            else:
                existing.refuse(
                    LinkError.DUPLICATE, f"path {link.path} replaced by the peer's dial"
                )
        self._session.set_peer_limits(hello.max_message_bytes)
        return True

    def link_up(self, link: PathLink) -> None:
        assert link.path is not None
        self.links[link.path] = link
        self._session.path_up(link.path, datagram_bytes=link.datagram_bytes, now=self._clock())
        log.info(
            "%s/%s up: %s -> %s (%s)",
            self.peer,
            link.path,
            link.local_address,
            link.remote_address,
            "dialed" if link.dialed else "accepted",
        )
        self._service()

    def link_down(self, link: PathLink, reason: str) -> None:
        assert link.path is not None
        if self.links.get(link.path) is not link:
            return  # replaced already
        del self.links[link.path]
        self._session.path_down(link.path, self._clock(), reason)
        log.info("%s/%s down: %s", self.peer, link.path, reason)
        self._service()

    def close(self, code: LinkError, reason: str) -> None:
        for link in list(self.links.values()):
            link.refuse(code, reason)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._listener.changed(self.peer)  # senders waiting for room learn it is gone

    # ------------------------------------------------------------- inputs

    def datagrams_received(
        self, link: PathLink, datagrams: list[bytes] | ReadDatagrams
    ) -> list[RemoteProtocolError]:
        """A batch of DATAGRAM frames, read together: the malformed ones' errors (the
        rest are handled all the same)."""
        assert link.path is not None
        errors = self._session.handle_datagrams(link.path, datagrams, self._clock())
        self._datagrams_handled = True
        return errors

    def datagrams_handled(self) -> bool:
        """A link handled a batch of datagrams and transmits after this; True if a
        message went to the trainers meanwhile (then the link lets their replies go
        out before its own sending)."""
        if self._datagrams_handled:
            self._datagrams_handled = False
            self._service(pump=False)
        handed, self._handed_to_trainer = self._handed_to_trainer, False
        return handed

    def control_received(self, link: PathLink, frames: Sequence[ControlFrame]) -> None:
        assert link.path is not None
        now = self._clock()
        for frame in frames:
            self._session.handle_control(link.path, frame, now)
        self._service()

    def submit(self, header: MessageHeader, payload: Buffer, *, deadline_at: float | None) -> int:
        try:
            msg_id = self._session.submit(header, payload, self._clock(), deadline_at=deadline_at)
        except LocalProtocolError as exc:  # the request itself is at fault, not the connection
            self._drain_events()
            raise GatewayError(str(exc), code=ErrorCode.BAD_REQUEST) from exc
        if header.critical:
            self._service(pump=False)
            try:
                self.pump()  # leaves now: on a busy loop, the next turn can be milliseconds away
            except Exception:
                # the message is queued and goes on from the loop's pump: failing this
                # request would tell the trainer it failed while it is delivered
                log.exception(
                    "sending to %s right away failed; the message stays queued", self.peer
                )
                self._service()
        else:
            self._service()
        return msg_id

    def consumed(self, body_bytes: int, msg_id: int) -> None:
        """A trainer took message ``msg_id`` of ``body_bytes`` (header included)."""
        self._session.consumed(body_bytes, msg_id)
        self._service()

    def check_reachable(self) -> None:
        """Raise ``PeerUnreachable`` while the peer is unreachable."""
        self._session.check_reachable(self._clock())

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._session.handle_timer(self._clock())
        self._service()

    # ------------------------------------------------------------ service

    def _service(self, pump: bool = True) -> None:
        """After every input: events, then the timer, then (soon) the pump."""
        self._drain_events()
        self._arm_timer()
        if pump and not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        self._pump_scheduled = False
        for link in list(self.links.values()):
            link.send_now()

    def fill(self, link: PathLink) -> None:
        """Pull what the session has for ``link``'s path into its channel, and send it.

        The channel's queue stays short (``pending_low_water``), so that nothing waits
        behind a full window: which path carries a shard is decided at transmit time.
        """
        session, path, channel = self._session, link.path, link.channel
        assert path is not None
        if channel is None:
            return
        queue_many = channel.queue_many
        low_water = pending_low_water(channel.pacing_rate_bytes, channel.datagram_bytes)
        for _ in range(FILL_ROUNDS):
            now = self._clock()
            control = session.control_to_send(path, now)
            if control:
                link.send_control(control)
            # unpaced while critical data waits: what is pulled now must not wait for it
            critical = session.has_critical_for(path)
            added = 0
            if len(channel) < low_water:
                added = queue_many(session.send_batch(path, now, low_water - len(channel)))
            channel.burst = critical or session.has_critical_for(path)
            link.flush()
            if added == 0 or len(channel):
                break  # nothing more to send, or the window/pacer is full
        else:
            link.transmit_soon()  # more to send: continue after other work had a turn

    def _arm_timer(self) -> None:
        deadline = self._session.get_timer()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            delay_s = timer_delay_s(deadline, self._clock())
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _drain_events(self) -> None:
        if self._draining:
            raise RuntimeError(f"events of {self.peer} drained from within their own drain")
        self._draining = True
        try:
            self._drain()
        finally:
            self._draining = False

    def _drain(self) -> None:
        session, peer, sink, listener = self._session, self.peer, self._sink, self._listener
        failed: list[SendFailed] = []
        while (event := session.next_event()) is not None:
            if isinstance(event, MessageReceived):
                self._handed_to_trainer = True
                if sink.received(peer, event):  # its trainer has it: the credit goes back
                    session.consumed(event.body_bytes, event.msg_id)
            elif isinstance(event, MessageProgress):
                sink.progress(peer, event)
            elif isinstance(event, MessageDelivered):
                self._metrics.message_delivered(peer, event.critical, event.elapsed_s)
                listener.acked(peer, event.msg_id)
                listener.changed(peer)
            elif isinstance(event, SendFailed):
                failed.append(event)
                listener.failed(
                    peer, event.msg_id, event.tag, event.step, event.reason, event.restarted
                )
                self._metrics.message_failed(peer)
            elif isinstance(event, MessageTaken):
                listener.taken(peer, event.msg_id)
            elif isinstance(event, PeerStateChanged):
                gone = event.state in (PeerStateKind.UNREACHABLE, PeerStateKind.RESTARTED)
                level = logging.WARNING if gone else logging.INFO
                log.log(level, "peer %s %s: %s", peer, event.state, event.reason)
                if gone:
                    sink.peer_gone(peer, event)
                listener.changed(peer)  # a send waiting for room must fail, or may go on
            elif isinstance(event, MessageDropped):
                log.warning("dropped message %d from %s: %s", event.msg_id, peer, event.reason)
                sink.dropped(peer, event)
            elif isinstance(event, PathStateChanged):
                log.warning("path %s/%s %s: %s", peer, event.path, event.state, event.reason)
            elif isinstance(event, RouteChanged):
                log.warning(
                    "critical route to %s: %s -> %s (%s)",
                    peer,
                    event.previous or "none",
                    event.current or "none",
                    event.reason,
                )
        if failed:
            log_failures(peer, [(e.msg_id, e.tag, e.step, e.reason) for e in failed])


def log_failures(peer: str, failed: list[tuple[int, str, int, str]]) -> None:
    """One line per burst of (msg_id, tag, step, reason): a dead peer fails hundreds of
    messages at once."""
    if len(failed) == 1:
        log.warning("%s", failure_text(peer, *failed[0]))
        return
    reasons = list(dict.fromkeys(reason for _, _, _, reason in failed))
    ids = [msg_id for msg_id, _, _, _ in failed]
    log.warning(
        "%d messages to %s failed (ids %d..%d, tags %s): %s%s",
        len(failed),
        peer,
        min(ids),
        max(ids),
        ", ".join(sorted({repr(tag) for _, tag, _, _ in failed})[:5]),
        "; ".join(reasons[:3]),
        f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else "",
    )
