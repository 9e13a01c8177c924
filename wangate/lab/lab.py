"""The Lab: one run's namespaces, TUN pairs and forwarders, set up and torn down safely.

    with Lab(load_scenario("multipath_clean3"), run_id="t1") as lab:
        receiver = lab.run_in("sh", ["python", "-m", "something"])
        lab.start_timeline()

Names are per run: namespaces ``wglab-<run>-<site>``, TUN devices ``wl<run>p<n>a|b``.
Teardown runs on normal exit, on exceptions, on SIGINT/SIGTERM/SIGHUP and at
interpreter exit; ``python -m wangate.lab cleanup`` removes what a killed run left.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from wangate.errors import WangateError
from wangate.lab import netns
from wangate.lab.scenario import PathSpec, Scenario

STATE_ROOT = Path("/run/wglab")
GATEWAY_PORT = 7443


@dataclass(frozen=True)
class PathAddress:
    """One path seen from a site: bind ``local``, send to ``remote``."""

    path: str
    peer: str
    local: str
    remote: str
    mtu: int


class Lab:
    def __init__(
        self, scenario: Scenario, run_id: str | None = None, state_root: Path = STATE_ROOT
    ) -> None:
        self.scenario = scenario
        self.run_id = run_id or secrets.token_hex(3)
        if not netns.RUN_ID_RE.match(self.run_id):
            raise WangateError(f"run id {self.run_id!r}: use 1-6 characters of [0-9a-z]")
        self.state_dir = state_root / self.run_id
        self._forwarders: dict[str, subprocess.Popen[str]] = {}
        self._children: list[subprocess.Popen[bytes]] = []
        self._namespaces: list[str] = []
        self._closed = False
        self._old_handlers: dict[int, Any] = {}
        self.final_stats: dict[str, Any] = {}

    # -- naming ---------------------------------------------------------------
    def namespace(self, site: str) -> str:
        if site not in self.scenario.sites:
            raise KeyError(f"no site named {site!r}")
        return f"{netns.NAMESPACE_PREFIX}{self.run_id}-{site}"

    def tun_name(self, path: PathSpec, end: str) -> str:
        return f"wl{self.run_id}p{path.index}{end}"

    def site_addresses(self, site: str) -> list[PathAddress]:
        """Every path that ends at ``site``, with the addresses to bind and to reach."""
        result = []
        for path in self.scenario.paths:
            if site in path.sites():
                peer = path.site_b if site == path.site_a else path.site_a
                result.append(
                    PathAddress(
                        path.name, peer, path.address_of(site), path.address_of(peer), path.mtu
                    )
                )
        return result

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        netns.check_environment()
        taken = [
            n
            for n in netns.list_namespaces()
            if n.startswith(f"{netns.NAMESPACE_PREFIX}{self.run_id}-")
        ]
        if taken or self.state_dir.exists():
            what = ", ".join(taken) or str(self.state_dir)
            raise WangateError(
                f"run id {self.run_id!r} is in use ({what}); pick another "
                "or run 'python -m wangate.lab cleanup'"
            )
        self._install_signal_handlers()
        atexit.register(self.close)
        try:
            self.state_dir.mkdir(parents=True)
            (self.state_dir / "owner.pid").write_text(f"{os.getpid()}\n")
            for site in self.scenario.sites:
                self._add_namespace(self.namespace(site))
            for path in self.scenario.paths:
                self._add_path(path)
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, name: str) -> None:
        netns.ip("netns", "add", name)
        self._namespaces.append(name)
        netns.ip("-n", name, "link", "set", "lo", "up")
        # No IPv6 chatter (router solicitations, MLD) on the emulated links.
        netns.sysctl_in(
            name, {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
        )

    def _add_path(self, path: PathSpec) -> None:
        fds = []
        try:
            for end, site in (("a", path.site_a), ("b", path.site_b)):
                device = self.tun_name(path, end)
                fds.append(netns.open_tun(device))
                namespace = self.namespace(site)
                netns.ip("link", "set", "dev", device, "netns", namespace)
                netns.ip(
                    "-n", namespace, "addr", "add", f"{path.address_of(site)}/30", "dev", device
                )
                netns.ip("-n", namespace, "link", "set", "dev", device, "mtu", str(path.mtu), "up")
            self._start_forwarder(path, fds[0], fds[1])
        finally:
            for fd in fds:
                os.close(fd)  # the forwarder holds its own copies

    def _start_forwarder(self, path: PathSpec, fd_a: int, fd_b: int) -> None:
        timeline = [
            (event.at_s, event.direction, event.changes)
            for event in self.scenario.timeline
            if event.path == path.name
        ]
        spec = {
            "path": path.name,
            "fd_a": fd_a,
            "fd_b": fd_b,
            "seed": self.scenario.seed,
            "a_to_b": asdict(path.a_to_b),
            "b_to_a": asdict(path.b_to_a),
            "timeline": timeline,
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "wangate.lab.forwarder", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(fd_a, fd_b),
            preexec_fn=netns.die_with_parent,
            cwd=_repo_root(),
        )
        self._forwarders[path.name] = process
        self._record_pid(process.pid)

    def _record_pid(self, pid: int) -> None:
        # With its start time, so cleanup never signals a process that reused the id.
        with open(self.state_dir / "pids", "a") as handle:
            handle.write(f"{pid} {_start_time(pid)}\n")

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[signum] = signal.signal(signum, on_signal)

    def close(self) -> None:
        """Stop everything this run started and remove its namespaces. Idempotent."""
        if self._closed:
            return
        self._closed = True
        in_main = threading.current_thread() is threading.main_thread()
        # A second Ctrl-C must not cut the teardown short and leave namespaces behind.
        old_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
        try:
            netns.terminate(self._children)
            for name, process in self._forwarders.items():
                self.final_stats[name] = self._stop_forwarder(process)
            for namespace in self._namespaces:
                for pid in netns.namespace_pids(namespace):
                    netns.kill_pid(pid)
                netns.ip("netns", "del", namespace, check=False)
            shutil.rmtree(self.state_dir, ignore_errors=True)
        finally:
            for signum, handler in self._old_handlers.items():
                signal.signal(signum, handler)
            if in_main:
                signal.signal(signal.SIGINT, old_sigint)
            atexit.unregister(self.close)

    @staticmethod
    def _stop_forwarder(process: subprocess.Popen[str]) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        if process.poll() is None:
            try:
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write("quit\n")
                process.stdin.flush()
                line = process.stdout.readline()
                stats = json.loads(line) if line else {}
                process.wait(timeout=2.0)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        netns.terminate([process])
        return stats

    # -- use ------------------------------------------------------------------
    def run_in(self, site: str, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``site``'s namespace; it is stopped when the lab closes."""
        popen_kwargs.setdefault("cwd", _repo_root())
        process: subprocess.Popen[bytes] = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace(site), *argv],
            preexec_fn=netns.die_with_parent,
            **popen_kwargs,
        )
        self._children.append(process)
        self._record_pid(process.pid)
        return process

    def _ask(self, process: subprocess.Popen[str], command: str) -> dict[str, Any]:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(command + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            raise WangateError("a link forwarder exited unexpectedly")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def start_timeline(self, t0: float | None = None) -> float:
        """Reset every link to its initial parameters and play the timeline from ``t0``."""
        t0 = time.monotonic() if t0 is None else t0
        for process in self._forwarders.values():
            self._ask(process, f"start {t0!r}")
        return t0

    def link_stats(self) -> dict[str, Any]:
        """Counters per path and direction, and each forwarder's CPU seconds."""
        return {name: self._ask(p, "stats") for name, p in self._forwarders.items()}

    def forwarder_pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._forwarders.items()}

    # -- gateway hook ---------------------------------------------------------
    def write_gateway_configs(self, port: int = GATEWAY_PORT) -> dict[str, Path]:
        """A wangate config per site (the shape of conf/ and the README), with a fresh CA and
        site certificates."""
        from wangate.lab.certs import write_site_certificates

        directory = self.state_dir / "gateway"
        ca, site_files = write_site_certificates(directory / "certs", list(self.scenario.sites))
        configs = {}
        for site in self.scenario.sites:
            lines = [
                "[site]",
                f'name = "{site}"',
                f'socket = "{directory / (site + ".sock")}"',
                f'listen = ["0.0.0.0:{port}"]',
                "",
                "[tls]",
                f'ca = "{ca}"',
                f'cert = "{site_files[site][0]}"',
                f'key = "{site_files[site][1]}"',
                "",
            ]
            by_peer: dict[str, list[PathAddress]] = {}
            for address in self.site_addresses(site):
                by_peer.setdefault(address.peer, []).append(address)
            for peer, addresses in by_peer.items():
                lines += ["[[peers]]", f'name = "{peer}"']
                for address in addresses:
                    lines += [
                        "[[peers.paths]]",
                        f'name = "{address.path}"',
                        f'local = "{address.local}"',
                        f'remote = "{address.remote}:{port}"',
                        f"mtu = {address.mtu}",
                    ]
                lines.append("")
            lines.append(self.scenario.gateway_config)
            config = directory / f"{site}.toml"
            config.write_text("\n".join(lines))
            configs[site] = config
        return configs

    def start_gateways(
        self, command: str, port: int = GATEWAY_PORT, **popen_kwargs: Any
    ) -> dict[str, subprocess.Popen[bytes]]:
        """Run ``command`` in every site; ``{config}``, ``{site}``, ``{socket}`` and
        ``{rundir}`` are replaced (e.g. ``.venv/bin/wangate run -c {config}``)."""
        import shlex

        configs = self.write_gateway_configs(port)
        started = {}
        for site, config in configs.items():
            values = {
                "config": str(config),
                "site": site,
                "rundir": str(self.state_dir),
                "socket": str(config.with_suffix(".sock")),
            }
            argv = [word.format(**values) for word in shlex.split(command)]
            started[site] = self.run_in(site, argv, **popen_kwargs)
        return started

    def gateway_socket(self, site: str) -> Path:
        return self.state_dir / "gateway" / f"{site}.sock"


def _repo_root() -> str:
    """The folder holding this ``wangate`` package: a child's ``python -m wangate...``
    run from there imports the same code as the lab's owner."""
    return str(Path(__file__).resolve().parent.parent.parent)


def cleanup(state_root: Path = STATE_ROOT) -> list[str]:
    """Remove namespaces, devices and processes of runs whose owner process is gone."""
    removed: list[str] = []
    live_runs = set()
    if state_root.exists():
        for state_dir in state_root.iterdir():
            owner = _read_pids(state_dir / "owner.pid")
            if owner and _alive(owner[0]):
                live_runs.add(state_dir.name)
                continue
            for pid, started in _read_pid_records(state_dir / "pids"):
                if _alive(pid) and _start_time(pid) == started:
                    netns.kill_pid(pid)
                    removed.append(f"process {pid}")
            shutil.rmtree(state_dir, ignore_errors=True)
    for namespace in netns.list_namespaces():
        match = netns.NAMESPACE_RE.match(namespace)
        if match and match.group(1) not in live_runs:
            for pid in netns.namespace_pids(namespace):
                netns.kill_pid(pid)
                removed.append(f"process {pid}")
            netns.ip("netns", "del", namespace, check=False)
            removed.append(f"namespace {namespace}")
    for link in netns.list_links():
        match = netns.TUN_RE.match(link)
        if match and match.group(1) not in live_runs:
            netns.ip("link", "del", link, check=False)
            removed.append(f"device {link}")
    return removed


def _read_pid_records(file: Path) -> list[tuple[int, str]]:
    try:
        lines = file.read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        words = line.split()
        if len(words) == 2 and words[0].isdigit():
            records.append((int(words[0]), words[1]))
    return records


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[19]


def _read_pids(file: Path) -> list[int]:
    try:
        return [int(tok) for tok in file.read_text().split() if tok.isdigit()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
