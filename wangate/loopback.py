"""Several sites on one machine: certificates, configs and real daemons on loopback.

Used by ``wangate demo`` and by the end-to-end tests. Site ``i`` owns the addresses
127.0.<10+i>.<p+1>, one per path ``p``; path ``p`` between two sites joins their
``p``-th addresses, so every path has its own pair of endpoints, as separate routes
would in production. The site later in the list dials; the earlier one listens.
"""

from __future__ import annotations

import contextlib
import os
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
from wangate.errors import WangateError
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
    ``count - 1`` ports after it (worker ``w`` listens on port + ``w``)."""
    for _ in range(100):
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


@dataclass
class SiteProcess:
    name: str
    config_path: Path
    socket_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def client(self) -> Client:
        return Client(self.socket_path)


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
    site (default: $WANGATE_TEST_WORKERS, else none)."""
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
        if workers > 1 and "[workers]" not in lines[-1]:
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
    """Start real gateway daemons for ``sites`` sites; stop them on exit."""

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

    def __getitem__(self, name: str) -> SiteProcess:
        for site in self.sites:
            if site.name == name:
                return site
        raise KeyError(name)

    def start(self, timeout_s: float = 20.0) -> None:
        for site in self.sites:
            site.process = self.launch(site, log_mode="wb")
        self.wait_all_paths_up(timeout_s)

    def launch(
        self, site: SiteProcess, *, log_mode: str = "ab", env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a daemon for ``site`` (its log appended to unless ``log_mode="wb"``)."""
        argv = [sys.executable, "-m", "wangate"] + (["-v"] if self.verbose else [])
        with site.log_path.open(log_mode) as log:
            return subprocess.Popen(
                [*argv, "run", "-c", str(site.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
            )

    def kill(self, name: str) -> float:
        """SIGKILL ``name``'s daemon; returns when it is gone (``time.monotonic()``)."""
        process = self[name].process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        return time.monotonic()

    def restart(self, name: str, timeout_s: float = 20.0) -> float:
        """Start ``name``'s daemon again (a new instance); returns once every path is up."""
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

    def cpu_seconds(self, site: SiteProcess) -> float:
        """User+system CPU time the site's daemon and its worker processes have used so
        far (Linux /proc; a worker that has exited is not counted)."""
        assert site.process is not None
        pid = site.process.pid
        return sum(process_cpu_s(p) for p in (pid, *_children(pid)))

    def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for site in self.sites:
            if site.process is not None and site.process.poll() is None:
                site.process.send_signal(signal.SIGTERM)
        for site in self.sites:
            if site.process is None:
                continue
            try:
                codes[site.name] = site.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                site.process.kill()
                codes[site.name] = site.process.wait()
        return codes

    def __enter__(self) -> LoopbackSites:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._own_dir and exc is None:
            shutil.rmtree(self.directory, ignore_errors=True)


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
