"""Admission of a new local connection, before anything is read from it.

The kernel's record of the connecting process (``SO_PEERCRED``) is checked against the
access policy (``access.py``) and the connection count against ``max_connections``: a
refused client gets one error reply (``access_denied`` or ``too_many_connections``,
request id nil) and the connection is closed. Refusals are logged at most once per
uid (or for the cap) per ``REFUSAL_LOG_INTERVAL_S``.
"""

from __future__ import annotations

import logging
import socket
import time

from wangate.errors import ErrorCode
from wangate.localapi.access import AccessPolicy, connection_cap_refusal, peer_credentials
from wangate.localapi.protocol import encode_header
from wangate.localapi.replies import ErrorReply, reply_header

log = logging.getLogger("wangate.localapi")

REFUSAL_LOG_INTERVAL_S = 60.0  # one warning per refused uid (or for the cap) per interval
MAX_LOGGED_KEYS = 1024  # many uids: forget the old ones


class Admission:
    def __init__(self, policy: AccessPolicy, socket_path: str, max_connections: int) -> None:
        self.policy = policy
        self.socket_path = socket_path
        self.max_connections = max_connections
        self.refused = 0
        self._logged: dict[object, float] = {}

    def admit(self, sock: socket.socket, open_connections: int) -> bool:
        """Whether ``sock`` may stay; when not, it is refused with a reply the client
        can act on, and closed."""
        try:
            peer = peer_credentials(sock)
        except OSError as exc:
            log.warning("cannot read the credentials of a local connection: %s", exc)
            sock.close()
            return False
        refused = self.policy.check(peer)
        if refused is not None:
            message = self.policy.refusal(refused, self.socket_path)
            self._refuse(sock, ErrorCode.ACCESS_DENIED, message, key=("uid", refused.uid))
            return False
        if open_connections >= self.max_connections:
            message = connection_cap_refusal(self.socket_path, self.max_connections)
            self._refuse(sock, ErrorCode.TOO_MANY_CONNECTIONS, message, key="cap")
            return False
        return True

    def _refuse(self, sock: socket.socket, code: ErrorCode, message: str, *, key: object) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._logged.get(key, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            if len(self._logged) >= MAX_LOGGED_KEYS:
                self._logged = {
                    k: t for k, t in self._logged.items() if now - t < REFUSAL_LOG_INTERVAL_S
                }
            self._logged[key] = now
            log.warning("refused a local connection (%s): %s", code, message)
        try:
            # A fresh socket's send buffer takes this small frame whole, without waiting.
            sock.send(encode_header(reply_header(ErrorReply(None, code, message))))
        except OSError:
            pass  # the client is gone already
        finally:
            sock.close()
