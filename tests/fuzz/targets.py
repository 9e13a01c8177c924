"""One fuzz target per decoder: bytes in, and either a normal return or a ``WangateError``.

The coverage-guided harnesses (``fuzz_<target>.py``, atheris) and the hypothesis tests
(``tests/test_fuzz_*.py``) call the same functions, so the contract is written once:

* any input: the decoder returns a value or raises a subclass of ``WangateError``;
  every other exception (IndexError, struct.error, MemoryError, msgpack or zstd errors...)
  escapes the target and is a finding;
* a decoded value re-encodes to what decodes to the same value again, and to exactly the
  input bytes where the format has one encoding per value; a broken round trip raises
  ``AssertionError``, also a finding.

Some targets read a few leading bytes as fuzzer-chosen knobs (chunk sizes, a flag that
repairs a checksum) so that the fuzzer gets past CRCs and explores the code behind them.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import struct
import tempfile
import zlib
from collections import deque
from pathlib import Path
from typing import Any

from wangate.codec import decode_tensor, encode_tensor, parse_spec, read_meta
from wangate.codec.frame import CODEC_NONE
from wangate.config import load_config
from wangate.core import frames
from wangate.core.events import Event, MessageReceived
from wangate.core.fec import BlockDecoder, BlockEncoder
from wangate.core.inbound import Reassembly
from wangate.core.message import HEAD_BYTES, decode_header, message_checksum, verify_body
from wangate.errors import LocalProtocolError, RemoteProtocolError, WangateError
from wangate.localapi import protocol
from wangate.localapi.framing import FrameAssembler
from wangate.metrics_http import parse_request_head
from wangate.probe import packets

MAX_PAYLOAD_BYTES = 1 << 20  # local API payload limit the local API targets use
MAX_DECODED_BYTES = 1 << 24  # tensor size limit of the codec target (the client's is larger)
CONFIG_NAME = "wangate.toml"


# ------------------------------------------------------------------ wire datagrams


def _encode_datagram(datagram: frames.Datagram) -> bytes:
    if isinstance(datagram, frames.ShardDatagram):
        return frames.encode_shard(
            datagram.path_seq,
            datagram.sent_stamp,
            datagram.msg_id,
            datagram.msg_len,
            datagram.offset,
            datagram.data,
            datagram.critical,
        )
    if isinstance(datagram, frames.RepairDatagram):
        return frames.encode_repair(
            datagram.path_seq,
            datagram.sent_stamp,
            datagram.msg_id,
            datagram.msg_len,
            datagram.block,
            datagram.index,
            datagram.k,
            datagram.data,
            datagram.critical,
        )
    return frames.encode_probe(datagram.path_seq, datagram.sent_stamp)


def datagram(data: bytes) -> None:
    """``decode_datagram``: shard, repair and probe datagrams."""
    decoded = frames.decode_datagram(data)
    encoded = _encode_datagram(decoded)
    assert frames.decode_datagram(encoded) == decoded
    # Flag bits other than "critical" are ignored on receipt, so only inputs without
    # them have to come back byte for byte.
    # The encoder writes the shortest varints (the decoder takes any length) and the low
    # 32 bits of path_seq and msg_id, which decode to themselves against 0.
    known_flags = 0 if isinstance(decoded, frames.ProbeDatagram) else frames.SHARD_FLAG_CRITICAL
    if data[0] & ~(frames.DGRAM_TYPE_MASK | known_flags) == 0 and len(encoded) == len(data):
        assert encoded == data


# ------------------------------------------------------------------ control stream


def _chunks(data: bytes, sizes: bytes) -> list[bytes]:
    """``data`` cut into pieces whose sizes cycle through ``sizes`` (1..256 each)."""
    pieces = []
    pos = 0
    index = 0
    while pos < len(data):
        size = sizes[index % len(sizes)] + 1 if sizes else len(data)
        pieces.append(data[pos : pos + size])
        pos += size
        index += 1
    return pieces


def _feed_all(decoder: frames.ControlStreamDecoder, pieces: list[bytes]) -> list[object]:
    decoded: list[object] = []
    for piece in pieces:
        decoded.extend(decoder.feed(piece))
    return decoded


def control_stream(data: bytes) -> None:
    """``ControlStreamDecoder`` and ``decode_control_body``: all control frames, Hello too.

    Input: 1 byte n, n chunk sizes, then the stream bytes.
    """
    if not data:
        return
    sizes = data[1 : 1 + data[0]]
    stream = data[1 + data[0] :]
    whole: list[object] | WangateError
    try:
        whole = frames.ControlStreamDecoder().feed(stream)
    except WangateError as exc:
        whole = exc
    try:
        pieces = _feed_all(frames.ControlStreamDecoder(), _chunks(stream, sizes))
    except WangateError:
        # Cut differently, the stream must fail too (possibly later, when more arrived).
        assert isinstance(whole, WangateError)
        raise
    if isinstance(whole, WangateError):
        raise AssertionError(f"fails whole ({whole!r}) but not in pieces")
    assert pieces == whole
    pos = 0
    for frame in whole:
        kind, length = struct.unpack_from("!BI", stream, pos)
        body = stream[pos + 5 : pos + 5 + length]
        pos += 5 + length
        assert isinstance(frame, frames.ControlFrame)
        encoded = frames.encode_control(frame)
        again = frames.ControlStreamDecoder().feed(encoded)
        if isinstance(frame, frames.MessageRejected):
            # The reason is decoded leniently (invalid UTF-8 replaced) and capped on encode.
            assert len(again) == 1 and isinstance(again[0], frames.MessageRejected)
            assert (again[0].msg_id, again[0].code) == (frame.msg_id, frame.code)
        else:
            assert again == [frame]
            assert encoded == bytes([kind]) + struct.pack("!I", length) + body


# ------------------------------------------------------------------ message bodies


def message_body(data: bytes) -> None:
    """``decode_header`` / ``verify_body``. Input: 1 knob byte, then the body.

    Knob bit 0 rewrites the declared checksum to the true one, so the body must verify.
    """
    if not data:
        return
    knob, body = data[0], bytearray(data[1:])
    if knob & 1 and len(body) >= HEAD_BYTES:
        try:
            header, start = decode_header(body)
        except WangateError:
            pass
        else:
            crc = zlib.crc32(bytes(body[start:]), zlib.crc32(header.meta))
            struct.pack_into("!I", body, 12, crc)
    header, start = decode_header(body)
    if knob & 1:
        verified, payload = verify_body(body)
        assert verified == header and bytes(payload) == bytes(body[start:])
    encoded = header.encode()
    assert decode_header(encoded + bytes(body[start:])) == (header, start)
    if body[1] in (0, 1):  # unknown flag bits are ignored, the others round-trip exactly
        assert encoded == bytes(body[:start])
    with contextlib.suppress(WangateError):
        verify_body(body)


# ------------------------------------------------------------------ local API


def _request_round_trip(request: protocol.Request, payload_bytes: int) -> None:
    frame = protocol.split_frame(
        protocol.encode_request(request, payload_bytes) + bytes(payload_bytes), MAX_PAYLOAD_BYTES
    )
    assert frame is not None
    assert protocol.decode_request(frame.header, payload_bytes) == request


def localapi_frame(data: bytes) -> None:
    """``split_frame``, ``decode_prefix``, ``decode_request``, ``decode_reply``."""
    offset = 0
    view = memoryview(data)
    while (frame := protocol.split_frame(view[offset:], MAX_PAYLOAD_BYTES)) is not None:
        offset += frame.frame_bytes
        payload_bytes = frame.prefix.payload_bytes
        try:
            request = protocol.decode_request(frame.header, payload_bytes)
        except protocol.FrameError as exc:
            assert not exc.fatal, exc.code
        else:
            _request_round_trip(request, payload_bytes)
        try:
            reply = protocol.decode_reply(frame.header)
        except protocol.FrameError as exc:
            assert not exc.fatal, exc.code
        else:
            assert protocol.decode_reply(protocol.encode_header(reply)[16:]) == reply


def frame_assembler(data: bytes) -> None:
    """``FrameAssembler`` fed in pieces gives the frames ``split_frame`` cuts from the whole.

    Input: 1 byte n, n chunk sizes, then the stream. A payload whose size is odd is skipped
    (``skip_payload``), an even one received (``expect_payload``).
    """
    if not data:
        return
    sizes = data[1 : 1 + data[0]]
    stream = data[1 + data[0] :]
    expected: list[tuple[protocol.FramePrefix, bytes, bytes]] = []
    offset = 0
    failure: WangateError | None = None
    try:
        while (frame := protocol.split_frame(stream[offset:], MAX_PAYLOAD_BYTES)) is not None:
            expected.append((frame.prefix, frame.header, frame.payload))
            offset += frame.frame_bytes
    except WangateError as exc:
        failure = exc
    assembler = FrameAssembler(MAX_PAYLOAD_BYTES)
    got: list[tuple[protocol.FramePrefix, bytes, bytes]] = []
    pending: tuple[protocol.FramePrefix, bytes] | None = None
    try:
        for piece in _chunks(stream, sizes):
            while piece:
                target = assembler.writable()
                size = min(len(target), len(piece))
                target[:size] = piece[:size]
                assembler.wrote(size)
                piece = piece[size:]
                while True:
                    if pending is not None:
                        payload = assembler.take_payload()
                        if payload is None:
                            break
                        got.append((pending[0], pending[1], bytes(payload)))
                        pending = None
                    head = assembler.next_head()
                    if head is None:
                        break
                    prefix, header = head
                    if prefix.payload_bytes % 2:
                        assembler.skip_payload(prefix.payload_bytes)
                        got.append((prefix, header, b""))
                    else:
                        assembler.expect_payload(prefix.payload_bytes)
                        pending = head
    except WangateError:
        assert failure is not None
        raise
    assert failure is None, f"split_frame fails ({failure!r}), the assembler does not"
    # The assembler hands out a head before its payload arrived: a skipped frame cut
    # short at the end of the stream is one split_frame never returns.
    assert len(expected) <= len(got) <= len(expected) + 1
    assert [(p, h) for p, h, _ in got[: len(expected)]] == [(p, h) for p, h, _ in expected]
    for (prefix, _, payload), (_, _, whole) in zip(got, expected, strict=False):
        assert payload == (b"" if prefix.payload_bytes % 2 else whole)
    if len(got) > len(expected):
        prefix, header, _ = got[-1]
        assert prefix.payload_bytes % 2 and pending is None
        assert stream[offset + 16 : offset + 16 + prefix.header_bytes] == header
        assert len(stream) - offset < 16 + prefix.header_bytes + prefix.payload_bytes


# ------------------------------------------------------------------ config


_config_dir: Path | None = None


def config_dir() -> Path:
    """A folder with certs/ (a CA, sites bj and sh) that fuzzed configurations refer to."""
    global _config_dir
    if _config_dir is None:
        from wangate.certs import create_ca, issue_site_certificate

        folder = Path(tempfile.mkdtemp(prefix="wangate-fuzz-config-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        create_ca(folder / "certs")
        issue_site_certificate(folder / "certs", "bj")
        issue_site_certificate(folder / "certs", "sh")
        _config_dir = folder
    return _config_dir


def config_file(data: bytes) -> None:
    """``load_config`` on arbitrary bytes written to a file next to a real PKI."""
    path = config_dir() / CONFIG_NAME
    path.write_bytes(data)
    config = load_config(path)
    assert config.path == path
    for peer in config.peers:
        for item in peer.paths:
            assert peer.path(item.name) is item
        assert config.peer(peer.name) is peer


# ------------------------------------------------------------------ codec


def codec_input(meta: bytes, payload: bytes, knob: int = 0) -> bytes:
    """The codec target's input for one frame (corpus files and tests build them with this)."""
    return bytes([knob]) + struct.pack("!H", len(meta)) + meta + payload


def codec_frame(data: bytes) -> None:
    """``read_meta`` and ``decode_tensor``: dense, blockwise int8/int4, top-k, split, zstd.

    Input: knob u8, meta length u16, meta, payload. Knob bit 0 sets the meta's payload
    size to the payload's, bit 1 then repairs the CRC, so the fuzzer reaches the codecs.
    """
    if len(data) < 3:
        return
    knob = data[0]
    (meta_len,) = struct.unpack_from("!H", data, 1)
    meta = bytearray(data[3 : 3 + meta_len])
    payload = data[3 + meta_len :]
    if knob & 1 and len(meta) >= 28:
        struct.pack_into("<Q", meta, 16, len(payload))
    if knob & 2 and len(meta) >= 28:
        crc = zlib.crc32(payload, zlib.crc32(bytes(meta[:-4])))
        struct.pack_into("<I", meta, len(meta) - 4, crc)
    info = read_meta(bytes(meta))
    array = decode_tensor(bytes(meta), payload, max_decoded_bytes=MAX_DECODED_BYTES)
    assert array.shape == info.shape
    assert array.nbytes == info.decoded_bytes
    if info.codec == CODEC_NONE and not info.zstd:
        # One encoding per value: the lossless frame comes back byte for byte.
        encoded = encode_tensor(array, "none", bfloat16=info.bfloat16)
        assert encoded.meta == bytes(meta)
        assert bytes(encoded.payload) == payload
    elif info.codec == CODEC_NONE:
        encoded = encode_tensor(array, "zstd", bfloat16=info.bfloat16)
        again = decode_tensor(encoded.meta, encoded.payload)
        assert again.tobytes() == array.tobytes() and again.shape == array.shape


def codec_spec(data: bytes) -> None:
    """``parse_spec`` on any text; a parsed spec prints to a string that parses back to it."""
    text = data.decode("utf-8", errors="replace")
    spec = parse_spec(text)
    canonical = str(spec)
    assert parse_spec(canonical) == spec
    assert str(parse_spec(canonical)) == canonical


# ------------------------------------------------------------------ probe packets


def probe_packet(data: bytes) -> None:
    """``packets.decode``: a well-formed probe packet has exactly one encoding."""
    packet = packets.decode(data)
    assert packets.encode(packet) == data


# ------------------------------------------------------------------ FEC blocks


def fec_input(k: int, symbol_bytes: int, symbols: dict[int, bytes]) -> bytes:
    """The fec_block target's input for these symbols (corpus files and tests use it)."""
    records = b"".join(bytes([i, len(data)]) + data for i, data in symbols.items())
    return bytes([k - 1, symbol_bytes - 1]) + records


def fec_block(data: bytes) -> None:
    """``BlockDecoder``: symbols as the wire delivers them rebuild the block they imply.

    Input: k - 1 u8, symbol_bytes - 1 u8 (mod 32), then (index u8, length u8, bytes)
    records. Whatever k symbols the decoder uses fix the whole block (an MDS code), so
    re-encoding the rebuilt sources must give back each of those symbols.
    """
    if len(data) < 2:
        return
    k, symbol_bytes = data[0] % 255 + 1, data[1] % 32 + 1
    decoder = BlockDecoder(k, symbol_bytes)
    kept: dict[int, bytes] = {}
    pos = 2
    while pos + 2 <= len(data):
        index, length = data[pos], data[pos + 1]
        symbol = data[pos + 2 : pos + 2 + length]
        pos += 2 + length
        decoder.add(index, symbol)
        if index not in kept and (index < k or len(kept) < k):
            kept[index] = symbol.ljust(symbol_bytes, b"\0")
    assert decoder.symbol_count == len(kept)
    if not decoder.can_decode:
        return
    recovered = decoder.recover()
    assert sorted(recovered) == decoder.missing_sources()
    sources = {i: kept[i] for i in range(k) if i in kept} | recovered
    assert sorted(sources) == list(range(k))
    assert all(len(symbol) == symbol_bytes for symbol in sources.values())
    encoder = BlockEncoder(k, symbol_bytes)
    for index, symbol in sources.items():
        encoder.add_source(index, symbol)
    for index in sorted(kept)[:k]:
        if index >= k:
            assert encoder.repair(index) == kept[index]


# ------------------------------------------------------------------ reassembly

REASSEMBLY_MAX_MESSAGE_BYTES = 4096
REASSEMBLY_WINDOW_BYTES = 16384


def reassembly_input(datagrams: list[bytes]) -> bytes:
    """The reassembly target's input for these datagrams."""
    return b"".join(struct.pack("!H", len(d)) + d for d in datagrams)


def reassembly(data: bytes) -> None:
    """``Reassembly``: what a peer's datagrams (shards and FEC repair symbols) build.

    Input: (length u16, datagram) records, one second apart. Datagrams that do not
    decode are dropped, as the session drops them. Every message delivered must verify,
    and the bytes held stay within the window.
    """
    events: deque[Event] = deque()
    inbound = Reassembly(
        REASSEMBLY_MAX_MESSAGE_BYTES, REASSEMBLY_WINDOW_BYTES, events, idle_timeout_s=30.0
    )
    pos = 0
    now = 0.0
    while pos + 2 <= len(data):
        (size,) = struct.unpack_from("!H", data, pos)
        raw = data[pos + 2 : pos + 2 + size]
        pos += 2 + size
        now += 1.0
        try:
            datagram = frames.decode_datagram(raw)
        except RemoteProtocolError:
            continue
        if isinstance(datagram, frames.ShardDatagram):
            inbound.accept_shard(datagram, now)
        elif isinstance(datagram, frames.RepairDatagram):
            inbound.accept_repair(datagram, now)
        inbound.expire(now)
        limit = REASSEMBLY_WINDOW_BYTES + REASSEMBLY_MAX_MESSAGE_BYTES
        assert 0 <= inbound.held_bytes <= limit
    for event in events:
        if isinstance(event, MessageReceived):
            header = event.header
            assert message_checksum(header.meta, event.payload) == header.checksum
            assert event.msg_id in inbound.completed


# ------------------------------------------------------------------ metrics HTTP


def metrics_request_head(data: bytes) -> None:
    """``parse_request_head``: (method, path) or None for any bytes, never an exception."""
    parsed = parse_request_head(data)
    if parsed is not None:
        method, path = parsed
        assert method.isalpha() and path.startswith("/") and "?" not in path


# ------------------------------------------------------------------ the engine (C)

VARINT_MAX = 2**62 - 1
ENGINE_SUITES = (0x1301, 0x1302, 0x1303)


def engine_secret(suite: int) -> bytes:
    """The engine_packet target's keys, the same as wangate/engine/fuzz/fuzz_packet.c's:
    AES-128-GCM the golden vector's dp_secret, the others byte i = (suite + 31 i) % 256."""
    if suite == 0x1301:
        text = (
            (Path(__file__).resolve().parents[2] / "proto" / "vectors")
            .joinpath("engine_short_packet_aes128gcm.hex")
            .read_text()
        )
        return bytes.fromhex(text.split('"dp_secret": "')[1].split('"')[0])
    return bytes((suite + 31 * i) % 256 for i in range(48 if suite == 0x1302 else 32))


def _engine_module() -> Any:
    """``wangate.engine._engine``, imported on first use: an engine built with coverage for
    atheris (fuzz_engine_*.py) loads only once the fuzzer runs."""
    from wangate.engine import _engine

    return _engine


def engine_frames(data: bytes) -> None:
    """``_engine.parse_frames`` and ``decode_varint`` through the binding: a parsed ACK
    encodes (``encode_ack``) to a frame that parses back to it; a varint to its value."""
    _engine = _engine_module()
    with contextlib.suppress(RemoteProtocolError):  # truncated: the frames are refused too
        value, size = _engine.decode_varint(data)
        assert size == 1 << (data[0] >> 6) and 0 <= value <= VARINT_MAX
        shortest = _engine.encode_varint(value)
        assert len(shortest) <= size and _engine.decode_varint(shortest) == (value, len(shortest))
    parsed = _engine.parse_frames(data)
    assert sum(len(d) for d in parsed["datagrams"]) < len(data)
    assert parsed["ack_eliciting"] or not parsed["datagrams"]
    ack = parsed["ack"]
    if ack is not None:
        frame = _engine.encode_ack(ack["ranges"], ack["ack_delay"])
        assert _engine.parse_frames(frame) == {"ack_eliciting": False, "ack": ack, "datagrams": []}


def engine_packet_input(suite: int, largest_pn: int, packet: bytes) -> bytes:
    """The engine_packet target's input: suite index, largest_pn + 1 (u64), the packet."""
    return bytes([ENGINE_SUITES.index(suite)]) + struct.pack(">Q", largest_pn + 1) + packet


def engine_packet(data: bytes) -> None:
    """``_engine.open_short_packet`` with fixed keys (byte 0: the suite, bytes 1-8: the
    largest packet number received + 1), then ``Received``: a packet that opens seals
    again to exactly its bytes, and its packet number is new once, then not."""
    _engine = _engine_module()
    if len(data) < 9:
        return
    suite = ENGINE_SUITES[data[0] % 4 % 3]
    largest = struct.unpack(">Q", data[1:9])[0] % (VARINT_MAX + 2) - 1
    packet = data[9:]
    key = engine_secret(suite)
    key_phase, pn, frames_ = _engine.open_short_packet(suite, key, packet, largest)
    assert len(frames_) == len(packet) - 29
    if pn > VARINT_MAX:  # decoded next to the largest packet number there can be
        return
    resealed = _engine.seal_short_packet(suite, key, packet[1:9], bool(key_phase), pn, frames_)
    assert resealed == packet
    received = _engine.Received()
    assert received.is_new(pn)
    assert received.add(pn, True, 0.0, 0.025)
    assert not received.is_new(pn) and not received.add(pn, True, 0.0, 0.025)
    assert received.ack(0.0)[0] == [(pn, pn)]
    _engine.parse_frames(frames_)


class _ListenerSockets:
    """A listening socket and two dialers on loopback, made once for every input."""

    def __init__(self) -> None:
        def bound() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            return sock

        self.listening = bound()
        self.dialing = (bound(), bound())
        atexit.register(lambda: [s.close() for s in (self.listening, *self.dialing)])


_listener_sockets: list[_ListenerSockets] = []
LISTENER_SECRETS = ((bytes(range(32)), bytes(range(32, 64))), (bytes(32), bytes([1]) * 32))


def engine_listener_input(knob: int, packets: list[tuple[int, bytes]]) -> bytes:
    """The engine_listener target's input: a knob byte, then (u16 head, body) each."""
    return bytes([knob]) + b"".join(struct.pack(">H", h | len(b)) + b for h, b in packets)


def engine_listener(data: bytes) -> None:
    """``ListenerReader`` over real sockets: two channels routed on a listening socket,
    up to 32 packets sent to it from two dialers, read to empty. Byte 0 bit 0: UDP GRO
    off. Each packet: a u16 head (bit 15: the body is frames, sealed as dialer bit 14's
    path would seal them; bits 0-10: the body's length), then the body. What no route
    claims must come back exactly as sent, in order, with its sender; each path's
    datagrams are placed (messages 1 and 2, 64 KiB) where the read left them exactly as
    from their bytes."""
    _engine = _engine_module()
    if not _listener_sockets:
        _listener_sockets.append(_ListenerSockets())
    sockets = _listener_sockets[0]
    suite = ENGINE_SUITES[0]
    here = sockets.listening.getsockname()
    reader = _engine.ListenerReader(sockets.listening.fileno(), gro=not data[:1] or not data[0] & 1)
    routed = set()
    for index, (out, back) in enumerate(LISTENER_SECRETS):
        peer = sockets.dialing[index].getsockname()
        channel = _engine.PathChannel(
            sockets.listening.fileno(), peer, suite, back, out, 1452, 0.01
        )
        reader.add(channel, index)
        routed.add(channel.recv_cid)
    sent: list[tuple[bytes, Any]] = []
    pos, pn = 1, 0
    while pos + 2 <= len(data) and len(sent) < 32:
        (head,) = struct.unpack_from(">H", data, pos)
        body = data[pos + 2 : pos + 2 + (head & 0x7FF)]
        pos += 2 + len(body)
        dialer = sockets.dialing[head >> 14 & 1]
        if head & 0x8000:
            dp_secret, cid = _engine.derive_data_plane(suite, LISTENER_SECRETS[head >> 14 & 1][0])
            body = _engine.seal_short_packet(suite, dp_secret, cid, False, pn, body)
            pn += 1
        dialer.sendto(body, here)
        sent.append((body, dialer.getsockname()))
    foreign: list[tuple[bytes, Any]] = []
    owners: list[int] = []
    while True:
        groups, others, count, packets = reader.read(1.0)
        foreign += others
        assert packets >= count and packets >= len(others)
        for owner, datagrams, errors in groups:
            assert owner in (0, 1) and all(isinstance(d, bytes) for d in datagrams)
            assert all(isinstance(e, str) for e in errors)
            owners.append(owner)
            # shards placed from where the read left them, as from their bytes
            in_place = {1: bytearray(1 << 16), 2: bytearray(1 << 16)}
            from_bytes = {1: bytearray(1 << 16), 2: bytearray(1 << 16)}
            expected_placed = _engine.place_shards(list(datagrams), from_bytes, 0, 0)
            assert _engine.place_shards(datagrams, in_place, 0, 0) == expected_placed
            assert in_place == from_bytes
        if count == 0:
            break
    expected = [
        (body, sender)
        for body, sender in sent
        if len(body) < 9 or body[0] & 0x80 or body[1:9] not in routed
    ]
    assert foreign == expected, (foreign, expected)
    assert reader.stats()["foreign_packets"] == len(expected)


def receiving_sessions(coding: Any = None) -> tuple[Any, Any, Any]:
    """A sending session and two receiving ones in the same state, one path "a" up
    between them (1200-byte datagrams): the engine_shards target's, and its tests'."""
    from wangate.core.session import PeerSession

    def up(site: str, peer: str) -> PeerSession:
        kw: dict[str, Any] = {} if coding is None else {"coding": coding}
        session = PeerSession(
            site, peer, max_message_bytes=1 << 22, inbox_window_bytes=1 << 23, now=0, **kw
        )
        session.path_up("a", datagram_bytes=1200, now=0.0)
        return session

    sender, one, batched = up("bj", "sh"), up("sh", "bj"), up("sh", "bj")
    hello = sender.control_to_send("a", 0.0)
    for receiver in (one, batched):
        for frame in frames.ControlStreamDecoder().feed(hello):
            receiver.handle_control("a", frame, 0.0)
    for frame in frames.ControlStreamDecoder().feed(one.control_to_send("a", 0.0)):
        sender.handle_control("a", frame, 0.0)
    batched.control_to_send("a", 0.0)
    return sender, one, batched


def received_events(session: Any) -> list[object]:
    """The events ``session`` queued, a delivered message's payload as bytes."""
    out: list[object] = []
    for event in iter(session.next_event, None):
        if isinstance(event, MessageReceived):
            out.append(("received", event.msg_id, event.header, bytes(event.payload)))
        else:
            out.append(event)
    return out


def engine_shards_input(cuts: bytes, datagrams: list[bytes]) -> bytes:
    """The engine_shards target's input: a byte counting the cut bytes, those, then
    the datagrams as the reassembly target takes them."""
    return bytes([len(cuts)]) + cuts + reassembly_input(datagrams)


def engine_shards(data: bytes) -> None:
    """``place_shards`` under the session: a peer's datagrams handled in batches (the
    batch sizes cycle through the cut bytes, 1..256) leave what they leave handled one
    at a time: the same errors, events, control frames owed and bytes held."""
    if not data:
        return
    cuts = data[1 : 1 + data[0]] or b"\x40"
    _, one, batched = receiving_sessions()
    datagrams: list[bytes] = []
    pos = 1 + data[0]
    while pos + 2 <= len(data) and len(datagrams) < 512:
        (size,) = struct.unpack_from("!H", data, pos)
        datagrams.append(data[pos + 2 : pos + 2 + size])
        pos += 2 + size
    now, start = 0.01, 0
    for i in range(len(datagrams)):
        batch = datagrams[start : start + cuts[i % len(cuts)] + 1]
        if not batch:
            break
        start += len(batch)
        now += 0.002
        handle_both(one, batched, batch, now)
        assert batched.status() == one.status()
        assert batched._inbound.held_bytes == one._inbound.held_bytes


def handle_both(one: Any, batched: Any, batch: list[bytes], now: float) -> None:
    """``batch`` to ``one`` a datagram at a time and to ``batched`` in one call: the
    same errors, events and control frames owed."""
    expected = []
    for datagram in batch:
        try:
            one.handle_datagram("a", datagram, now)
        except RemoteProtocolError as exc:
            expected.append(str(exc))
    assert [str(e) for e in batched.handle_datagrams("a", batch, now)] == expected
    assert received_events(batched) == received_events(one)
    assert batched.control_to_send("a", now) == one.control_to_send("a", now)


SPAN_HEAD = struct.Struct("!BB8Q")  # knob, msg_len choice, then 8 u64 fields
SPAN_MSG_LENS = (1, 63, 64, 16383, 16384, 1 << 20, (1 << 30) - 1, 1 << 30, (1 << 62) - 1)


def engine_spans_input(knob: int, choice: int, fields: tuple[int, ...], payload: bytes) -> bytes:
    """The engine_spans target's input: knob, msg_len choice, 8 u64s, then the payload."""
    return SPAN_HEAD.pack(knob, choice, *fields) + payload


def engine_spans(data: bytes) -> None:
    """A ``ShardSpan`` framed by the engine: its datagrams are ``encode_shard``'s, one by
    one, or it is refused (``LocalProtocolError``) exactly when its fields describe no
    run of shards; queued into a channel, as many go in as fit. Knob bit 0: the fields
    as they come (mostly refused); else folded into a valid span's ranges; bit 1:
    critical; bit 2: a 10-item tuple that is not one (a list)."""
    from wangate.core.datagrams import ShardSpan
    from wangate.engine._engine import encode_shard_span

    if len(data) < SPAN_HEAD.size:
        return
    knob, choice, *raw = SPAN_HEAD.unpack_from(data)
    payload = data[SPAN_HEAD.size :]
    msg_len = SPAN_MSG_LENS[choice % len(SPAN_MSG_LENS)] if choice < 0xF0 else raw[0]
    base, seq, stamp, msg_id, start, end, stride = raw[1:]
    if not knob & 1:  # folded into range: mostly valid
        base = base % max(msg_len, 1)
        start = base + start % max(min(len(payload), msg_len - base), 1)
        end = start + 1 + end % max(min(len(payload), msg_len - base) - (start - base), 1)
        stamp &= 0xFFFFFF
        stride = 1 + stride % 3000
    span = ShardSpan(payload, base, seq, stamp, msg_id, msg_len, start, end, stride, bool(knob & 2))
    valid = (
        0 < stride <= 1 << 20
        and base <= start < end <= msg_len < 1 << 62
        and end - base <= len(payload)
        and stamp <= 0xFFFFFF
        and -(-(end - start) // stride) <= 4096
        and seq + -(-(end - start) // stride) <= 1 << 64
    )
    try:
        datagrams = encode_shard_span(span)
    except LocalProtocolError:
        assert not valid, span[1:]
        return
    assert valid, span[1:]
    view = memoryview(payload)
    expected = []
    for i, offset in enumerate(range(start, end, stride)):
        piece = view[offset - base : min(offset + stride, end) - base]
        expected.append(
            frames.encode_shard(seq + i, stamp, msg_id, msg_len, offset, piece, span.critical)
        )
    assert datagrams == expected
    channel = _span_channel()
    fits = max(len(d) for d in datagrams) <= channel.datagram_bytes
    try:
        queued = channel.queue_many([span] if not knob & 4 else [list(span)])  # type: ignore[list-item]
    except LocalProtocolError:
        assert not fits
        return
    except TypeError:
        assert knob & 4
        return
    assert fits and not knob & 4 and queued == min(len(datagrams), 256) == len(channel)


def _span_channel() -> Any:
    """A fresh channel (an empty queue) on a socket made once, to a peer that never reads."""
    from wangate.engine import PathChannel

    if not _span_sockets:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        atexit.register(sock.close)
        _span_sockets.append(sock)
    sock = _span_sockets[0]
    secret = bytes(range(32))
    return PathChannel(sock.fileno(), sock.getsockname(), 0x1301, secret, secret, 1452, 0.01)


_span_sockets: list[socket.socket] = []


TARGETS = {
    "datagram": datagram,
    "control_stream": control_stream,
    "message_body": message_body,
    "localapi_frame": localapi_frame,
    "frame_assembler": frame_assembler,
    "config_file": config_file,
    "codec_frame": codec_frame,
    "codec_spec": codec_spec,
    "probe_packet": probe_packet,
    "fec_block": fec_block,
    "reassembly": reassembly,
    "metrics_request_head": metrics_request_head,
    "engine_frames": engine_frames,
    "engine_packet": engine_packet,
    "engine_listener": engine_listener,
    "engine_shards": engine_shards,
    "engine_spans": engine_spans,
}


def run(name: str, data: bytes) -> None:
    """Target ``name`` on ``data``, where a ``WangateError`` is a normal outcome."""
    with contextlib.suppress(WangateError):
        TARGETS[name](data)
