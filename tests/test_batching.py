"""DatagramBatcher over real UDP sockets on loopback: every datagram arrives as it was,
in order, whether it went in a segmented batch or alone."""

from __future__ import annotations

import asyncio
import sys

import pytest

from wangate.net.batching import MAX_SEGMENTS, DatagramBatcher


class Sink(asyncio.DatagramProtocol):
    def __init__(self, expect: int) -> None:
        self.got: list[bytes] = []
        self.expect = expect
        self.done = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.got.append(data)
        if len(self.got) == self.expect and not self.done.done():
            self.done.set_result(None)


async def _endpoint(protocol: asyncio.DatagramProtocol) -> asyncio.DatagramTransport:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: protocol, local_addr=("127.0.0.1", 0)
    )
    return transport


def _datagrams() -> list[bytes]:
    """Runs that must be cut: sizes change, a short one ends a run, more than
    MAX_SEGMENTS of one size."""
    sizes = [1200] * 5 + [300] + [1200] * (MAX_SEGMENTS + 3) + [1300, 1300, 40, 40]
    return [bytes([i % 251]) * size for i, size in enumerate(sizes)]


def test_batches_arrive_whole_and_in_order() -> None:
    async def main() -> tuple[list[bytes], list[bytes], list[bytes], int]:
        data = _datagrams()
        a, b = Sink(len(data)), Sink(2)
        to_a, to_b = await _endpoint(a), await _endpoint(b)
        sender = await _endpoint(asyncio.DatagramProtocol())
        batcher = DatagramBatcher(sender)
        addr_a = to_a.get_extra_info("sockname")
        addr_b = to_b.get_extra_info("sockname")
        # a change of address ends a run too
        stream = [(d, addr_a) for d in data[:3]] + [(b"to-b-1", addr_b), (b"to-b-2", addr_b)]
        stream += [(d, addr_a) for d in data[3:]]
        batcher.send(stream)
        await asyncio.wait_for(asyncio.gather(a.done, b.done), 10)
        batcher.close()
        for t in (to_a, to_b, sender):
            t.close()
        return data, a.got, b.got, batcher.batches

    data, got_a, got_b, batches = asyncio.run(main())
    assert got_a == data
    assert got_b == [b"to-b-1", b"to-b-2"]
    if sys.platform == "linux":
        # runs of 3 | 2 to b | 2 + the 300 | 64 | 3 | 1300 1300 40 -> six segmented batches
        # (the last 40 goes alone)
        assert batches == 6


def test_unsent_data_in_the_transport_keeps_the_order() -> None:
    """While the transport holds data it has not sent, the batcher queues behind it."""

    class Held:
        def __init__(self) -> None:
            self.sent: list[tuple[bytes, object]] = []

        def get_extra_info(self, name: str) -> None:
            return None  # no socket: nothing can be sent around the transport

        def get_write_buffer_size(self) -> int:
            return 1

        def sendto(self, data: bytes, addr: object) -> None:
            self.sent.append((data, addr))

    held = Held()
    batcher = DatagramBatcher(held)  # type: ignore[arg-type]
    batcher.send([(b"a" * 10, "x"), (b"b" * 10, "x"), (b"c" * 5, "y")])
    assert held.sent == [(b"a" * 10, "x"), (b"b" * 10, "x"), (b"c" * 5, "y")]
    assert batcher.batches == 0


@pytest.mark.skipif(sys.platform != "linux", reason="UDP_SEGMENT is Linux's")
def test_a_socket_that_cannot_segment_falls_back_for_good() -> None:
    """UDP_SEGMENT on a socket with checksums turned off is refused (EINVAL): the batch
    goes out one datagram at a time, and so does everything after it."""
    import socket

    async def main() -> tuple[list[bytes], int, bool]:
        data = [bytes([i]) * 500 for i in range(6)]
        sink = Sink(len(data))
        to = await _endpoint(sink)
        sender = await _endpoint(asyncio.DatagramProtocol())
        batcher = DatagramBatcher(sender)
        assert batcher._sock is not None
        batcher._sock.setsockopt(socket.SOL_SOCKET, 11, 1)  # SO_NO_CHECK
        addr = to.get_extra_info("sockname")
        batcher.send([(d, addr) for d in data[:3]])
        batcher.send([(d, addr) for d in data[3:]])
        await asyncio.wait_for(sink.done, 10)
        closed = batcher._sock is None
        to.close()
        sender.close()
        return sink.got, batcher.batches, closed

    got, batches, closed = asyncio.run(main())
    assert got == [bytes([i]) * 500 for i in range(6)]
    assert batches == 0 and closed
