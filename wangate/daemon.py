"""The gateway daemon: one site's parts, composed.

``Gateway`` builds and owns them (ARCHITECTURE.md has the map):

- a backend that moves messages: ``DriverBackend`` (every peer driven in this
  process; its ``Endpoint`` listens, dials, authenticates and attaches links) or,
  with ``[workers] count >= 2``, a ``Coordinator`` of worker processes;
- ``TrainerDelivery``: what arrived, for the trainers' ``recv``;
- ``OutcomeBook``: what became of what was sent;
- ``Service``: the service to trainers, written once over the backend;
- the local API server (the trainers' Unix socket) and the metrics endpoint.

A trainer's message goes server -> ``Service.submit`` -> backend -> ``PeerDriver`` ->
session -> link; what arrives goes link -> driver -> session -> ``TrainerDelivery``
-> ``Service.receive`` -> server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random

from wangate.config import Config
from wangate.delivery.trainers import TrainerDelivery
from wangate.errors import GatewayError
from wangate.gateway.backend import Backend
from wangate.gateway.drivers import DriverBackend
from wangate.gateway.endpoint import startup_error
from wangate.gateway.outcomes import OutcomeBook
from wangate.gateway.service import Service
from wangate.localapi.server import LocalApiServer
from wangate.metrics import GatewayCollector, GatewayMetrics
from wangate.metrics import render as render_metrics
from wangate.metrics_http import MetricsServer
from wangate.net.address import host_port
from wangate.net.peer_driver import PeerDriver
from wangate.reload import ReloadPlan
from wangate.systemd import inherited_unix_listener
from wangate.workers.stripes import refuse_stripes

log = logging.getLogger("wangate.daemon")


class Gateway:
    """One site's gateway: ``workers`` worker processes (1: none, every peer driven in
    this process)."""

    def __init__(self, config: Config, workers: int = 1) -> None:
        self.config = config
        self.instance_id = random.getrandbits(63) | 1
        self.metrics = GatewayMetrics()  # fed by the service and the backend
        self.delivery = TrainerDelivery(config.limits.peer_inbox_bytes)
        self.book = OutcomeBook()
        self.backend: Backend
        if workers >= 2:
            from wangate.workers.coordinator import Coordinator

            self.backend = Coordinator(
                config, workers, self.delivery, self.book, self.metrics, self.instance_id
            )
        else:
            self.backend = DriverBackend(
                config,
                sink=self.delivery,
                book=self.book,
                metrics=self.metrics,
                instance_id=self.instance_id,
                startup_error=self.startup_error,
                # a worker's sessions carry stripes; this gateway refuses them (its
                # trainers would get a part of a message: the peer runs workers)
                screen=refuse_stripes,
            )
        self.service = Service(config, self.backend, self.delivery, self.book)
        self._local_api: LocalApiServer | None = None
        self._metrics_server: MetricsServer | None = None

    @property
    def peers(self) -> dict[str, PeerDriver]:
        """The peer drivers of a gateway without workers."""
        if not isinstance(self.backend, DriverBackend):
            raise TypeError("a gateway with workers drives its peers in the workers")
        return self.backend.peers

    # ----------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self.backend.start()
        await self._start_local()

    async def _start_local(self) -> None:
        """The local API for trainers, and the metrics endpoint."""
        config = self.config
        self._local_api = LocalApiServer(
            self.service,
            config.site.socket,
            max_message_bytes=config.limits.max_message_bytes,
            client_budget_bytes=config.limits.client_budget_bytes,
            socket_mode=config.site.socket_mode,
            listener=inherited_unix_listener(config.site.socket),
            allow_uids=config.site.allow_uids,
            allow_gids=config.site.allow_gids,
            max_connections=config.limits.max_local_connections,
        )
        try:
            await self._local_api.start()
        except GatewayError as exc:
            raise self.startup_error("site.socket", str(exc)) from None
        log.info("site %s: trainers connect at %s", config.site.name, config.site.socket)
        if config.metrics.listen is not None:
            collector = GatewayCollector(self.metrics, self.service.rows_and_status)
            self._metrics_server = MetricsServer(lambda: render_metrics(collector))
            try:
                await self._metrics_server.start(*config.metrics.listen)
            except GatewayError as exc:
                cause = exc.__cause__
                if not isinstance(cause, OSError):
                    raise self.startup_error("metrics.listen", str(exc)) from None
                where = host_port(*config.metrics.listen)
                raise self.startup_error(
                    "metrics.listen", f"cannot listen on {where}", cause
                ) from None

    def startup_error(self, key: str, what: str, exc: OSError | None = None) -> GatewayError:
        return startup_error(self.config.path, key, what, exc)

    async def close(self) -> None:
        await self.backend.close()
        self.delivery.close()
        if self._local_api is not None:
            await self._local_api.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()
        await asyncio.sleep(0)  # let the close frames go out

    # -------------------------------------------------------------- reload

    def apply_reload(self, plan: ReloadPlan) -> None:
        self.config = self.service.config = plan.effective
        self.backend.apply_reload(plan)

    def status_counts(self) -> tuple[int, int, int, int, int]:
        return self.service.status_counts()


def make_gateway(config: Config) -> Gateway:
    """The daemon for ``config``: one process, or a coordinator of worker processes
    (``[workers] count``; by default from the host's cores and the paths)."""
    paths = max((len(peer.paths) for peer in config.peers), default=1)
    return Gateway(config, workers=config.workers.resolved(os.cpu_count(), paths))
