"""Seed corpora for the engine's libFuzzer targets, from the golden vectors.

Usage (from the repository root): ``.venv/bin/python wangate/engine/fuzz/make_seeds.py OUT``
writes ``OUT/fuzz_frames/``, ``OUT/fuzz_packet/`` and ``OUT/fuzz_span/``: the frames of every
``proto/vectors/*engine*`` vector and the vector's packet itself, then a few more
packets sealed by the engine with fuzz_packet.c's keys (ACK, DATAGRAM, PING, PADDING;
each suite; in order, reordered, duplicated, a key phase change, a forget).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

import wangate.engine._engine as _engine

REPO = Path(__file__).resolve().parents[3]
SUITES = (0x1301, 0x1302, 0x1303)  # the knob's bits 0-1 pick one, in this order
CID = bytes(8)


def vectors() -> list[tuple[dict[str, Any], bytes]]:
    """(fields, packet) of each engine vector: '# fields: {json}', then hex lines."""
    found = []
    for path in sorted((REPO / "proto" / "vectors").glob("*engine*.hex")):
        lines = path.read_text().splitlines()
        fields = next(
            json.loads(line.partition("fields:")[2]) for line in lines if "fields:" in line
        )
        packet = bytes.fromhex(" ".join(line for line in lines if not line.startswith("#")))
        found.append((fields, packet))
    return found


def secret(suite: int, golden: bytes) -> bytes:
    """fuzz_packet.c's key for `suite`."""
    if suite == 0x1301:
        return golden
    return bytes((suite + 31 * i) % 256 for i in range(48 if suite == 0x1302 else 32))


def packet_input(knob: int, packets: list[tuple[bytes, bool]]) -> bytes:
    """fuzz_packet's input: the knob byte, then (length | forget bit, bytes) per packet."""
    out = bytearray([knob])
    for packet, forget in packets:
        out += struct.pack(">H", len(packet) | (0x8000 if forget else 0)) + packet
    return bytes(out)


def write(folder: Path, seeds: list[bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        (folder / hashlib.sha1(seed).hexdigest()).write_bytes(seed)


def main(out: Path) -> None:
    found = vectors()
    if not found:
        sys.exit("no proto/vectors/*engine*.hex")
    golden_fields, _ = next(f for f in found if f[0]["suite"] == 0x1301)
    golden = bytes.fromhex(golden_fields["dp_secret"])

    ack = _engine.encode_ack([(20, 30), (10, 15), (0, 3)], 25)
    datagram = _engine.parse_frames(bytes.fromhex(golden_fields["frames"]))["datagrams"][0]
    frames = [bytes.fromhex(fields["frames"]) for fields, _ in found] + [
        ack,
        b"\x01",
        b"\x01\x00\x00\x00",
        b"\x31" + _engine.encode_varint(len(datagram)) + datagram + b"\x30tail",
        ack + b"\x31\x00" * 3 + b"\x01",
        _engine.encode_ack([(n * 10, n * 10 + 3) for n in range(40, 8, -1)], 2**40),
    ]
    write(out / "fuzz_frames", frames)

    seeds = []
    for fields, packet in found:  # as sealed, against the largest the vector names
        suite_bit = SUITES.index(fields["suite"])
        if secret(fields["suite"], golden) == bytes.fromhex(fields["dp_secret"]):
            seeds.append(packet_input(suite_bit, [(packet, False)]))
    for bit, suite in enumerate(SUITES):
        key = secret(suite, golden)

        def seal(
            pn: int, body: bytes, phase: bool = False, suite: int = suite, key: bytes = key
        ) -> bytes:
            # the packet number travels in 4 bytes: a gap of up to 2**31 decodes
            return bytes(_engine.seal_short_packet(suite, key, CID, phase, pn, body))

        run = [(seal(pn, frames[pn % len(frames)]), False) for pn in range(6)]
        seeds.append(packet_input(bit | 3 << 2, run))
        reordered = [run[3], run[0], run[2], run[2], run[5], run[1]]
        seeds.append(packet_input(bit | 20 << 2 | 0x80, reordered))
        far = [(seal(5000, b"\x01"), False), (seal(3, b"\x01"), False), (seal(4999, ack), True)]
        seeds.append(packet_input(bit, far))
        seeds.append(packet_input(bit, [(seal(2**31, b"\x01", True), False)]))
    write(out / "fuzz_packet", seeds)
    spans = [  # (payload_base, seq_first, msg_id, msg_len, start, end, stride), stamp, flags
        span_input((40, 9, 3, 40 + 6000, 40, 5040, 1200), 0x123456, 0, bytes(6000)),
        span_input((0, 2**32 - 2, 2**40, 100, 0, 100, 7), 1, 1, bytes(100)),
        span_input((8, 1, 5, 1 << 31, 8, 2008, 100), 0xFFFFFF, 0, bytes(2000)),
        span_input((0, 0, 0, 0, 0, 0, 0), 0, 2, bytes(64)),
    ]
    write(out / "fuzz_span", spans)
    print(f"{out}: {len(frames)} frames, {len(seeds)} packet, {len(spans)} span seeds")


def span_input(fields: tuple[int, ...], stamp: int, flags: int, payload: bytes) -> bytes:
    """fuzz_span's input: 8 u64s (the 7 fields, then unused), the stamp, flags, payload."""
    return struct.pack(">8QIB", *fields, 0, stamp, flags) + payload


if __name__ == "__main__":
    main(Path(sys.argv[1]))
