"""The local API's socket file: bound with its mode from its first appearance, a stale
one replaced, and enough file descriptors for the connections it will take."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import socket
import stat
from pathlib import Path

from wangate.errors import ErrorCode, GatewayError

log = logging.getLogger("wangate.localapi")


def ensure_file_limit(needed: int) -> None:
    """Raise the soft RLIMIT_NOFILE to ``needed`` if the hard limit allows: the
    connection cap, not EMFILE, should be what turns trainers away."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        target = soft
        log.warning("cannot raise the open-file limit to %d: %s", needed, exc)
    if target < needed:
        log.warning(
            "the open-file limit (%d) is below what max_local_connections needs (%d): "
            "raise LimitNOFILE or lower the cap",
            target,
            needed,
        )


def bind_unix_socket(path: Path, mode: int) -> socket.socket:
    """Listen on ``path`` with file mode ``mode`` from its first appearance.

    The socket is bound under a temporary name, chmod-ed, then renamed into place, so
    no client ever sees it with the umask's mode. A leftover socket file is replaced
    only when nothing answers on it.
    """
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise GatewayError(
                f"{path} exists and is not a socket; not replacing it", code=ErrorCode.SOCKET_IN_USE
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(os.fspath(path))
        except ConnectionRefusedError:
            os.unlink(path)  # stale: its daemon is gone
        except FileNotFoundError:
            pass
        else:
            raise GatewayError(
                f"another process is listening on {path} (is `wangate run` already running?)",
                code=ErrorCode.SOCKET_IN_USE,
            )
        finally:
            probe.close()
    temporary = path.parent / f".wg{os.getpid()}.sock"
    bind_path = temporary if len(os.fsencode(temporary)) < 108 else path
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            if bind_path == temporary:
                os.unlink(temporary)
        sock.bind(os.fspath(bind_path))
        os.chmod(bind_path, mode)
        sock.listen(socket.SOMAXCONN)
        if bind_path != path:
            os.rename(bind_path, path)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.ENAMETOOLONG or "too long" in str(exc):
            raise GatewayError(
                f"socket path too long (max 107 bytes): {path}", code=ErrorCode.BAD_SOCKET_PATH
            ) from None
        raise GatewayError(
            f"cannot listen on {path}: {exc.strerror or exc}", code=ErrorCode.SOCKET_ERROR
        ) from None
    return sock
