"""Host plumbing: environment checks, TUN devices, namespaces, process helpers.

Everything here shells out to ``ip`` (iproute2) or uses ioctls; nothing sends traffic.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import signal
import struct
import subprocess
from collections.abc import Sequence

from wangate.errors import WangateError

TUN_PATH = "/dev/net/tun"
_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_PR_SET_PDEATHSIG = 1

NAMESPACE_PREFIX = "wglab-"
NAMESPACE_RE = re.compile(r"^wglab-([0-9a-z]{1,6})-[A-Za-z_][A-Za-z0-9_]{0,7}$")
TUN_RE = re.compile(r"^wl([0-9a-z]{1,6})p\d{1,3}[ab]$")
RUN_ID_RE = re.compile(r"^[0-9a-z]{1,6}$")


class LabUnavailable(WangateError):
    """The host cannot run the lab (not root, no /dev/net/tun, no iproute2)."""


def check_environment() -> None:
    """Refuse clearly when the lab cannot run here."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the lab needs root (network namespaces and TUN devices); run as root")
    if not os.path.exists(TUN_PATH):
        problems.append(f"{TUN_PATH} is missing (load the tun module: modprobe tun)")
    elif not os.access(TUN_PATH, os.R_OK | os.W_OK):
        problems.append(f"{TUN_PATH} is not readable and writable by this user")
    try:
        subprocess.run(["ip", "-V"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        problems.append("iproute2 ('ip' command) is not installed")
    if problems:
        raise LabUnavailable("cannot start the WAN lab: " + "; ".join(problems))


def environment_problem() -> str | None:
    """The refusal message, or None when the lab can run (for test skips)."""
    try:
        check_environment()
    except LabUnavailable as exc:
        return str(exc)
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise WangateError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def open_tun(name: str) -> int:
    """Create a TUN device (IP packets, no packet-info header); returns its fd."""
    fd = os.open(TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def list_namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    out = ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def namespace_pids(namespace: str) -> list[int]:
    out = ip("netns", "pids", namespace, check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def sysctl_in(namespace: str, settings: dict[str, str]) -> None:
    argv = ["ip", "netns", "exec", namespace, "sysctl", "-q", "-w"]
    argv += [f"{key}={value}" for key, value in settings.items()]
    subprocess.run(argv, check=False, capture_output=True)


def die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the process that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def terminate(
    processes: Sequence[subprocess.Popen[bytes] | subprocess.Popen[str]], grace_s: float = 2.0
) -> None:
    """SIGTERM each still-running process, then SIGKILL whatever outlives the grace time."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill_pid(pid: int, grace_s: float = 2.0) -> None:
    """Terminate one process by id (used for leftovers of crashed runs)."""
    import time

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
