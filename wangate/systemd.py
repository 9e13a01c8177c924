"""The daemon's side of systemd: readiness, status, the watchdog, inherited sockets.

Speaks the sd_notify(3) datagram protocol and the sd_listen_fds(3) environment
convention directly (no libsystemd). Everything here is a no-op outside systemd:
without ``NOTIFY_SOCKET`` nothing is sent, without ``LISTEN_FDS`` nothing is inherited.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("wangate.systemd")

SD_LISTEN_FDS_START = 3  # sd_listen_fds(3): inherited descriptors start here
STATUS_INTERVAL_S = 1.0  # how often STATUS= is refreshed when it changed


def _notify_address(environ: Mapping[str, str]) -> str | None:
    address = environ.get("NOTIFY_SOCKET")
    if not address:
        return None
    if address.startswith("@"):  # abstract namespace
        return "\0" + address[1:]
    return address


def sd_notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send one notification to systemd; False when not under systemd or it failed."""
    address = _notify_address(os.environ if environ is None else environ)
    if address is None:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError as exc:
            log.debug("sd_notify to %s failed: %s", address, exc)
            return False
    return True


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """Half of ``WATCHDOG_USEC`` (sd_watchdog_enabled(3)), or None when there is none.

    ``WATCHDOG_PID``, when set, must be ours: the variable may have leaked from a parent.
    """
    env = os.environ if environ is None else environ
    usec_text = env.get("WATCHDOG_USEC")
    if not usec_text:
        return None
    pid_text = env.get("WATCHDOG_PID")
    if pid_text and pid_text != str(os.getpid()):
        return None
    try:
        usec = int(usec_text)
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not a number", usec_text)
        return None
    if usec <= 0:
        return None
    return usec / 2e6


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, as ``RELOADING=1`` wants it (systemd >= 253)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Notifier:
    """Keeps systemd informed for the daemon's lifetime.

    The watchdog ping is a callback on the event loop, never a thread: if the loop is
    stuck, the pings stop and systemd's ``WatchdogSec=`` takes the daemon down.
    """

    def __init__(
        self, status_line: Callable[[], str], environ: Mapping[str, str] | None = None
    ) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._status_line = status_line
        self._last_status: str | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._status_timer: asyncio.TimerHandle | None = None
        self.watchdog_s = watchdog_interval_s(self._environ)
        self.enabled = _notify_address(self._environ) is not None

    def send(self, message: str) -> bool:
        return sd_notify(message, self._environ) if self.enabled else False

    def start(self) -> None:
        """READY=1 with the first STATUS=; then the watchdog and status refreshes."""
        if not self.enabled:
            return
        self._last_status = self._status_line()
        self.send(f"READY=1\nSTATUS={self._last_status}")
        loop = asyncio.get_running_loop()
        if self.watchdog_s is not None:
            log.info("systemd watchdog: pinging every %.3g s", self.watchdog_s)
            self._watchdog = loop.call_later(self.watchdog_s, self._ping)
        self._status_timer = loop.call_later(STATUS_INTERVAL_S, self._refresh)

    def _ping(self) -> None:
        self.send("WATCHDOG=1")
        self._watchdog = asyncio.get_running_loop().call_later(self.watchdog_s or 1.0, self._ping)

    def _refresh(self) -> None:
        self.update_status()
        self._status_timer = asyncio.get_running_loop().call_later(STATUS_INTERVAL_S, self._refresh)

    def update_status(self) -> None:
        """Send STATUS= now if the line changed since it was last sent."""
        if not self.enabled:
            return
        line = self._status_line()
        if line != self._last_status:
            self._last_status = line
            self.send(f"STATUS={line}")

    def reloading(self) -> None:
        self.send(f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}\nSTATUS=reloading")
        self._last_status = "reloading"

    def reloaded(self) -> None:
        self._last_status = self._status_line()
        self.send(f"READY=1\nSTATUS={self._last_status}")

    def stopping(self) -> None:
        self.send("STOPPING=1\nSTATUS=shutting down")
        self.stop()

    def stop(self) -> None:
        for handle in (self._watchdog, self._status_timer):
            if handle is not None:
                handle.cancel()
        self._watchdog = self._status_timer = None


def inherited_unix_listener(
    path: os.PathLike[str] | str, environ: Mapping[str, str] | None = None
) -> socket.socket | None:
    """The listening Unix socket systemd passed for ``path`` (socket activation), if any.

    Follows sd_listen_fds(3): ``LISTEN_PID`` must be ours, descriptors start at 3.
    Only a stream socket bound to ``path`` is taken; anything else is left alone.
    """
    env = os.environ if environ is None else environ
    if env.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    wanted = os.fsdecode(os.fspath(path))
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        if (
            sock.family == socket.AF_UNIX
            and sock.type == socket.SOCK_STREAM
            and sock.getsockname() == wanted
        ):
            os.set_inheritable(fd, False)
            sock.setblocking(False)
            log.info("using the socket systemd passed for %s", wanted)
            return sock
        sock.detach()  # not ours to close
    return None
