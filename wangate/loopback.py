"""Several sites on one machine: certificates, configs and real daemons on loopback.

Used by ``wangate demo`` and by the end-to-end tests. Site ``i`` owns the addresses
127.0.<10+i>.<p+1>, one per path ``p``; path ``p`` between two sites joins their
``p``-th addresses, so every path has its own pair of endpoints, as separate routes
would in production. The site later in the list dials; the earlier one listens.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from wangate.certs import create_ca, issue_site_certificate
from wangate.client import Client
from wangate.errors import LocalProtocolError, WangateError
from wangate.rows import PathRow

SITE_NAMES = ("bj", "sh", "gz", "sz", "hz", "cd")
PATH_NAMES = ("fiber-a", "fiber-b", "fiber-c", "wave-d")


def site_address(site_index: int, path_index: int) -> str:
    return f"127.0.{10 + site_index}.{path_index + 1}"


# the tests run the integration suite again with worker processes: WANGATE_TEST_WORKERS=2
TEST_WORKERS_ENV = "WANGATE_TEST_WORKERS"


def test_workers() -> int:
    """The ``[workers] count`` the loopback sites get (1: none, the default)."""
    return int(os.environ.get(TEST_WORKERS_ENV, "1") or 1)


def free_udp_port(addresses: list[str], count: int = 1) -> int:
    """A port free on every one of ``addresses`` (checked by binding them all), with the
    ``count - 1`` ports after it (worker ``w`` listens on port + ``w``).

    Below the kernel's ephemeral range: a dialing socket (bound to port 0) never takes
    one of them between this check and a worker's bind, as it could inside the range."""
    low, _high = _ephemeral_ports()
    first, last = max(1024, low - 12000), low - count
    rng = random.Random()
    for _ in range(100):
        if first < last:
            port = rng.randrange(first, last)
        else:  # no room below the range: let the kernel choose
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.bind((addresses[0], 0))
                port = int(probe.getsockname()[1])
        socks = []
        try:
            for address in addresses:
                for offset in range(count):
                    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    socks.append(s)
                    s.bind((address, port + offset))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise WangateError("no free UDP port on loopback")


def _ephemeral_ports() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(n) for n in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


@dataclass
class SiteProcess:
    name: str
    config_path: Path
    socket_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def client(self, job: str | None = None) -> Client:
        return Client(self.socket_path, job=job)


def write_site_configs(
    directory: Path,
    sites: int,
    paths: int,
    *,
    mtu: int = 9000,
    extra_toml: str | Mapping[str, str] = "",
    workers: int | None = None,
) -> list[SiteProcess]:
    """Certificates and one config per site; ``extra_toml`` is added to every config, or
    per site name when it is a mapping. ``workers``: the ``[workers] count`` of every
    site (default: $WANGATE_TEST_WORKERS, else 1: no workers, whatever the host has)."""
    if not 2 <= sites <= len(SITE_NAMES) or not 1 <= paths <= len(PATH_NAMES):
        raise WangateError(f"sites must be 2..{len(SITE_NAMES)} and paths 1..{len(PATH_NAMES)}")
    certs = directory / "certs"
    create_ca(certs)
    names = SITE_NAMES[:sites]
    ports = {}
    workers = test_workers() if workers is None else workers
    for i, name in enumerate(names):
        issue_site_certificate(certs, name)
        ports[name] = free_udp_port([site_address(i, p) for p in range(paths)], workers)
    result = []
    for i, name in enumerate(names):
        listen = ", ".join(f'"{site_address(i, p)}:{ports[name]}"' for p in range(paths))
        lines = [
            "[site]",
            f'name = "{name}"',
            f'socket = "{name}.sock"',
            f"listen = [{listen}]",
            "",
            "[tls]",
            'ca = "certs/ca.pem"',
            f'cert = "certs/{name}.pem"',
            f'key = "certs/{name}.key"',
            "",
            extra_toml if isinstance(extra_toml, str) else extra_toml.get(name, ""),
        ]
        if "[workers]" not in lines[-1]:  # always: the daemon's default follows the host
            lines += ["[workers]", f"count = {workers}", ""]
        for j, peer in enumerate(names):
            if peer == name:
                continue
            lines += ["[[peers]]", f'name = "{peer}"']
            for p in range(paths):
                lines += ["[[peers.paths]]", f'name = "{PATH_NAMES[p]}"']
                lines.append(f'local = "{site_address(i, p)}"')
                if i > j:  # the later site dials
                    lines.append(f'remote = "{site_address(j, p)}:{ports[peer]}"')
                lines.append(f"mtu = {mtu}")
            lines.append("")
        config = directory / f"{name}.toml"
        config.write_text("\n".join(lines))
        result.append(
            SiteProcess(name, config, directory / f"{name}.sock", directory / f"{name}.log")
        )
    return result


class LoopbackSites:
    """Real gateway daemons for ``sites`` sites, every one of them stopped afterwards.

    ``with LoopbackSites(...) as lab:`` starts the daemons and stops them when the block
    ends, however it ends (an exception, KeyboardInterrupt); without a with-block, call
    :meth:`start` and then :meth:`close`. Daemons still running when the interpreter
    exits are stopped then (atexit). The daemons run once at a time: :meth:`start`
    while they run (inside the with-block, say) raises :class:`LocalProtocolError`, as
    :meth:`restart` of a site whose daemon runs does, rather than start a second set on
    the same ports; after :meth:`stop` they may start again.
    """

    def __init__(
        self,
        sites: int = 2,
        paths: int = 3,
        *,
        directory: Path | None = None,
        mtu: int = 9000,
        extra_toml: str | Mapping[str, str] = "",
        verbose: bool = True,
        workers: int | None = None,
    ) -> None:
        self._own_dir = directory is None
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="wangate-"))
        self.directory = directory
        self.workers = test_workers() if workers is None else workers
        self.sites = write_site_configs(
            directory, sites, paths, mtu=mtu, extra_toml=extra_toml, workers=self.workers
        )
        self.paths = paths
        self.verbose = verbose
        # every daemon launched and not yet stopped, replaced handles included (restart)
        self._launched: list[subprocess.Popen[bytes]] = []

    def __getitem__(self, name: str) -> SiteProcess:
        for site in self.sites:
            if site.name == name:
                return site
        raise KeyError(name)

    def start(self, timeout_s: float = 20.0) -> None:
        """Start every site's daemon; returns once every path is up. Should that fail,
        the daemons it started are stopped before the error is raised."""
        if any(p.poll() is None for p in self._launched):
            raise LocalProtocolError(
                "the loopback daemons are already running (`with LoopbackSites(...)` "
                "starts them): call start() only without a with-block, or after stop()"
            )
        try:
            for site in self.sites:
                site.process = self.launch(site, log_mode="wb")
            self.wait_all_paths_up(timeout_s)
        except BaseException:
            self.stop()
            raise

    def launch(
        self, site: SiteProcess, *, log_mode: str = "ab", env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a daemon for ``site`` (its log appended to unless ``log_mode="wb"``)."""
        argv = self.daemon_command()
        if not self._launched:
            atexit.register(self.close)  # for a lab nobody closes; stop() unregisters it
        with site.log_path.open(log_mode) as log:
            process = subprocess.Popen(
                [*argv, "run", "-c", str(site.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
            )
        self._launched.append(process)
        return process

    def daemon_command(self) -> list[str]:
        """The daemon's command line before ``run -c CONFIG``."""
        return [sys.executable, "-m", "wangate"] + (["-v"] if self.verbose else [])

    def kill(self, name: str) -> float:
        """SIGKILL ``name``'s daemon; returns when it is gone (``time.monotonic()``)."""
        process = self[name].process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        return time.monotonic()

    def restart(self, name: str, timeout_s: float = 20.0) -> float:
        """Start ``name``'s daemon again (a new instance); returns once every path is up."""
        process = self[name].process
        if process is not None and process.poll() is None:
            raise LocalProtocolError(f"{name}'s daemon is still running: kill it first")
        self[name].process = self.launch(self[name])
        self.wait_all_paths_up(timeout_s)
        return time.monotonic()

    def wait_all_paths_up(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        # one row per path and worker
        expected = self.paths * (len(self.sites) - 1) * self.workers
        for site in self.sites:
            while True:
                up = 0
                with contextlib.suppress(WangateError, OSError), site.client() as gw:
                    up = sum(1 for row in PathRow.from_dicts(gw.paths()) if row.state != "down")
                if up == expected:
                    break
                if site.process is not None and site.process.poll() is not None:
                    raise WangateError(f"{site.name} exited: {self.log_tail(site)}")
                if time.monotonic() > deadline:
                    raise WangateError(
                        f"{site.name}: {up} of {expected} paths up after {timeout_s} s\n"
                        + self.log_tail(site)
                    )
                time.sleep(0.1)

    def log_tail(self, site: SiteProcess, lines: int = 30) -> str:
        try:
            return "\n".join(site.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def pids(self, site: SiteProcess) -> list[int]:
        """The site's daemon first, then its worker processes (Linux /proc)."""
        assert site.process is not None
        pid = site.process.pid
        return [pid, *_children(pid)]

    def cpu_seconds(self, site: SiteProcess) -> float:
        """User+system CPU time the site's daemon and its worker processes have used so
        far (Linux /proc; a worker that has exited is not counted)."""
        return sum(process_cpu_s(p) for p in self.pids(site))

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every daemon launched (SIGKILL to one still there 10 s later) and wait
        for them; returns each site's exit status. Workers go with their daemon."""
        launched = self._launched
        for process in launched:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        try:
            for process in launched:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
        finally:  # a stop interrupted (KeyboardInterrupt) still leaves none running
            for process in launched:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        launched.clear()
        atexit.unregister(self.close)
        return {s.name: s.process.returncode for s in self.sites if s.process is not None}

    def close(self) -> None:
        """Stop the daemons and remove the directory, if this lab made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LoopbackSites:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:
            self.stop()  # the configs and logs stay to be read


def process_cpu_s(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:  # exited since it was listed
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (its workers), from every thread's children list."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(FileNotFoundError):
            found.extend(int(c) for c in children.read_text().split())
    return found
