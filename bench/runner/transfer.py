"""Baseline transfers of a workload schedule: TCP (chosen congestion control) or one
plain aioquic stream. Run inside the site namespaces by bench.runner.baselines.

Framing: each message is an 8-byte big-endian length then that many zero bytes.
The receiver prints one JSON line with the monotonic completion time of every
message; the sender prints the monotonic time it started (just before connecting).

    recv  --proto tcp|quic --bind IP:PORT --messages N
    send  --proto tcp|quic --bind IP --to IP:PORT --schedule '[[at_s, size], ...]' [--cc bbr]

QUIC options on both ends (for ``transport cpu``): ``--max-datagram-size`` (aioquic's default
is 1200), ``--socket-buffer-bytes`` (enlarge the UDP socket buffers), ``--uvloop``,
``--window-bytes`` (flow-control windows, 32 MiB by default);
and for the sender ``--max-buffered-bytes`` (hold back while the stream has that much
unacknowledged data; by default it queues whole messages at once).
Both ends also report the CPU seconds they used (``cpu_s``; QUIC ends also the part
spent before the transfer: ``cpu_at_ready_s``, ``cpu_at_start_s``); a QUIC receiver
and a receiver (TCP or QUIC) sent SIGTERM still prints what it completed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import signal
import socket
import ssl
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LENGTH = struct.Struct("!Q")
ALPN = "wglab-baseline"
CHUNK = 256 * 1024
QUIC_WINDOW = 32 << 20  # large enough that flow control never limits the baseline


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _zeros(size: int) -> memoryview:
    return memoryview(bytes(min(size, CHUNK)))


# -- TCP ----------------------------------------------------------------------
def tcp_recv(bind: tuple[str, int], messages: int) -> dict[str, Any]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(bind)
    listener.listen(1)
    done: list[float] = []
    signal.signal(signal.SIGTERM, _stop_early)
    print(json.dumps({"ready": True}), flush=True)
    with contextlib.suppress(_StoppedEarly):  # the sender gave up: report what completed
        conn, _ = listener.accept()
        _tcp_read_messages(conn.makefile("rb", buffering=CHUNK), messages, done)
    return {"completed": done, "cpu_s": _cpu_seconds()}


class _StoppedEarly(Exception):
    pass


def _stop_early(signum: int, frame: object) -> None:
    raise _StoppedEarly


def _tcp_read_messages(reader: Any, messages: int, done: list[float]) -> None:
    for _ in range(messages):
        header = reader.read(LENGTH.size)
        if len(header) < LENGTH.size:
            break
        remaining = LENGTH.unpack(header)[0]
        while remaining:
            chunk = reader.read1(min(remaining, CHUNK))
            if not chunk:
                break
            remaining -= len(chunk)
        if remaining:
            break
        done.append(time.monotonic())


def tcp_send(
    bind: str, to: tuple[str, int], schedule: list[tuple[float, int]], cc: str
) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    sock.bind((bind, 0))
    started = time.monotonic()
    sock.connect(to)
    for at_s, size in schedule:
        delay = started + at_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sock.sendall(LENGTH.pack(size))
        zeros = _zeros(size)
        remaining = size
        while remaining:
            sent = sock.send(zeros[: min(remaining, len(zeros))])
            remaining -= sent
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)  # wait for the receiver to close: everything was delivered
    used = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
    return {"started": started, "cc": used, "cpu_s": _cpu_seconds()}


# -- QUIC (aioquic) -------------------------------------------------------------
def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _enlarge_buffers(sock: socket.socket | None, size_bytes: int) -> None:
    if sock is None or not size_bytes:
        return
    for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):  # SO_*BUFFORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size_bytes)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, size_bytes)


def _quic_configuration(
    is_client: bool, max_datagram_size: int | None = None, window_bytes: int = QUIC_WINDOW
) -> Any:
    from aioquic.quic.configuration import QuicConfiguration

    configuration = QuicConfiguration(
        is_client=is_client,
        alpn_protocols=[ALPN],
        max_data=window_bytes,
        max_stream_data=window_bytes,
    )
    if max_datagram_size:
        configuration.max_datagram_size = max_datagram_size
    if is_client:
        configuration.verify_mode = ssl.CERT_NONE
    else:
        from wangate.lab.certs import self_signed

        cert, key = self_signed("baseline")
        directory = Path(tempfile.mkdtemp(prefix="wglab-quic-"))
        (directory / "cert.pem").write_bytes(cert)
        (directory / "key.pem").write_bytes(key)
        configuration.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    return configuration


async def _quic_recv(
    bind: tuple[str, int],
    messages: int,
    max_datagram_size: int | None = None,
    socket_buffer_bytes: int = 0,
    window_bytes: int = QUIC_WINDOW,
) -> dict[str, Any]:
    from aioquic.asyncio.server import serve

    from wangate.net import aioquic_compat as compat

    done: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    finished = asyncio.get_running_loop().create_future()

    def on_term() -> None:  # stopped early (the sender gave up): report what completed
        if not finished.done():
            finished.set_result(None)

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_term)

    def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def consume() -> None:
            try:
                for _ in range(messages):
                    remaining = LENGTH.unpack(await reader.readexactly(LENGTH.size))[0]
                    while remaining:
                        chunk = await reader.read(min(remaining, CHUNK))
                        if not chunk:
                            raise EOFError
                        remaining -= len(chunk)
                    done.append(time.monotonic())
                writer.write(b"k")  # tells the sender everything arrived
                writer.write_eof()
            except (EOFError, asyncio.IncompleteReadError):
                pass
            finally:
                await asyncio.sleep(0.2)
                if not finished.done():
                    finished.set_result(None)

        tasks.append(asyncio.ensure_future(consume()))

    server = await serve(
        bind[0],
        bind[1],
        configuration=_quic_configuration(False, max_datagram_size, window_bytes),
        stream_handler=on_stream,
    )
    transport = compat.transport_of(server)
    if transport is not None:
        _enlarge_buffers(transport.get_extra_info("socket"), socket_buffer_bytes)
    print(json.dumps({"ready": True}), flush=True)
    cpu_at_ready = _cpu_seconds()
    await finished
    server.close()
    return {"completed": done, "cpu_s": _cpu_seconds(), "cpu_at_ready_s": cpu_at_ready}


async def _quic_send(
    bind: str,
    to: tuple[str, int],
    schedule: list[tuple[float, int]],
    max_datagram_size: int | None = None,
    socket_buffer_bytes: int = 0,
    window_bytes: int = QUIC_WINDOW,
    max_buffered_bytes: int = 0,
) -> dict[str, Any]:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic.connection import QuicConnection

    from wangate.net import aioquic_compat as compat

    loop = asyncio.get_running_loop()
    configuration = _quic_configuration(True, max_datagram_size, window_bytes)
    connection = QuicConnection(configuration=configuration)
    # aioquic's connect() cannot bind a local address, so make the endpoint ourselves.
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: QuicConnectionProtocol(connection), local_addr=(bind, 0)
    )
    _enlarge_buffers(transport.get_extra_info("socket"), socket_buffer_bytes)
    assert isinstance(protocol, QuicConnectionProtocol)
    started = time.monotonic()
    cpu_at_start = _cpu_seconds()
    protocol.connect(to)
    await protocol.wait_connected()
    reader, writer = await protocol.create_stream()
    # aioquic drops acknowledged bytes from the front of this bytearray, which costs
    # its length each time: a sender that queues everything at once pays quadratically
    stream_id = getattr(writer.transport, "stream_id")  # noqa: B009 (not in the type)

    def buffered_bytes() -> int:
        return compat.stream_unsent_bytes(compat.connection_of(protocol), stream_id)

    for at_s, size in schedule:
        delay = started + at_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        writer.write(LENGTH.pack(size))
        zeros = bytes(_zeros(size))
        remaining = size
        while remaining:
            piece = min(remaining, len(zeros))
            writer.write(zeros[:piece])
            remaining -= piece
            await writer.drain()  # returns at once: aioquic buffers without limit
            while max_buffered_bytes and buffered_bytes() > max_buffered_bytes:
                await asyncio.sleep(0.0005)
    writer.write_eof()
    await reader.read(1)
    protocol.close()
    await protocol.wait_closed()
    transport.close()
    return {
        "started": started,
        "cc": configuration.congestion_control_algorithm,
        "cpu_s": _cpu_seconds(),
        "cpu_at_start_s": cpu_at_start,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runner.transfer")
    sub = parser.add_subparsers(dest="mode", required=True)
    receiver = sub.add_parser("recv")
    receiver.add_argument("--proto", choices=("tcp", "quic"), required=True)
    receiver.add_argument("--bind", required=True, type=_address)
    receiver.add_argument("--messages", type=int, required=True)
    sender = sub.add_parser("send")
    sender.add_argument("--proto", choices=("tcp", "quic"), required=True)
    sender.add_argument("--bind", required=True)
    sender.add_argument("--to", required=True, type=_address)
    sender.add_argument("--schedule", required=True, help="JSON list of [at_s, size_bytes]")
    sender.add_argument("--cc", default="cubic", help="TCP_CONGESTION (tcp only)")
    sender.add_argument(
        "--max-buffered-bytes",
        type=int,
        default=0,
        help="QUIC: wait while the stream holds more unacknowledged bytes",
    )
    for sub_parser in (receiver, sender):
        sub_parser.add_argument(
            "--max-datagram-size",
            type=int,
            help="QUIC: largest UDP payload (aioquic's default: 1200)",
        )
        sub_parser.add_argument(
            "--socket-buffer-bytes",
            type=int,
            default=0,
            help="QUIC: enlarge the UDP socket buffers to this",
        )
        sub_parser.add_argument("--uvloop", action="store_true", help="QUIC: run on uvloop")
        sub_parser.add_argument(
            "--window-bytes",
            type=int,
            default=QUIC_WINDOW,
            help="QUIC: flow-control windows (max_data, max_stream_data)",
        )
    args = parser.parse_args(argv)
    if args.proto == "quic" and args.uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    quic_options = {
        "max_datagram_size": args.max_datagram_size,
        "socket_buffer_bytes": args.socket_buffer_bytes,
        "window_bytes": args.window_bytes,
    }
    if args.mode == "recv":
        if args.proto == "tcp":
            result = tcp_recv(args.bind, args.messages)
        else:
            result = asyncio.run(_quic_recv(args.bind, args.messages, **quic_options))
    else:
        schedule = [(float(at), int(size)) for at, size in json.loads(args.schedule)]
        if args.proto == "tcp":
            result = tcp_send(args.bind, args.to, schedule, args.cc)
        else:
            result = asyncio.run(
                _quic_send(
                    args.bind,
                    args.to,
                    schedule,
                    **quic_options,
                    max_buffered_bytes=args.max_buffered_bytes,
                )
            )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
