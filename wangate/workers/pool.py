"""The coordinator's side of one worker process: spawn, channel, exit, restart.

A worker that exits (killed, crashed, or its channel carried a bad packet) is noticed
at once: its end of the socketpair closes, so the channel reads end of file. The
handle then reaps it and tells the coordinator, which starts it again and re-sends
what it held (wangate.workers.coordinator).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wangate.errors import ErrorCode, GatewayError
from wangate.shm import close_all
from wangate.workers.channel import Channel

log = logging.getLogger("wangate.workers")

STOP_TIMEOUT_S = 5.0
EXIT_WAIT_S = 0.5

OnMessage = Callable[["WorkerHandle", str, dict[str, Any], list[int]], None]
OnGone = Callable[["WorkerHandle", str], None]


class WorkerHandle:
    """Worker ``index``: its process, its channel, what it holds."""

    def __init__(
        self,
        index: int,
        config_path: Path,
        log_level: str,
        on_message: OnMessage,
        on_gone: OnGone,
        instance: int = 0,
    ) -> None:
        self.index = index
        self._instance = instance
        self._config_path = config_path
        self._log_level = log_level
        self._on_message = on_message
        self._on_gone = on_gone
        self.generation = 0  # one per process started: packets of an old one are ignored
        self.process: subprocess.Popen[bytes] | None = None
        self.channel: Channel | None = None
        self.ready: asyncio.Future[int] | None = None  # the worker's pid, once it listens
        self.pid: int | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.started = False  # the coordinator is up: an exit from now on means a restart
        self.stripes: set[int] = set()  # stripe ids it holds, not confirmed yet
        self.queued_bytes = 0  # their payload bytes
        self.report: dict[str, Any] | None = None  # its last report (rows, status, cpu)
        self.cpu_s_before = 0.0  # CPU of its earlier processes (restarts)

    @property
    def cpu_s(self) -> float:
        now = float(self.report["cpu_s"]) if self.report else 0.0
        return self.cpu_s_before + now

    def spawn(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "wangate.workers.worker",
                    "--config",
                    str(self._config_path),
                    "--index",
                    str(self.index),
                    "--fd",
                    str(child.fileno()),
                    "--log-level",
                    self._log_level,
                    "--instance",
                    str(self._instance),
                ],
                pass_fds=[child.fileno()],
            )
        except OSError as exc:
            parent.close()
            raise GatewayError(
                f"cannot start worker {self.index}: {exc}", code=ErrorCode.STARTUP
            ) from None
        finally:
            child.close()
        self.generation += 1
        generation = self.generation
        self.started_at = time.monotonic()
        self.pid = self.process.pid
        if self.report is not None:
            self.cpu_s_before += float(self.report["cpu_s"])
        self.report = None
        self.ready = asyncio.get_running_loop().create_future()
        self.channel = Channel(
            parent,
            lambda kind, fields, fds: self._message(generation, kind, fields, fds),
            lambda reason: self._closed(generation, reason),
        )

    def send(self, kind: str, fields: dict[str, Any], fds: list[int] | None = None) -> None:
        if self.channel is None:
            close_all(fds or [])
            return
        self.channel.send(kind, fields, fds)

    def _message(self, generation: int, kind: str, fields: dict[str, Any], fds: list[int]) -> None:
        if generation != self.generation:
            close_all(fds)
            return
        if kind == "ready":
            if self.ready is not None and not self.ready.done():
                self.ready.set_result(fields["pid"])
            return
        self._on_message(self, kind, fields, fds)

    def fail(self, reason: str) -> None:
        """The worker sent what it must not: end it (the coordinator restarts it)."""
        if self.channel is not None:
            self.channel.close()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self._closed(self.generation, reason)

    def _closed(self, generation: int, reason: str) -> None:
        if generation != self.generation:
            return
        process = self.process
        code = None
        if process is not None:
            try:  # its socket closes as it exits: its exit status is a moment away
                code = process.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:  # alive, its channel closed or wrong: end it
                process.kill()
                code = process.wait()
        self.channel = None
        why = f"{reason}; exit code {code}" if reason == "end of file" else reason
        if not self.started and self.ready is not None and not self.ready.done():
            self.ready.set_exception(
                GatewayError(
                    f"worker {self.index} exited while starting ({why}); its log lines above "
                    "say why",
                    code=ErrorCode.STARTUP,
                )
            )
            self.ready.exception()  # retrieved: the coordinator may not be waiting yet
            return
        self._on_gone(self, why)

    async def stop(self) -> None:
        """End the worker (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``)."""
        self.generation += 1  # its exit is expected: no restart
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.run_in_executor(None, process.wait), STOP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await loop.run_in_executor(None, process.wait)
