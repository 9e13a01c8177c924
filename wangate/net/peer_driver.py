"""One peer gateway, driven: its ``PeerSession``, its path links, its timer, its pump.

The driver is the only caller of the session, the way aioquic's
``QuicConnectionProtocol`` is the only caller of its ``QuicConnection``. Every input
(a datagram, control frames, a path up or down, a submitted message, a trainer taking
a message, the timer) is handed to the session, and then the driver services the
session in one order, always the same (:meth:`PeerDriver._service`):

1. **events** (quinn's ``poll``): deliveries go to the inbox, outcomes to waiting
   senders, the rest to the log. First, so that a trainer waiting for a message has it
   before anything else runs.
2. **timer** (``poll_timeout``): the session's next deadline, re-armed only if it moved.
3. **pump** (``poll_transmit``): every link pulls what the session has for its path.
   After a critical submission at once (the next turn of a busy loop can be
   milliseconds away); otherwise once, at the next turn of the loop, for all the
   inputs of this turn. After datagrams arrive, the link that received them transmits
   right away (acks are due) and the others are not pumped.

A link also pulls whenever aioquic may send (:meth:`fill`): acks opened the window,
the pacer allows the next packet.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

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
from wangate.core.frames import ControlFrame, Hello
from wangate.core.message import MessageHeader
from wangate.core.session import PeerSession
from wangate.errors import ErrorCode, GatewayError, LinkError, LocalProtocolError
from wangate.localapi.inbox import Inbox
from wangate.localapi.streams import InboundStreams
from wangate.metrics import GatewayMetrics
from wangate.net.link import PathLink
from wangate.service import Delivery

log = logging.getLogger("wangate.daemon")

MAX_OUTCOMES = 65536  # finished messages whose outcome Client.wait can still tell
RECENT_FAILURES = 10
PENDING_LOW_WATER = 4  # datagrams queued inside aioquic before we stop adding
FILL_ROUNDS = 16  # pull rounds per transmit before yielding to the event loop
# uvloop counts timer delays in whole milliseconds: a shorter one fires at once, before
# its deadline, and re-armed it would spin the loop until the deadline passes
MIN_TIMER_DELAY_S = 0.001

Clock = Callable[[], float]


class PeerDriver:
    def __init__(
        self,
        session: PeerSession,
        *,
        inbox: Inbox,
        metrics: GatewayMetrics,
        clock: Clock,
        on_unreachable: Callable[[], object],
        on_outcome: Callable[[int, str | None], object] | None = None,
        on_acked: Callable[[int], object] | None = None,
        streams: InboundStreams | None = None,
    ) -> None:
        self.session = session
        self.peer = session.peer
        self.links: dict[str, PathLink] = {}
        self.instance_id: int | None = None  # the peer's, from its hello
        self._inbox = inbox
        self._metrics = metrics
        self._clock = clock
        self._on_unreachable = on_unreachable
        self._on_outcome = on_outcome  # each finished message: (msg_id, None or why it failed)
        self._on_acked = on_acked  # each message the peer has whole (msg_id)
        self._streams = streams  # large messages taken by trainers while they arrive
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._pump_scheduled = False
        self._datagrams_handled = False
        # deliveries the inbox refused, in arrival order: later ones wait behind them
        self._refused: deque[Delivery] = deque()
        self._redelivery: asyncio.Task[None] | None = None
        self.backlog_freed = asyncio.Event()  # a send waiting for room may go on (or fail)
        # the last failures, for status(): msg_id, tag, step, reason
        self.failures: deque[dict[str, Any]] = deque(maxlen=RECENT_FAILURES)
        # finished messages: None once a trainer took it, else why it failed
        self.outcomes: OrderedDict[int, str | None] = OrderedDict()
        self.outcome_changed = asyncio.Event()  # an outcome or the peer's state changed

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
        if self.instance_id is not None and self.instance_id != hello.instance_id:
            log.warning("peer %s restarted: messages in progress with it fail", self.peer)
            self.session.peer_restarted(self._clock())
            # connections to the old instance are dead even if they have not timed out
            for old in list(self.links.values()):
                if old is not link:
                    old.refuse(LinkError.DUPLICATE, "peer restarted")
        self.instance_id = hello.instance_id
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
        self.session.set_peer_limits(hello.max_message_bytes)
        return True

    def link_up(self, link: PathLink) -> None:
        assert link.path is not None
        self.links[link.path] = link
        self.session.path_up(link.path, datagram_bytes=link.datagram_bytes, now=self._clock())
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
        self.session.path_down(link.path, self._clock(), reason)
        log.info("%s/%s down: %s", self.peer, link.path, reason)
        self._service()

    def close(self, code: LinkError, reason: str) -> None:
        for link in list(self.links.values()):
            link.refuse(code, reason)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._redelivery is not None:
            self._redelivery.cancel()
        self.backlog_freed.set()  # senders waiting for room learn the peer is gone

    # ------------------------------------------------------------- inputs

    def datagram_received(self, link: PathLink, data: bytes) -> None:
        """One DATAGRAM frame; raises RemoteProtocolError if malformed."""
        assert link.path is not None
        self.session.handle_datagram(link.path, data, self._clock())
        # a message may be complete, and an ack deadline may be new: without this
        # both would wait for whatever timer happened to be armed
        self._datagrams_handled = True

    def datagrams_handled(self) -> None:
        """A link handled a batch of datagrams and transmits right after this."""
        if self._datagrams_handled:
            self._datagrams_handled = False
            self._service(pump=False)

    def control_received(self, link: PathLink, frames: Sequence[ControlFrame]) -> None:
        assert link.path is not None
        now = self._clock()
        for frame in frames:
            self.session.handle_control(link.path, frame, now)
        self._service()

    def submit(self, header: MessageHeader, payload: Buffer, *, deadline_at: float | None) -> int:
        try:
            msg_id = self.session.submit(header, payload, self._clock(), deadline_at=deadline_at)
        except LocalProtocolError as exc:  # the request itself is at fault, not the connection
            raise GatewayError(str(exc), code=ErrorCode.BAD_REQUEST) from exc
        finally:
            self.drain_events()
        if header.critical:
            self._service(pump=False)
            self.pump()  # leaves now: on a busy loop, the next turn can be milliseconds away
        else:
            self._service()
        return msg_id

    def consumed(self, body_bytes: int, msg_id: int) -> None:
        """A trainer took message ``msg_id`` of ``body_bytes`` (header included)."""
        self.session.consumed(body_bytes, msg_id)
        self._service()

    def check_reachable(self) -> None:
        """Raise ``PeerUnreachable`` while the peer is unreachable."""
        try:
            self.session.check_reachable(self._clock())
        finally:
            self.drain_events()  # the peer may have just been declared unreachable

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.session.handle_timer(self._clock())
        self._service()

    # ------------------------------------------------------------ service

    def _service(self, pump: bool = True) -> None:
        """After every input: events, then the timer, then (soon) the pump."""
        self.drain_events()
        self._arm_timer()
        if pump and not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        self._pump_scheduled = False
        for link in list(self.links.values()):
            link.transmit()

    def fill(self, link: PathLink) -> None:
        """Pull what the session has for ``link``'s path into aioquic, and send it.

        aioquic's own DATAGRAM queue stays a few entries long, so that nothing waits
        behind a full window: which path carries a shard is decided at transmit time.
        """
        session, path, pending = self.session, link.path, link.pending
        assert path is not None
        for _ in range(FILL_ROUNDS):
            now = self._clock()
            control = session.control_to_send(path, now)
            if control:
                link.send_control(control)
            added = 0
            # unpaced while critical data waits: what is pulled now must not wait for it
            critical = session.has_critical_for(path)
            while len(pending) < PENDING_LOW_WATER:
                datagram = session.datagram_to_send(path, now)
                if datagram is None:
                    break
                link.send_datagram(datagram)
                added += 1
            link.pacer.burst = critical or session.has_critical_for(path)
            link.flush()
            if added == 0 or pending:
                break  # nothing more to send, or aioquic's window/pacer is full
        else:
            link.transmit_soon()  # more to send: continue after other work had a turn

    def _arm_timer(self) -> None:
        deadline = self.session.get_timer()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            delay_s = max(0.0, deadline - self._clock())
            if 0.0 < delay_s < MIN_TIMER_DELAY_S:
                delay_s = MIN_TIMER_DELAY_S
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def drain_events(self) -> None:
        session = self.session
        failed: list[SendFailed] = []
        while (event := session.next_event()) is not None:
            if isinstance(event, MessageReceived):
                if self._streams is not None and self._streams.completed(self.peer, event.msg_id):
                    self.consumed(event.body_bytes, event.msg_id)  # its trainer has it
                else:
                    self._deliver(event)
            elif isinstance(event, MessageProgress):
                if self._streams is not None:
                    self._streams.progress(self.peer, event.msg_id, event.body, event.ready_bytes)
            elif isinstance(event, MessageDelivered):
                self._metrics.message_delivered(self.peer, event.critical, event.elapsed_s)
                self.backlog_freed.set()
                if self._on_acked is not None:
                    self._on_acked(event.msg_id)
            elif isinstance(event, SendFailed):
                failed.append(event)
                self.failures.append(
                    {
                        "msg_id": event.msg_id,
                        "tag": event.tag,
                        "step": event.step,
                        "reason": event.reason,
                    }
                )
                self._finish(event.msg_id, _failure_text(self.peer, event))
                self._metrics.message_failed(self.peer)
                self.backlog_freed.set()
            elif isinstance(event, MessageTaken):
                self._finish(event.msg_id, None)
            elif isinstance(event, PeerStateChanged):
                level = logging.WARNING if event.state == "unreachable" else logging.INFO
                log.log(level, "peer %s %s: %s", self.peer, event.state, event.reason)
                self.backlog_freed.set()  # a send waiting for room must fail, or may go on
                self.outcome_changed.set()
                if event.state == "unreachable":
                    self._on_unreachable()
                if self._streams is not None and event.state in ("unreachable", "restarted"):
                    self._streams.peer_gone(self.peer, event.state, event.reason)
            elif isinstance(event, MessageDropped):
                log.warning("dropped message %d from %s: %s", event.msg_id, self.peer, event.reason)
                if self._streams is not None:
                    self._streams.dropped(self.peer, event.msg_id, event.reason, event.code)
            elif isinstance(event, PathStateChanged):
                log.warning("path %s/%s %s: %s", self.peer, event.path, event.state, event.reason)
            elif isinstance(event, RouteChanged):
                log.warning(
                    "critical route to %s: %s -> %s (%s)",
                    self.peer,
                    event.previous or "none",
                    event.current or "none",
                    event.reason,
                )
        if failed:
            _log_failures(self.peer, failed)

    def _finish(self, msg_id: int, failure: str | None) -> None:
        self.outcomes[msg_id] = failure
        while len(self.outcomes) > MAX_OUTCOMES:
            self.outcomes.popitem(last=False)
        self.outcome_changed.set()
        if self._on_outcome is not None:
            self._on_outcome(msg_id, failure)

    # ---------------------------------------------------------- delivery

    def _deliver(self, event: MessageReceived) -> None:
        header = event.header
        delivery = Delivery(
            source=self.peer,
            tag=header.tag,
            step=header.step,
            critical=header.critical,
            meta=header.meta,
            payload=event.payload,
            checksum=header.checksum,
            msg_id=event.msg_id,
            body_bytes=event.body_bytes,
        )
        # Behind a refused one, a delivery waits its turn: messages from one source
        # reach trainers in the order they completed.
        if self._refused or not self._inbox.try_deliver(delivery):
            self._refused.append(delivery)
            if self._redelivery is None:
                self._redelivery = asyncio.get_running_loop().create_task(self._redeliver())

    async def _redeliver(self) -> None:
        try:
            while self._refused:
                await self._inbox.deliver(self._refused[0])  # waits for room
                self._refused.popleft()
        finally:
            self._redelivery = None


def _failure_text(peer: str, event: SendFailed) -> str:
    return (
        f"message {event.msg_id} (tag {event.tag!r}, step {event.step}) to {peer} failed: "
        f"{event.reason}"
    )


def _log_failures(peer: str, failed: list[SendFailed]) -> None:
    """One line per burst: a dead peer fails hundreds of messages at once."""
    if len(failed) == 1:
        log.warning("%s", _failure_text(peer, failed[0]))
        return
    reasons = list(dict.fromkeys(event.reason for event in failed))
    ids = [event.msg_id for event in failed]
    log.warning(
        "%d messages to %s failed (ids %d..%d, tags %s): %s%s",
        len(failed),
        peer,
        min(ids),
        max(ids),
        ", ".join(sorted({repr(event.tag) for event in failed})[:5]),
        "; ".join(reasons[:3]),
        f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else "",
    )
