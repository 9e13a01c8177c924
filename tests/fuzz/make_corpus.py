"""Write the seed corpora (tests/fuzz/corpus/<target>/) from the golden vectors.

Run from the repository root: ``.venv/bin/python tests/fuzz/make_corpus.py``.
Seeds are small, valid inputs of each format; the fuzzers mutate them from there.
Inputs that once broke a target are kept beside them as ``regression-<what>``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import targets  # type: ignore[import-not-found]

from wangate.core.coding import CodingShape
from wangate.core.fec import BlockEncoder
from wangate.core.frames import encode_repair, encode_shard
from wangate.core.message import MessageHeader, message_checksum
from wangate.core.outbound import CodingPolicy
from wangate.engine import _engine

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "proto" / "vectors"
CORPUS = Path(__file__).resolve().parent / "corpus"
CONTROL = (
    "ack",
    "credit",
    "done",
    "hello",
    "ranges_missing",
    "rejected",
    "repair_request",
    "route",
    "taken",
)
DATAGRAMS = ("shard", "shard_critical", "shard_expanded", "repair", "probe")


def hex_vector(name: str) -> bytes:
    """A wire/localapi/probe vector: hex bytes, '#' lines are comments."""
    text = (VECTORS / f"{name}.hex").read_text()
    return bytes.fromhex(" ".join(line for line in text.splitlines() if not line.startswith("#")))


def codec_vector(name: str) -> dict[str, str]:
    fields = {}
    for line in (VECTORS / name).read_text().splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith("#"):
            fields[key] = value
    return fields


def reassembly_seeds() -> list[bytes]:
    """One 100-byte message as shards in order, and with FEC (16-byte symbols, k=4)
    standing in for lost shards, and with a repair symbol that is wrong."""
    meta, payload = b"\x01\x02", bytes(range(75))
    body = MessageHeader("t", 1, False, message_checksum(meta, payload), meta).encode() + payload
    shape = CodingShape(len(body), 16, 4)
    shards = {
        offset: encode_shard(offset // 16, 0, 7, len(body), offset, body[offset : offset + 16])
        for offset in range(0, len(body), 16)
    }
    repairs = []
    for block in range(shape.blocks):
        encoder = BlockEncoder(shape.block_k(block), 16)
        for index in range(shape.block_k(block)):
            start, end = shape.symbol_range(block, index)
            encoder.add_source(index, body[start:end])
        index = shape.block_k(block)
        repairs.append(
            encode_repair(50 + block, 0, 7, len(body), block, index, 4, encoder.repair(index))
        )
    lossy = [shards[0], shards[32], shards[48], shards[80], shards[96], *repairs]
    bad = [*lossy[:-1], lossy[-1][:-1] + bytes([lossy[-1][-1] ^ 1])]
    return [targets.reassembly_input(d) for d in (list(shards.values()), lossy, bad)]


def engine_seeds() -> dict[str, list[bytes]]:
    """The engine's golden packet (opened against the largest it names) and its frames,
    and a few packets sealed with the engine_packet target's keys, every suite."""
    frames, packets = [], []
    for path in sorted(VECTORS.glob("engine_*.hex")):
        text = path.read_text()
        fields = json.loads(text.partition("# fields: ")[2].partition("\n")[0])
        frames.append(bytes.fromhex(fields["frames"]))
        packet = hex_vector(path.stem)
        packets.append(targets.engine_packet_input(fields["suite"], fields["largest_pn"], packet))
    ack = _engine.encode_ack([(20, 30), (10, 15), (0, 3)], 25)
    frames += [ack, b"\x01", b"\x01\x00\x00", b"\x31\x03abc\x30rest"]
    for suite in targets.ENGINE_SUITES:
        key = targets.engine_secret(suite)
        for pn, body in ((0, b"\x01"), (7, ack + b"\x30data"), (2**31 + 5, b"\x00" * 40)):
            packet = _engine.seal_short_packet(suite, key, bytes(range(8)), pn == 7, pn, body)
            packets.append(targets.engine_packet_input(suite, pn - 1, packet))
    listener = [
        targets.engine_listener_input(0, [(0x8000, b"\x30data"), (0xC000, b"\x31\x02ab")]),
        targets.engine_listener_input(1, [(0, b"\xc0" + bytes(40)), (0x8000, ack), (0, b"")]),
        targets.engine_listener_input(0, [(0xC000, b"\x1fjunk"), (0x4000, b"\x40" + bytes(20))]),
        # usual shards of messages 1 and 2 (64 KiB), which the target places
        targets.engine_listener_input(
            0,
            [
                (0x8000, b"\x30" + encode_shard(1, 0, 1, 1 << 16, 100, b"a" * 100)),
                (0x8000, b"\x30" + encode_shard(2, 0, 1, 1 << 16, 200, b"b" * 100)),
                (0xC000, b"\x30" + encode_shard(1, 0, 2, 1 << 16, 300, b"c" * 100)),
            ],
        ),
    ]
    return {
        "engine_frames": frames,
        "engine_packet": packets,
        "engine_listener": listener,
        "engine_shards": engine_shards_seeds(),
        "engine_spans": [
            targets.engine_spans_input(0, 4, (0, 40, 7, 0x123456, 3, 0, 5000, 1200), bytes(6000)),
            targets.engine_spans_input(2, 0, (0, 0, 2**32 - 2, 1, 2**40, 0, 0, 0), b"x"),
            targets.engine_spans_input(1, 0xF0, (1 << 20, 8, 9, 1, 5, 8, 2000, 100), bytes(3000)),
            targets.engine_spans_input(4, 5, (0, 1, 2, 3, 4, 5, 6, 7), bytes(100)),
        ],
    }


def engine_shards_seeds() -> list[bytes]:
    """Two messages (the second critical) as a sender sends them: cut in batches of 64,
    and with FEC (k=8, a repair symbol per block) cut in 8, 1 and 32; then reordered,
    with a duplicate and a datagram cut short, in batches of 16."""
    out = []
    for coding, cuts in ((None, b"\x3f"), (CodingPolicy(k=8, min_repair=1), b"\x07\x00\x1f")):
        sender = targets.receiving_sessions(coding)[0]
        for step, size in enumerate((20_000, 40_000)):
            payload = bytes((step * 31 + i) % 251 for i in range(size))
            meta = b"\x01"
            header = MessageHeader("t", step, step == 1, message_checksum(meta, payload), meta)
            sender.submit(header, payload, 0.0)
        datagrams: list[bytes] = []
        while batch := sender.datagrams_to_send("a", 0.001, 64):
            datagrams += batch
        out.append(targets.engine_shards_input(cuts, datagrams))
    mixed = datagrams[:]
    mixed[3], mixed[9] = mixed[9], mixed[3]
    mixed[20:20] = [mixed[12], mixed[5][:15]]
    out.append(targets.engine_shards_input(b"\x0f", mixed))
    return out


def seeds() -> dict[str, list[bytes]]:
    control = [hex_vector(f"wire_{name}") for name in CONTROL]
    localapi = [hex_vector(path.stem) for path in sorted(VECTORS.glob("localapi_*.hex"))]
    codec = []
    specs = []
    for path in sorted(VECTORS.glob("codec_*.hex")):
        fields = codec_vector(path.name)
        meta, payload = bytes.fromhex(fields["meta"]), bytes.fromhex(fields["payload"])
        codec.append(targets.codec_input(meta, payload))
        specs.append(fields["spec"].encode())
    fec = []
    for k, symbol_bytes, received in ((1, 4, (0,)), (3, 8, (0, 3, 5)), (4, 16, (4, 5, 6, 7))):
        encoder = BlockEncoder(k, symbol_bytes)
        for i in range(k):
            encoder.add_source(i, bytes((i * 37 + j) % 256 for j in range(symbol_bytes)))
        symbols = {
            i: encoder.repair(i)
            if i >= k
            else bytes((i * 37 + j) % 256 for j in range(symbol_bytes))
            for i in received
        }
        fec.append(targets.fec_input(k, symbol_bytes, symbols))
    example = (REPO / "conf" / "example-bj.toml").read_bytes()
    return {
        "datagram": [hex_vector(f"wire_{name}") for name in DATAGRAMS],
        # one byte of chunk-size count, then the stream: whole, and cut in 1..3-byte pieces
        "control_stream": [b"\x00" + frame for frame in control]
        + [b"\x03\x00\x01\x02" + b"".join(control)],
        "message_body": [
            bytes([knob]) + hex_vector(name)
            for name in ("wire_message_body", "wire_message_body_critical")
            for knob in (0, 1)
        ],
        "localapi_frame": [*localapi, b"".join(localapi)],
        "frame_assembler": [b"\x00" + frame for frame in localapi]
        + [b"\x02\x06\x10" + b"".join(localapi)],
        "config_file": [example],
        "codec_frame": codec,
        "codec_spec": sorted(set(specs)),
        "fec_block": fec,
        "reassembly": reassembly_seeds(),
        "metrics_request_head": [
            b"GET /metrics HTTP/1.1\r\nHost: bj:9464\r\nAccept: */*\r\n\r\n",
            b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n",
        ],
        "probe_packet": [hex_vector(path.stem) for path in sorted(VECTORS.glob("probe_*.hex"))],
        **engine_seeds(),
    }


def main() -> None:
    for target, inputs in seeds().items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)  # keeps the regression-* inputs there
        for data in inputs:
            (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)
        print(f"{target}: {len(inputs)} seeds")


if __name__ == "__main__":
    main()
