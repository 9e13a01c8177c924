"""The coordinator/worker control channel (wangate.workers.channel): packets, checks,
descriptors, and a real worker process meeting bad input."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from wangate.loopback import write_site_configs
from wangate.shm import fd_ancillary
from wangate.workers.channel import Channel, ChannelError, decode, encode

pytestmark = pytest.mark.timeout(120)


def test_a_packet_round_trips_with_exact_bytes() -> None:
    packet = encode("taken", {"peer": "sh", "msg_id": 7, "body_bytes": 4096, "seq": 3})
    assert packet == bytes.fromhex(
        "85a16ba574616b656ea470656572a27368a66d73675f696407aa626f64795f6279746573cd1000a373657103"
    )
    assert decode(packet, 0) == (
        "taken",
        {"peer": "sh", "msg_id": 7, "body_bytes": 4096, "seq": 3},
    )


@pytest.mark.parametrize(
    ("packet", "fds", "error"),
    [
        (b"\xc1", 0, "a packet of 1 bytes is not msgpack"),
        (msgpack.packb([1, 2]), 0, "a packet is a list, not a map"),
        (msgpack.packb({"k": "explode"}), 0, "unknown packet kind 'explode'"),
        (msgpack.packb({"k": "acked"}), 0, r"acked packet: missing keys \['sid'\], unknown"),
        (msgpack.packb({"k": "acked", "sid": 1, "x": 2}), 0, r"unknown keys \['x'\]"),
        (msgpack.packb({"k": "acked", "sid": "1"}), 0, "acked packet: sid is a str"),
        (msgpack.packb({"k": "acked", "sid": True}), 0, "acked packet: sid is a bool"),
        (msgpack.packb({"k": "acked", "sid": 1}), 1, "acked packet came with 1 descriptors, not 0"),
        (msgpack.packb({"k": "done", "sid": 1}), 0, r"done packet: missing keys \['holder'\]"),
        (
            encode("place", {"seq": 1, "offset": 0}),
            0,
            "place packet came with 0 descriptors, not 1",
        ),
        (
            encode("arrived", {"peer": "sh", "msg_id": 1, "body_bytes": 1, "tag": "t", "step": 0,
                               "critical": False, "meta": b"", "checksum": 0, "length": 1,
                               "seq": 1, "job": "default"}),
            1,
            "arrived packet came with 1 descriptors, not 0",
        ),
        (
            encode("arrived", {"peer": "sh", "msg_id": 1, "body_bytes": 1, "tag": "t", "step": 0,
                               "critical": False, "meta": b"", "checksum": 0, "length": 1,
                               "seq": 1}),
            0,
            r"arrived packet: missing keys \['job'\]",
        ),
        (
            encode("arrived", {"peer": "sh", "msg_id": 1, "body_bytes": 1, "tag": "t", "step": 0,
                               "critical": False, "meta": b"", "checksum": 0, "length": 1,
                               "seq": 1, "job": 3}),
            0,
            "arrived packet: job is a int",
        ),
    ],
)  # fmt: skip
def test_bad_packets_are_clear_errors(packet: bytes, fds: int, error: str) -> None:
    with pytest.raises(ChannelError, match=error) as info:
        decode(packet, fds)
    assert info.value.code == "internal"


def test_descriptors_cross_and_a_bad_packet_closes_the_channel() -> None:
    async def main() -> tuple[list[Any], list[str], bytes]:
        left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        got: list[Any] = []
        closed: list[str] = []
        arrived = asyncio.Event()

        def on_message(kind: str, fields: dict[str, Any], fds: list[int]) -> None:
            got.append((kind, fields, [os.pread(fd, 5, 0) for fd in fds]))
            for fd in fds:
                os.close(fd)
            arrived.set()

        receiver = Channel(right, on_message, lambda why: (closed.append(why), arrived.set()))
        sender = Channel(left, lambda *_: None, lambda reason: None)
        fd = os.memfd_create("t")
        os.write(fd, b"hello")
        sender.send("acked", {"sid": 3})
        sender.send("reset", {"peer": "sh", "path": "a"})
        fields = {"sid": 1, "peer": "sh", "tag": "t", "step": 0, "critical": True, "meta": b"m",
                  "checksum": 5, "offset": 0, "length": 5, "deadline_s": -1,
                  "job": "llama-run3"}  # fmt: skip
        sender.send("send", fields, [fd])  # the channel closes it once sent
        while len(got) < 3:
            arrived.clear()
            await arrived.wait()
        sender.sock.sendmsg([b"\x93\x01"], fd_ancillary([0]))  # not a map, with a descriptor
        arrived.clear()
        await arrived.wait()
        sender.close()
        assert receiver.closed
        return got, closed, b""

    got, closed, _ = asyncio.run(main())
    assert got == [
        ("acked", {"sid": 3}, []),
        ("reset", {"peer": "sh", "path": "a"}, []),
        ("send", {"sid": 1, "peer": "sh", "tag": "t", "step": 0, "critical": True, "meta": b"m",
                  "checksum": 5, "offset": 0, "length": 5, "deadline_s": -1, "job": "llama-run3"},
         [b"hello"]),
    ]  # fmt: skip
    assert closed == ["bad packet: a packet of 2 bytes is not msgpack: 3 exceeds max_array_len(2)"]


def test_a_worker_given_a_bad_packet_says_so_and_stops(tmp_path: Path) -> None:
    site = write_site_configs(tmp_path, 2, 1, workers=1)[0]
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen(
        [sys.executable, "-m", "wangate.workers.worker", "--config", str(site.config_path),
         "--index", "0", "--fd", str(child.fileno())],
        pass_fds=[child.fileno()], stderr=subprocess.PIPE,
    )  # fmt: skip
    child.close()
    try:
        parent.settimeout(60)
        kind, fields = decode(parent.recv(1 << 16), 0)
        assert (kind, fields) == ("ready", {"pid": process.pid})
        parent.send(encode("taken", {"peer": "sh", "msg_id": "seven", "body_bytes": 1, "seq": 1}))
        assert process.wait(timeout=30) == 0
        assert process.stderr is not None
        err = process.stderr.read().decode()
        assert "worker 0: control channel: bad packet: taken packet: msg_id is a str" in err, err
    finally:
        process.kill()
        parent.close()
