"""A minimal HTTP/1.1 server for Prometheus scrapes: ``GET /metrics``, nothing else.

One request per connection (``Connection: close``), a bounded request head, a read
timeout and a cap on concurrent connections, so a stray client cannot hold the daemon's
memory or its event loop. The body is rendered by a callback at request time, on the
event loop that owns the gateway's state (prometheus_client's own servers run in a
thread, which would read that state while the loop changes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from wangate.errors import GatewayError
from wangate.metrics import CONTENT_TYPE
from wangate.net.address import host_port

log = logging.getLogger("wangate.metrics")

MAX_REQUEST_BYTES = 8192  # request line and headers; a scrape sends a few hundred
READ_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 16

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def parse_request_head(head: bytes) -> tuple[str, str] | None:
    """(method, path without query) from a request head, or None if it is malformed."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        return None
    request_line = text.split("\r\n", 1)[0]
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, target, _ = parts
    if not method.isalpha() or not target.startswith("/"):
        return None
    return method, target.split("?", 1)[0]


def response_bytes(
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    extra_headers: tuple[str, ...] = (),
    send_body: bool = True,
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *extra_headers,
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head + body if send_body else head


class MetricsServer:
    """Serves ``render()`` (the exposition text, encoded) at ``GET /metrics``."""

    def __init__(
        self,
        render: Callable[[], bytes],
        *,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._render = render
        self._max_request_bytes = max_request_bytes
        self._read_timeout_s = read_timeout_s
        self._max_connections = max_connections
        self._connections = 0
        self._server: asyncio.Server | None = None
        self.address: tuple[str, int] | None = None

    async def start(self, host: str, port: int) -> None:
        try:
            self._server = await asyncio.start_server(
                self._handle, host, port, limit=self._max_request_bytes
            )
        except OSError as exc:
            raise GatewayError(
                f"metrics: cannot listen on {host_port(host, port)}: {exc.strerror or exc}; "
                "check [metrics] listen"
            ) from exc
        sockname = self._server.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        log.info("metrics at http://%s/metrics", host_port(*self.address))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            if self._connections > self._max_connections:
                writer.write(response_bytes(503, b"too many connections\n"))
            else:
                writer.write(await self._respond(reader))
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._connections -= 1
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader) -> bytes:
        try:
            head = await asyncio.wait_for(
                reader.readuntil(b"\r\n\r\n"), timeout=self._read_timeout_s
            )
        except TimeoutError:
            return response_bytes(408, b"request timeout\n")
        except asyncio.LimitOverrunError:
            return response_bytes(431, b"request head too large\n")
        except asyncio.IncompleteReadError:
            return response_bytes(400, b"incomplete request\n")
        request = parse_request_head(head)
        if request is None:
            return response_bytes(400, b"malformed request\n")
        method, path = request
        if path != "/metrics":
            return response_bytes(404, b"not found: try /metrics\n")
        if method not in ("GET", "HEAD"):
            return response_bytes(405, b"only GET\n", extra_headers=("Allow: GET, HEAD",))
        try:
            body = self._render()
        except Exception:
            log.exception("rendering metrics failed")
            return response_bytes(500, b"rendering metrics failed\n")
        return response_bytes(200, body, CONTENT_TYPE, send_body=method == "GET")
