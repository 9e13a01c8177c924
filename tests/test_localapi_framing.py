"""AsyncFrameReader on a real socket pair: what is there is read at once, but not forever."""

from __future__ import annotations

import asyncio
import socket

from wangate.localapi.framing import EAGER_READ_BYTES, AsyncFrameReader
from wangate.localapi.protocol import SendRequest, decode_request, encode_request


class CountingLoop:
    """Counts the reads that waited for the loop (a spy over the real loop's method)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.waits = 0
        self._real = loop.sock_recv_into

        async def sock_recv_into(sock: socket.socket, buf: memoryview) -> int:
            self.waits += 1
            return await self._real(sock, buf)

        loop.sock_recv_into = sock_recv_into  # type: ignore[method-assign,assignment]


def test_a_frame_already_received_is_read_without_waiting_for_the_loop() -> None:
    async def main() -> tuple[int, object, bytes]:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        request = SendRequest(7, "sh", "w", 3, True, b"", 0, None)
        theirs.sendall(encode_request(request, 5) + b"hello")
        spy = CountingLoop(asyncio.get_running_loop())
        reader = AsyncFrameReader(ours, 1 << 20)
        head = await reader.read_head()
        assert head is not None
        prefix, raw = head
        payload = bytes(await reader.read_payload(prefix.payload_bytes))
        ours.close()
        theirs.close()
        return spy.waits, decode_request(raw, prefix.payload_bytes), payload

    waits, request, payload = asyncio.run(main())
    assert waits == 0
    assert request == SendRequest(7, "sh", "w", 3, True, b"", 0, None)
    assert payload == b"hello"


class EndlessSocket:
    """Always has CHUNK bytes ready: a client that never stops sending."""

    CHUNK = 64 * 1024

    def __init__(self) -> None:
        self.sent = 0

    def recv_into(self, buf: memoryview) -> int:
        n = min(len(buf), self.CHUNK)
        buf[:n] = bytes([self.sent // self.CHUNK % 256]) * n
        self.sent += n
        return n


def test_a_client_that_never_stops_sending_still_lets_the_loop_turn() -> None:
    size = 3 * EAGER_READ_BYTES

    async def main() -> tuple[int, bytes]:
        sock = EndlessSocket()
        loop = asyncio.get_running_loop()
        waits = 0

        async def sock_recv_into(_sock: object, buf: memoryview) -> int:
            nonlocal waits
            waits += 1
            await asyncio.sleep(0)  # the turn of the loop a real wait would give
            return sock.recv_into(buf)

        loop.sock_recv_into = sock_recv_into  # type: ignore[method-assign,assignment]
        reader = AsyncFrameReader(sock, size)  # type: ignore[arg-type]
        payload = bytes(await reader.read_payload(size))
        return waits, payload

    waits, payload = asyncio.run(main())
    chunks = size // EndlessSocket.CHUNK
    assert payload == b"".join(bytes([i % 256]) * EndlessSocket.CHUNK for i in range(chunks))
    # 16 chunks make one allowance: after each, one read waits for the loop (48 = 16+1+16+1+14)
    assert waits == 2
