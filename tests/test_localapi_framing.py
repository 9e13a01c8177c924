"""Frames from a stream socket: what is there is read at once, but not forever."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.localapi import framing
from wangate.localapi.framing import (
    EAGER_READ_BYTES,
    STAGING_BYTES,
    ConnectionClosed,
    FrameAssembler,
    ReadyFrameReader,
)
from wangate.localapi.protocol import FrameError, SendRequest, decode_request, encode_request


def test_a_frame_already_received_is_read_in_one_readiness_callback() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    request = SendRequest(7, "sh", "w", 3, True, b"", 0, None)
    second = SendRequest(8, "sh", "w", 4, False, b"", 0, None)
    theirs.sendall(encode_request(request, 5) + b"hello" + encode_request(second, 0))
    reader = ReadyFrameReader(ours, 1 << 20)
    frames, ended = reader.frames_ready()
    assert ended is None
    assert [
        (decode_request(raw, prefix.payload_bytes), bytes(payload))
        for prefix, raw, payload in frames
    ] == [(request, b"hello"), (second, b"")]
    assert reader.frames_ready() == ([], None)  # nothing more: no frame, not ended
    theirs.close()
    frames, ended = reader.frames_ready()
    ours.close()
    assert frames == []
    assert isinstance(ended, ConnectionClosed)
    assert str(ended) == "the gateway closed the connection"


@pytest.mark.parametrize("cut", [0, 3, 40])
def test_the_end_of_the_stream_says_whether_it_cut_a_frame(cut: int) -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    frame = encode_request(SendRequest(7, "sh", "w", 3, True, b"", 0, None), 5) + b"hello"
    theirs.sendall(frame + frame[:cut])
    theirs.close()
    reader = ReadyFrameReader(ours, 1 << 20)
    frames, ended = reader.frames_ready()
    if ended is None:  # a short read ends a callback; the end shows at the next
        assert len(frames) == 1
        more, ended = reader.frames_ready()
        frames += more
    ours.close()
    assert [bytes(payload) for _, _, payload in frames] == [b"hello"]
    assert isinstance(ended, ConnectionClosed)
    expected = "the gateway closed the connection" if cut == 0 else "in the middle of a frame"
    assert expected in str(ended)


def test_frames_before_a_bad_prefix_are_returned_with_the_error() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    good = SendRequest(3, "sh", "w", 1, False, b"", 0, None)
    theirs.sendall(encode_request(good, 2) + b"ok" + b"GET / HTTP/1.1\r\n\r\n")
    frames, ended = ReadyFrameReader(ours, 1 << 20).frames_ready()
    ours.close()
    theirs.close()
    assert [(decode_request(raw, p.payload_bytes), bytes(pl)) for p, raw, pl in frames] == [
        (good, b"ok")
    ]
    assert isinstance(ended, FrameError)
    assert ended.code == "bad_magic"


class EndlessSocket:
    """A peer that never stops: frame after frame (request id ``i``, ``PAYLOAD`` bytes of
    ``i % 256``), and every receive finds more queued than it asks for."""

    PAYLOAD = 100_000

    def __init__(self) -> None:
        self.frames_made = 0
        self.pending = b""
        self.read = 0

    def recv_into(self, buf: memoryview) -> int:
        while len(self.pending) < len(buf):
            self.frames_made += 1
            i = self.frames_made
            request = SendRequest(i, "sh", "bulk", i, False, b"", 0, None)
            self.pending += encode_request(request, self.PAYLOAD) + bytes([i % 256]) * self.PAYLOAD
        n = len(buf)
        buf[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        self.read += n
        return n

    def recvmsg_into(
        self, buffers: list[memoryview], ancbufsize: int, flags: int
    ) -> tuple[int, list[object], int, None]:
        return self.recv_into(buffers[0]), [], 0, None

    def fileno(self) -> int:
        return -1


def test_a_peer_that_never_stops_sending_still_lets_the_loop_turn() -> None:
    sock = EndlessSocket()
    reader = ReadyFrameReader(sock, 1 << 20)  # type: ignore[arg-type]
    ids: list[int] = []
    for _ in range(3):
        before = sock.read
        frames, ended = reader.frames_ready()
        assert ended is None
        # one allowance per callback, overshot by one read at most
        assert EAGER_READ_BYTES <= sock.read - before < EAGER_READ_BYTES + EndlessSocket.PAYLOAD
        for prefix, raw, payload in frames:
            request = decode_request(raw, prefix.payload_bytes)
            assert bytes(payload) == bytes([request.request_id % 256]) * EndlessSocket.PAYLOAD
            ids.append(request.request_id)
    # in order, none lost or repeated across the callbacks: about 10 frames per allowance
    assert ids == list(range(1, len(ids) + 1))
    assert len(ids) >= 3 * EAGER_READ_BYTES // (EndlessSocket.PAYLOAD + 100) - 1


def _feed(assembler: FrameAssembler, data: bytes, sizes: list[int]) -> None:
    """Push ``data`` in pieces of at most each of ``sizes`` (then the rest)."""
    view = memoryview(data)
    for size in [*sizes, len(data)]:
        while view and size:
            target = assembler.writable()
            n = min(size, len(target), len(view))
            if n == 0:
                return  # the assembler waits for a decision on the payload
            target[:n] = view[:n]
            assembler.wrote(n)
            view, size = view[n:], size - n


def _frames(count: int) -> list[tuple[SendRequest, bytes]]:
    return [
        (SendRequest(i + 1, "sh", f"t{i}", i, i % 2 == 0, b"m" * i, i, None), bytes([i]) * (i * 37))
        for i in range(count)
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300), max_size=40))
def test_assembler_gives_the_same_frames_however_the_bytes_are_split(sizes: list[int]) -> None:
    frames = _frames(6)
    stream = b"".join(encode_request(r, len(p)) + p for r, p in frames)
    assembler = FrameAssembler(1 << 20)
    out: list[tuple[object, bytes]] = []
    view = memoryview(stream)
    pieces = iter([*sizes, len(stream)] * 2)
    while len(out) < len(frames):
        head = assembler.next_head()
        if head is not None:
            prefix, header = head
            request = decode_request(header, prefix.payload_bytes)
            if prefix.payload_bytes:
                assembler.expect_payload(prefix.payload_bytes)
                pending: object = request
            else:
                out.append((request, b""))
            continue
        payload = assembler.take_payload()
        if payload is not None:
            out.append((pending, bytes(payload)))
            continue
        target = assembler.writable()
        n = min(next(pieces, len(view)), len(target), len(view))
        assert n > 0, "the assembler asked for nothing while a frame was incomplete"
        target[:n] = view[:n]
        assembler.wrote(n)
        view = view[n:]
    assert out == frames
    assert assembler.between_frames


def test_assembler_skips_a_refused_payload_and_reads_the_next_frame() -> None:
    (first, first_payload), (second, second_payload) = _frames(3)[1:]
    stream = encode_request(first, len(first_payload)) + first_payload
    stream += encode_request(second, len(second_payload)) + second_payload
    assembler = FrameAssembler(1 << 20)
    _feed(assembler, stream, [10])  # all of it waits in the staging area
    head = assembler.next_head()
    assert head is not None
    assert decode_request(head[1], head[0].payload_bytes) == first
    assembler.skip_payload(head[0].payload_bytes)
    head = assembler.next_head()
    assert head is not None
    assert decode_request(head[1], head[0].payload_bytes) == second
    assembler.expect_payload(head[0].payload_bytes)
    payload = assembler.take_payload()
    assert payload is not None and bytes(payload) == second_payload
    assert assembler.between_frames


def test_assembler_refuses_a_bad_prefix_and_an_oversized_payload() -> None:
    assembler = FrameAssembler(1000)
    _feed(assembler, b"GET / HTTP/1.1\r\n\r\n", [])
    with pytest.raises(FrameError) as bad:
        assembler.next_head()
    assert bad.value.code == "bad_magic"
    assembler = FrameAssembler(1000)
    _feed(assembler, encode_request(SendRequest(1, "sh", "t", 0, False, b"", 0, None), 1001), [])
    with pytest.raises(FrameError) as large:
        assembler.next_head()
    assert large.value.code == "too_large"


def feed(assembler: FrameAssembler, data: bytes) -> None:
    """Hand ``data`` to the assembler the way a socket would, one writable() at a time."""
    while data:
        target = assembler.writable()
        size = min(len(target), len(data))
        target[:size] = data[:size]
        assembler.wrote(size)
        data = data[size:]


def test_an_idle_assembler_keeps_no_staging_buffer() -> None:
    assembler = FrameAssembler(1 << 20)
    staging = assembler._staging
    assert staging.capacity == 0  # before anything arrived
    request = SendRequest(3, "sh", "layer0", 1, False, b"m", 0, None)
    feed(assembler, encode_request(request, 4))
    assert staging.capacity == STAGING_BYTES  # holding the head
    head = assembler.next_head()
    assert head is not None and decode_request(head[1], 4) == request
    assert staging.capacity == 0  # consumed: dropped
    # a receive that finds nothing leaves nothing behind either
    assembler.writable()
    assert staging.capacity == STAGING_BYTES
    assembler.release_idle()
    assert staging.capacity == 0
    # the payload goes to its own buffer; the staging area is not kept for it
    assembler.expect_payload(4)
    feed(assembler, b"abcd")
    assert bytes(assembler.take_payload() or b"") == b"abcd"
    assert staging.capacity == 0 and assembler.between_frames


def test_a_head_larger_than_the_staging_area_grows_it_and_is_read_whole() -> None:
    assembler = FrameAssembler(1 << 20)
    big_tag = "t" * 200
    meta = bytes(range(256)) * 200  # a 51 200-byte header, over STAGING_BYTES
    request = SendRequest(9, "sh", big_tag, 2, True, meta, 5, 1.5)
    raw = encode_request(request, 0)
    assert len(raw) > STAGING_BYTES
    second = encode_request(SendRequest(10, "sh", "x", 0, False, b"", 0, None), 0)
    feed(assembler, raw[:100])
    assert assembler.next_head() is None
    feed(assembler, raw[100:] + second)
    assert assembler._staging.capacity == 4 * STAGING_BYTES  # doubled twice, no more
    head = assembler.next_head()
    assert head is not None and decode_request(head[1], 0) == request
    head = assembler.next_head()
    assert head is not None and decode_request(head[1], 0).request_id == 10
    assert assembler._staging.capacity == 0


def _read_exactly(sock: socket.socket, size: int) -> tuple[bytes, list[int]]:
    """``size`` bytes from a blocking socket, and the descriptors that came with them."""
    got, fds = bytearray(), []
    while len(got) < size:
        data, ancillary, _, _ = sock.recvmsg(size - len(got), socket.CMSG_SPACE(16))
        assert data, "the writer closed early"
        got += data
        for level, kind, raw in ancillary:
            assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
            fds.extend(int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4))
    return bytes(got), fds


def test_a_frame_written_at_once_is_one_write_that_the_loop_never_waits_for() -> None:
    """Head and body go in one sendmsg: nothing else runs between them."""

    async def main() -> tuple[int, bytes]:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        waited = 0
        real = loop.sock_sendall

        async def sock_sendall(sock: socket.socket, data: object) -> None:
            nonlocal waited
            waited += 1
            await real(sock, data)  # type: ignore[arg-type]

        loop.sock_sendall = sock_sendall  # type: ignore[method-assign]
        await framing.sock_send_frame(loop, ours, b"HEAD", memoryview(b"body" * 4))
        data, fds = _read_exactly(theirs, 20)
        ours.close()
        theirs.close()
        assert fds == []
        return waited, data

    waited, data = asyncio.run(main())
    assert waited == 0
    assert data == b"HEAD" + b"body" * 4


@pytest.mark.parametrize("with_fd", [False, True])
def test_a_frame_larger_than_the_socket_takes_arrives_whole_with_its_descriptor(
    with_fd: bool,
) -> None:
    """A body far over the socket buffer: the rest waits for room, bytes in order, and
    the descriptor arrives with the frame's first byte, once."""
    body = bytes(range(256)) * 4096  # 1 MiB
    head = b"H" * 37

    async def main() -> tuple[bytes, list[int]]:
        ours, theirs = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        ours.setblocking(False)
        passed_r, passed_w = os.pipe()
        loop = asyncio.get_running_loop()
        reading = loop.run_in_executor(None, _read_exactly, theirs, len(head) + len(body))
        await framing.sock_send_frame(
            loop, ours, head, memoryview(body), passed_r if with_fd else None
        )
        data, fds = await reading
        os.write(passed_w, b"x")
        for fd in fds:
            assert os.read(fd, 1) == b"x"  # the pipe we passed, not any descriptor
            os.close(fd)
        for fd in (passed_r, passed_w):
            os.close(fd)
        ours.close()
        theirs.close()
        return data, fds

    data, fds = asyncio.run(main())
    assert data == head + body
    assert len(fds) == (1 if with_fd else 0)


def test_a_blocking_frame_write_sends_head_body_and_descriptor_in_order() -> None:
    body = bytes(range(256)) * 2048  # 512 KiB: over what one sendmsg takes here
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    passed_r, passed_w = os.pipe()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(_read_exactly, theirs, 5 + len(body))
        framing.send_frame(ours, b"HELLO", memoryview(body), passed_r)
        data, fds = reading.result(timeout=30)
    assert data == b"HELLO" + body
    assert len(fds) == 1
    os.write(passed_w, b"y")
    assert os.read(fds[0], 1) == b"y"
    for fd in (*fds, passed_r, passed_w):
        os.close(fd)
    ours.close()
    theirs.close()
