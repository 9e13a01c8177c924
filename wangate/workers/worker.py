"""A worker process: its own event loop and QUIC connections, stripes in and out.

Started by the coordinator (``python -m wangate.workers.worker --config FILE --index W
--fd N``) with one end of a socketpair as its control channel. It runs the drivers of
its connections (``DriverBackend``) under the gateway's ``Service``, without the local
API: worker ``W`` listens on each ``site.listen`` port + ``W`` and dials
each path's remote port + ``W``, so worker ``W`` of one site talks to worker ``W`` of
the other (proto/workers.md). Stripes come in as shared-memory segments and go out as
ordinary messages of its sessions; stripes that arrive go to the coordinator in the
segments they were assembled in. Nothing here changes the sans-IO core.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import functools
import itertools
import logging
import os
import random
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from wangate.config import Config, load_config
from wangate.core.events import MessageDropped, MessageProgress, MessageReceived, PeerStateChanged
from wangate.daemon_process import install_event_loop_policy, tune_collector
from wangate.delivery.delivered import Delivery
from wangate.delivery.trainers import TrainerDelivery
from wangate.errors import ErrorCode, WangateError
from wangate.gateway.drivers import DriverBackend
from wangate.gateway.endpoint import startup_error
from wangate.gateway.outcomes import OutcomeBook
from wangate.gateway.service import Service
from wangate.metrics import GatewayMetrics
from wangate.net.peer_driver import BodyBuffers
from wangate.service import Submission
from wangate.shm import map_segment
from wangate.workers.channel import UNKNOWN_HOLDER, Channel

log = logging.getLogger("wangate.workers")

REPORT_INTERVAL_S = 0.1  # how stale the coordinator's paths/status may be while busy
# idle (no stripe held, no peer or path changing state) a report goes this often: the
# reports were most of an idle worker's and all of an idle coordinator's CPU
# (bench/RESULTS.md, "Worker processes")
IDLE_REPORT_INTERVAL_S = 1.0
PR_SET_PDEATHSIG = 1
CRITICAL_WORKER = 0  # carries the critical messages (proto/workers.md)
BULK_NICENESS = 5  # added to a bulk worker's nice value: about a third of the CPU weight


def worker_config(config: Config, index: int) -> Config:
    """``config`` as worker ``index`` runs it: every UDP port moved up by ``index``."""

    def moved(port: int) -> int:
        return port + index if port else 0

    site = dataclasses.replace(
        config.site, listen=tuple((host, moved(port)) for host, port in config.site.listen)
    )
    peers = tuple(
        dataclasses.replace(
            peer,
            paths=tuple(
                dataclasses.replace(
                    path,
                    remote=None if path.remote is None else (path.remote[0], moved(path.remote[1])),
                )
                for path in peer.paths
            ),
        )
        for peer in config.peers
    )
    return dataclasses.replace(config, site=site, peers=peers)


class ForwardingSink:
    """Where the worker's drivers deliver: every stripe goes on to the coordinator,
    which assembles and streams messages (bodies stay in private memory here: each
    stripe is written once more, into the segment the coordinator names)."""

    def __init__(self, forward: Callable[[Delivery], None]) -> None:
        self._forward = forward

    def body_buffers(self) -> BodyBuffers:
        return (lambda size, start, job: bytearray(size)), (lambda body: None), PRIVATE_BODIES

    def received(self, source: str, event: MessageReceived) -> bool:
        self._forward(Delivery.received(source, event))
        return False

    def progress(self, source: str, event: MessageProgress) -> None:
        pass  # a stripe is forwarded whole

    def dropped(self, source: str, event: MessageDropped) -> None:
        pass  # the sender sends the stripe again

    def peer_gone(self, source: str, event: PeerStateChanged) -> None:
        pass  # the coordinator judges the peer from every worker's report


PRIVATE_BODIES = 1 << 62  # the smallest body assembled in a segment: none
INSTANCE_LOW_BITS = 16  # of a worker's instance id: its own; the rest are the coordinator's


class Worker:
    def __init__(
        self, config: Config, index: int, sock: socket.socket, coordinator_instance: int = 0
    ) -> None:
        self.index = index
        # the peer's workers tell a restarted worker (resend what it held) from a
        # restarted coordinator (what it held is lost) by the high bits
        instance = random.getrandbits(63) | 1
        if coordinator_instance:
            own = random.getrandbits(INSTANCE_LOW_BITS) | 1
            instance = coordinator_instance >> INSTANCE_LOW_BITS << INSTANCE_LOW_BITS | own
        book = OutcomeBook()
        book.on_outcome = self._outcome
        book.on_acked = self._acked
        self.backend = DriverBackend(
            config,
            sink=ForwardingSink(self._forward),
            book=book,
            metrics=GatewayMetrics(),
            instance_id=instance,
            startup_error=functools.partial(startup_error, config.path),
        )
        # the worker's own trainers' side is never used: nothing is sent to its site
        self.service = Service(config, self.backend, TrainerDelivery(1), book)
        # the peer's coordinator (an instance's high bits) that had the stripe, by stripe
        # id: seen when it was submitted, and again when the peer had it whole
        self._held_by: dict[int, int] = {}
        self._arrived: dict[int, Delivery] = {}  # by arrival seq, waiting for ``place``
        self._arrivals = itertools.count(1)
        self._sock = sock
        self._channel: Channel | None = None
        self._sids: dict[tuple[str, int], int] = {}  # (peer, msg_id) -> stripe id
        # outcomes before their id: (None or why it failed, whether the peer restarted)
        self._early: dict[tuple[str, int], tuple[str | None, bool]] = {}
        self._queued_bytes = 0
        self._sizes: dict[int, int] = {}
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopped.set)
        self._channel = Channel(self._sock, self._on_message, self._on_closed)
        try:
            await self.backend.start()
        except WangateError as exc:
            log.error("worker %d: %s", self.index, exc)
            return 2
        self._channel.send("ready", {"pid": os.getpid()})
        tune_collector()
        self._reports_failed = False
        reporter = loop.create_task(self._report())
        reporter.add_done_callback(self._reports_ended)
        try:
            await self._stopped.wait()
        finally:
            reporter.cancel()
            self._channel.close()
            await self.backend.close()
        return 1 if self._reports_failed else 0

    def _reports_ended(self, reporter: asyncio.Task[None]) -> None:
        """A worker that cannot report is blind to its coordinator: it stops (and is
        started again) rather than serve on unseen. Once stopping, a report that could
        not go (the channel closed) is no news."""
        if reporter.cancelled() or reporter.exception() is None or self._stopped.is_set():
            return
        error = reporter.exception()
        log.error("worker %d: its reports failed: %r", self.index, error, exc_info=error)
        self._reports_failed = True
        self._stopped.set()

    def _on_closed(self, reason: str) -> None:
        if reason != "end of file":
            log.error("worker %d: control channel: %s", self.index, reason)
        self._stopped.set()  # the coordinator is gone, or talks nonsense: stop

    # ----------------------------------------------------------- from the coordinator

    def _on_message(self, kind: str, fields: dict[str, Any], fds: list[int]) -> None:
        if kind == "send":
            self._send(fields, fds[0])
        elif kind == "place":
            self._place(fields["seq"], fields["offset"], fds[0])
        elif kind == "taken":
            self._arrived.pop(fields["seq"], None)  # if it was not placed
            driver = self.backend.peers.get(fields["peer"])
            if driver is not None:
                driver.consumed(fields["body_bytes"], fields["msg_id"])
        elif kind == "reset":
            try:
                self.service.reset_path(fields["peer"], fields["path"])
            except WangateError as exc:
                log.info("worker %d: %s", self.index, exc)
        else:
            log.error("worker %d: unexpected %s packet from the coordinator", self.index, kind)
            self._stopped.set()

    def _send(self, fields: dict[str, Any], fd: int) -> None:
        sid = fields["sid"]
        try:
            payload = map_segment(fd, fields["offset"], fields["length"])
        except WangateError as exc:
            self._failed(sid, str(exc), ErrorCode.BAD_SEGMENT)
            return
        finally:
            os.close(fd)
        deadline_s = fields["deadline_s"]
        submission = Submission(
            peer=fields["peer"],
            tag=fields["tag"],
            step=fields["step"],
            critical=fields["critical"],
            meta=fields["meta"],
            payload=payload,
            checksum=fields["checksum"],
            deadline_s=None if deadline_s < 0 else float(deadline_s),
            job=fields["job"],
        )
        self._sizes[sid] = len(payload)
        self._queued_bytes += len(payload)
        try:
            msg_id = self.service.submit_now(submission)
        except WangateError as exc:
            self._failed(sid, str(exc), getattr(exc, "code", ErrorCode.ERROR))
            return
        if msg_id is not None:
            self._submitted(submission.peer, msg_id, sid)
            return
        task = asyncio.get_running_loop().create_task(self._submit_later(submission, sid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit_later(self, submission: Submission, sid: int) -> None:
        try:
            msg_id = await self.service.submit(submission)
        except WangateError as exc:
            self._failed(sid, str(exc), getattr(exc, "code", ErrorCode.ERROR))
            return
        self._submitted(submission.peer, msg_id, sid)

    def _submitted(self, peer: str, msg_id: int, sid: int) -> None:
        key = (peer, msg_id)
        self._note_holder(peer, sid)
        if key in self._early:
            self._finished(peer, sid, *self._early.pop(key))
        else:
            self._sids[key] = sid

    def _acked(self, peer: str, msg_id: int) -> None:
        sid = self._sids.get((peer, msg_id))
        if sid is not None and self._channel is not None:
            self._note_holder(peer, sid)
            self._channel.send("acked", {"sid": sid})

    def _outcome(self, peer: str, msg_id: int, failure: str | None, restarted: bool) -> None:
        sid = self._sids.pop((peer, msg_id), None)
        if sid is None:
            self._early[(peer, msg_id)] = (failure, restarted)
            return
        self._finished(peer, sid, failure, restarted)

    def _coordinator_of(self, peer: str) -> int | None:
        """The peer's coordinator as its worker here last heard (None: not yet)."""
        driver = self.backend.peers.get(peer)
        if driver is None or driver.instance_id is None:
            return None
        return driver.instance_id >> INSTANCE_LOW_BITS

    def _note_holder(self, peer: str, sid: int) -> None:
        coordinator = self._coordinator_of(peer)
        if coordinator is not None:
            self._held_by[sid] = coordinator

    def _finished(self, peer: str, sid: int, failure: str | None, restarted: bool) -> None:
        holder = self._held_by.pop(sid, UNKNOWN_HOLDER)
        if failure is None:
            self._queued_bytes -= self._sizes.pop(sid, 0)
            assert self._channel is not None
            self._channel.send("done", {"sid": sid, "holder": holder})
            return
        # the session's words name the stripe's own message id: keep only the reason
        reason = failure.split(" failed: ", 1)[-1]
        # A peer's worker that restarted lost nothing its coordinator has: the stripe
        # may go again (the coordinator drops a second copy). A new coordinator knows
        # nothing of it, and the old one may have handed it to a trainer: final. Where
        # it is not known which, final (a second delivery is worse than a failure).
        worker_only = holder == self._coordinator_of(peer)  # never UNKNOWN_HOLDER
        final = restarted and not worker_only
        code = ErrorCode.PEER_RESTARTED if final else ErrorCode.MESSAGE_FAILED
        self._failed(sid, reason, code, holder)

    def _failed(self, sid: int, reason: str, code: str, holder: int = UNKNOWN_HOLDER) -> None:
        """The stripe failed; ``holder``: the peer's coordinator it may have reached."""
        self._queued_bytes -= self._sizes.pop(sid, 0)
        assert self._channel is not None
        fields = {"sid": sid, "reason": reason, "code": str(code), "holder": holder}
        self._channel.send("failed", fields)

    # ------------------------------------------------------------- to the coordinator

    def _forward(self, delivery: Delivery) -> None:
        """A stripe arrived whole and verified: the coordinator says where it goes."""
        seq = next(self._arrivals)
        self._arrived[seq] = delivery
        assert self._channel is not None
        self._channel.send(
            "arrived",
            {
                "peer": delivery.source,
                "msg_id": delivery.msg_id,
                "body_bytes": delivery.body_bytes,
                "tag": delivery.tag,
                "step": delivery.step,
                "critical": delivery.critical,
                "meta": delivery.meta,
                "checksum": delivery.checksum,
                "length": memoryview(delivery.payload).nbytes,
                "seq": seq,
                "job": delivery.job,
            },
        )

    def _place(self, seq: int, offset: int, fd: int) -> None:
        """Write the stripe that arrived as ``seq`` into the message's segment at
        ``offset``."""
        delivery = self._arrived.pop(seq, None)
        try:
            if delivery is None:
                return  # not ours (any more): the coordinator learns nothing placed
            data = memoryview(delivery.payload).cast("B")
            while data.nbytes:
                written = os.pwrite(fd, data, offset)
                data, offset = data[written:], offset + written
        except OSError as exc:
            # a segment we cannot write is the coordinator's fault, not the peer's:
            # stop; the coordinator starts us again and the peer resends what we held
            log.error("worker %d: cannot place a stripe: %s", self.index, exc)
            self._stopped.set()
            return
        finally:
            os.close(fd)
        assert self._channel is not None
        self._channel.send("placed", {"seq": seq})

    def _busy(self) -> bool:
        return bool(self._sizes or self._arrived or self._tasks)

    def _peer_states(self) -> tuple[tuple[str, bool, int | None, int], ...]:
        """What a report must not wait for: peers' reachability and instances, links up."""
        return tuple(
            (name, driver.view.unreachable, driver.instance_id, len(driver.links))
            for name, driver in self.backend.peers.items()
        )

    async def _report(self) -> None:
        assert self._channel is not None
        loop = asyncio.get_running_loop()
        while True:
            states = self._peer_states()
            sent_at = loop.time()
            rows, status = self.service.rows_and_status()
            times = os.times()
            self._channel.send(
                "report",
                {
                    "rows": [row.to_dict() for row in rows],
                    "status": status.to_dict(),
                    "cpu_s": times.user + times.system,
                    "queued": self._queued_bytes,
                },
            )
            await asyncio.sleep(REPORT_INTERVAL_S)
            while (
                not self._busy()
                and loop.time() - sent_at < IDLE_REPORT_INTERVAL_S
                and self._peer_states() == states
            ):
                await asyncio.sleep(REPORT_INTERVAL_S)


def _die_with_parent() -> None:
    """SIGKILL this process when the coordinator dies, however it dies (prctl(2))."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wangate.workers.worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--instance", type=int, default=0, help="the coordinator's instance id")
    args = parser.parse_args(argv)
    _die_with_parent()
    if os.getppid() == 1:
        return 1  # the coordinator died before the line above
    if args.index != CRITICAL_WORKER:
        # Where the host's cores are oversubscribed, the kernel then gives the critical
        # worker (and the coordinator) their CPU before bulk; with a core free it
        # changes nothing.
        os.nice(BULK_NICENESS)
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s %(levelname)s worker {args.index}: %(message)s",
        stream=sys.stderr,
    )
    sock = socket.socket(fileno=args.fd)
    config = worker_config(load_config(args.config), args.index)
    install_event_loop_policy()
    return asyncio.run(Worker(config, args.index, sock, args.instance).run())


if __name__ == "__main__":
    raise SystemExit(main())
