"""The backend that drives every peer in this process: one ``PeerDriver`` per peer,
and the ``Endpoint`` that gives the drivers their links.

It answers the service's questions (wangate.gateway.backend) from the drivers'
session views, which reading does not change; it hands submissions and a trainer's
``recv`` to the driver of that peer. Reload adds and removes peers and paths here
without a restart. A worker process runs one of these for its share of the
connections (wangate.workers.worker).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Collection, Mapping
from typing import Any

from wangate.config import Config, PathConfig, PeerConfig
from wangate.core.fairqueue import JobSendStats
from wangate.core.liveness import PEER_QUIET_S
from wangate.core.message import MAX_HEADER_BYTES, MessageHeader
from wangate.core.outbound import CodingPolicy
from wangate.core.outbox import deadline_left_s
from wangate.core.states import PathStateKind
from wangate.delivery.delivered import Delivery
from wangate.errors import ErrorCode, GatewayError, LinkError
from wangate.gateway.endpoint import Endpoint, StartupError
from wangate.gateway.outcomes import OutcomeBook
from wangate.metrics import GatewayMetrics
from wangate.net.address import host_port
from wangate.net.link import LocalSite
from wangate.net.peer_driver import DeliverySink, PeerDriver, Screen, SessionSettings
from wangate.reload import ReloadPlan
from wangate.rows import PathRow, PeerStatus
from wangate.service import Submission

log = logging.getLogger("wangate.daemon")


class DriverBackend:
    def __init__(
        self,
        config: Config,
        *,
        sink: DeliverySink,
        book: OutcomeBook,
        metrics: GatewayMetrics,
        instance_id: int,
        startup_error: StartupError,
        screen: Screen | None = None,
    ) -> None:
        self.config = config
        self.instance_id = instance_id
        max_body_bytes = config.limits.max_message_bytes + MAX_HEADER_BYTES
        target_ms = config.critical.host_delay_target_ms
        self._settings = SessionSettings(
            site=config.site.name,
            # a payload at the limit, plus the largest header, must pass
            max_message_bytes=max_body_bytes,
            inbox_window_bytes=config.limits.peer_inbox_bytes,
            coding=CodingPolicy(
                k=config.fec.k if config.fec.enabled else 0,
                min_repair=config.fec.min_repair,
                max_repair=config.fec.max_repair,
                critical_min_repair=config.fec.critical_min_repair,
            ),
            host_delay_target_s=target_ms / 1000 if target_ms else math.inf,
            partial_idle_s=config.limits.partial_message_idle_s,
            peer_dead_s=config.limits.peer_dead_s,
            screen=screen,
        )
        self._sink = sink
        self._book = book
        self._metrics = metrics
        self.peers: dict[str, PeerDriver] = {
            peer.name: self._new_driver(peer) for peer in config.peers
        }
        site = LocalSite(config.site.name, instance_id, max_body_bytes)
        self.endpoint = Endpoint(config, site, self.peers, startup_error)

    def _new_driver(self, peer: PeerConfig) -> PeerDriver:
        driver = PeerDriver(
            peer.name,
            self._settings,
            configured_paths=len(peer.paths),
            sink=self._sink,
            listener=self._book,
            metrics=self._metrics,
            clock=time.monotonic,
        )
        driver.set_jobs(self.config.job_policies([p.name for p in peer.paths]))
        return driver

    # ----------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self.endpoint.start()

    async def close(self) -> None:
        await self.endpoint.stop()
        # peers are told first: an accepted link's close frame leaves by the listener's
        # socket, which closes after it
        for driver in self.peers.values():
            driver.close(LinkError.SHUTDOWN, "gateway shutting down")
        self.endpoint.close()

    def apply_reload(self, plan: ReloadPlan) -> None:
        """Switch to ``plan.effective``: peers and paths come and go without a restart."""
        self.config = self.endpoint.config = plan.effective  # first: links are checked
        for peer, path_name in plan.paths_removed:
            self._remove_path(peer, path_name)
        for name in plan.peers_removed:
            self._remove_peer(name)
        for peer_cfg in plan.peers_added:
            self.peers[peer_cfg.name] = self._new_driver(peer_cfg)
            for path in peer_cfg.paths:
                self.endpoint.start_dialing(peer_cfg.name, path)
        for peer, path in plan.paths_added:
            self._count_paths(peer)
            self.endpoint.start_dialing(peer, path)
        for peer_cfg in self.config.peers:  # jobs, paths or the number of jobs changed
            driver = self.peers.get(peer_cfg.name)
            if driver is not None:
                driver.set_jobs(self.config.job_policies([p.name for p in peer_cfg.paths]))

    def _remove_peer(self, name: str) -> None:
        driver = self.peers.pop(name, None)
        if driver is None:
            return
        self.endpoint.stop_dialing(name)
        waiting = driver.view.status()["messages_in_flight"]
        driver.close(LinkError.SHUTDOWN, "peer removed from the configuration")
        self._book.forget(name)
        if waiting:
            log.warning("peer %s removed: %d messages to it are given up", name, waiting)

    def _remove_path(self, peer: str, path_name: str) -> None:
        self.endpoint.stop_dialing(peer, path_name)
        driver = self.peers.get(peer)
        link = driver.links.get(path_name) if driver is not None else None
        if link is not None:
            link.refuse(LinkError.SHUTDOWN, "path removed from the configuration")
        self._count_paths(peer)

    def _count_paths(self, peer: str) -> None:
        driver = self.peers.get(peer)
        configured = [p for p in self.config.peers if p.name == peer]
        if driver is not None and configured:  # "up" only with every configured path up
            driver.set_configured_paths(len(configured[0].paths))

    # ------------------------------------------------------------ sending

    @property
    def peer_names(self) -> Collection[str]:
        return self.peers.keys()

    def check_reachable(self, peer: str) -> None:
        self.peers[peer].check_reachable()

    def pending_bytes(self, peer: str) -> int:
        return self.peers[peer].view.pending_bytes()

    def held_back(self, peer: str) -> bool:
        """Nothing more waits behind a peer gone quiet (until it is heard again or
        declared unreachable)."""
        return self.peers[peer].view.silent_s(time.monotonic()) > PEER_QUIET_S

    def send(self, submission: Submission, arrived_at: float) -> int:
        header = MessageHeader(
            submission.tag,
            submission.step,
            submission.critical,
            submission.checksum,
            submission.meta,
            submission.job,
        )
        deadline_s, now = submission.deadline_s, time.monotonic()
        return self.peers[submission.peer].submit(
            header,
            submission.payload,
            deadline_at=None
            if deadline_s is None
            else now + deadline_left_s(deadline_s, now - arrived_at),
        )

    def message_state(self, peer: str, msg_id: int) -> str | None:
        return self.peers[peer].view.message_state(msg_id)

    def last_msg_id(self, peer: str) -> int:
        return self.peers[peer].view.last_msg_id

    def taken(self, delivery: Delivery) -> None:
        driver = self.peers.get(delivery.source)
        if driver is not None:
            driver.consumed(delivery.body_bytes, delivery.msg_id)

    def reset_path(self, peer: str, path: str) -> None:
        link = self.peers[peer].links.get(path)
        if link is None:
            raise GatewayError(f"path {peer}/{path} is not connected", code=ErrorCode.PATH_DOWN)
        log.warning("%s/%s: connection reset by operator", peer, path)
        link.refuse(LinkError.RESET, "reset by operator")

    # -------------------------------------------------------------- views

    def unreachable(self, peer: str) -> bool:
        return self.peers[peer].view.unreachable

    def silent_s(self, peer: str) -> float:
        return self.peers[peer].view.silent_s(time.monotonic())

    def messages_in_flight(self) -> int:
        return sum(d.view.status()["messages_in_flight"] for d in self.peers.values())

    def rows(self) -> list[PathRow]:
        now = time.monotonic()
        rows: list[PathRow] = []
        for peer in self.config.peers:
            driver = self.peers[peer.name]
            view = driver.view
            peer_state = view.peer_state(now)[0]  # one per peer, not per path
            stats = view.job_stats()
            for path in peer.paths:
                link = driver.links.get(path.name)
                row: dict[str, Any] = {
                    "peer": peer.name,
                    "path": path.name,
                    "local": link.local_address if link else (path.local or "*"),
                    "remote": link.remote_address if link else _fmt_remote(path),
                }
                jobs = {
                    job: {
                        "bytes_sent": s.bytes_sent_by_path.get(path.name, 0),
                        "datagrams_sent": s.datagrams_sent_by_path.get(path.name, 0),
                    }
                    for job, s in stats.items()
                }
                if link is not None and link.channel is not None:
                    row["data_plane"] = link.channel.stats()
                if path.name in view.path_names:
                    row.update(view.path_snapshot(path.name, now))
                    if link is None:
                        row.update(state=PathStateKind.DOWN, state_reason="not connected")
                    rows.append(PathRow.from_dict({**row, "peer_state": peer_state, "jobs": jobs}))
                else:
                    unseen = PathRow.not_connected(**row, peer_state=peer_state)
                    rows.append(dataclasses.replace(unseen, jobs=jobs))
        return rows

    def peer_status(self, peer: str, rows: list[PathRow]) -> PeerStatus:
        view = self.peers[peer].view
        return PeerStatus.from_dict(
            {
                **view.liveness(time.monotonic()),
                "paths_up": sorted(
                    r.path for r in rows if r.peer == peer and r.state != PathStateKind.DOWN
                ),
                **view.status(),
                "recent_failures": self._book.recent_failures(peer),
            }
        )

    def worker_maps(self) -> tuple[dict[str, Any], ...]:
        return ()

    def job_stats(self, peer: str) -> Mapping[str, JobSendStats]:
        return self.peers[peer].view.job_stats()


def _fmt_remote(path: PathConfig) -> str:
    return host_port(*path.remote) if path.remote else "(peer dials)"
