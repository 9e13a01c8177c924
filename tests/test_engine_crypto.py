"""The engine's keys and packets: RFC 9001 Appendix A vectors byte for byte, round
trips for every suite, every damaged or truncated packet refused, key updates and
wire compatibility with aioquic, and the data-plane golden vector (proto/engine.md).

Regenerate the golden vector (only if proto/engine.md changes):
.venv/bin/python -m tests.test_engine_crypto
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from aioquic.quic.crypto import CryptoContext, hkdf_expand_label, next_key_phase
from aioquic.tls import CipherSuite
from cryptography.hazmat.primitives import hashes
from hypothesis import given, settings
from hypothesis import strategies as st

from wangate.engine import _engine
from wangate.errors import RemoteProtocolError

VECTORS = Path(__file__).resolve().parent.parent / "proto" / "vectors"
GOLDEN = VECTORS / "engine_short_packet_aes128gcm.hex"

AES128, AES256, CHACHA = 0x1301, 0x1302, 0x1303
SUITES = (AES128, AES256, CHACHA)
HASH_LEN = {AES128: 32, AES256: 48, CHACHA: 32}
KEY_LEN = {AES128: 16, AES256: 32, CHACHA: 32}
HASHES = {AES128: hashes.SHA256(), AES256: hashes.SHA384(), CHACHA: hashes.SHA256()}
CID = bytes.fromhex("0a1b2c3d4e5f6071")
FAST = settings(max_examples=200, deadline=None)


def h(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


def secret_of(suite: int, seed: int = 1) -> bytes:
    return hashlib.sha512(bytes([seed, suite & 0xFF])).digest()[: HASH_LEN[suite]]


def py_expand_label(secret: bytes, label: bytes, context: bytes, length: int) -> bytes:
    """HKDF-Expand-Label (RFC 8446 §7.1) in plain Python over SHA-256, as a reference."""
    full = b"tls13 " + label
    info = length.to_bytes(2, "big") + bytes([len(full)]) + full + bytes([len(context)]) + context
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(secret, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


# ------------------------------------------------------------------ RFC 9001 Appendix A

INITIAL_SALT = h("38762cf7f55934b34d179ae6a4c80cadccbb7f0a")  # RFC 9001 §5.2
CLIENT_DCID = h("8394c8f03e515708")


def initial_secrets() -> tuple[bytes, bytes]:
    # HKDF-Extract(salt, DCID) is HMAC(salt, DCID) (RFC 5869 §2.2)
    initial = hmac.new(INITIAL_SALT, CLIENT_DCID, hashlib.sha256).digest()
    assert initial == h("7db5df06e7a69e432496adedb00851923595221596ae2ae9fb8115c1e9ed0a44")
    client = _engine.hkdf_expand_label(AES128, initial, "client in", 32)
    server = _engine.hkdf_expand_label(AES128, initial, "server in", 32)
    return client, server


def test_a1_initial_secrets_and_keys() -> None:
    client, server = initial_secrets()
    assert client == h("c00cf151ca5be075ed0ebfb5c80323c42d6b7db67881289af4008f1f6c357aea")
    assert server == h("3c199828fd139efd216c155ad844cc81fb82fa8d7446fa7d78be803acdda951b")
    assert _engine.derive_packet_keys(AES128, client) == (
        h("1f369613dd76d5467730efcbe3b1a22d"),
        h("fa044b2f42a3fd3b46fb255c"),
        h("9f50449e04a0e810283a1e9933adedd2"),
    )
    assert _engine.derive_packet_keys(AES128, server) == (
        h("cf3a5331653c364c88f0f379b6067e37"),
        h("0ac1493ca1905853b0bba03e"),
        h("c206b8d9b9f0f37644430b490eeaa314"),
    )


A2_HEADER = h("c300000001088394c8f03e5157080000449e00000002")
A2_CRYPTO_FRAME = h(
    """
    060040f1010000ed0303ebf8fa56f12939b9584a3896472ec40bb863cfd3e868
    04fe3a47f06a2b69484c00000413011302010000c000000010000e00000b6578
    616d706c652e636f6dff01000100000a00080006001d00170018001000070005
    04616c706e000500050100000000003300260024001d00209370b2c9caa47fba
    baf4559fedba753de171fa71f50f1ce15d43e994ec74d748002b000302030400
    0d0010000e0403050306030203080408050806002d00020101001c0002400100
    3900320408ffffffffffffffff05048000ffff07048000ffff08011001048000
    75300901100f088394c8f03e51570806048000ffff
    """
)
A2_PROTECTED = h(
    """
    c000000001088394c8f03e5157080000449e7b9aec34d1b1c98dd7689fb8ec11
    d242b123dc9bd8bab936b47d92ec356c0bab7df5976d27cd449f63300099f399
    1c260ec4c60d17b31f8429157bb35a1282a643a8d2262cad67500cadb8e7378c
    8eb7539ec4d4905fed1bee1fc8aafba17c750e2c7ace01e6005f80fcb7df6212
    30c83711b39343fa028cea7f7fb5ff89eac2308249a02252155e2347b63d58c5
    457afd84d05dfffdb20392844ae812154682e9cf012f9021a6f0be17ddd0c208
    4dce25ff9b06cde535d0f920a2db1bf362c23e596d11a4f5a6cf3948838a3aec
    4e15daf8500a6ef69ec4e3feb6b1d98e610ac8b7ec3faf6ad760b7bad1db4ba3
    485e8a94dc250ae3fdb41ed15fb6a8e5eba0fc3dd60bc8e30c5c4287e53805db
    059ae0648db2f64264ed5e39be2e20d82df566da8dd5998ccabdae053060ae6c
    7b4378e846d29f37ed7b4ea9ec5d82e7961b7f25a9323851f681d582363aa5f8
    9937f5a67258bf63ad6f1a0b1d96dbd4faddfcefc5266ba6611722395c906556
    be52afe3f565636ad1b17d508b73d8743eeb524be22b3dcbc2c7468d54119c74
    68449a13d8e3b95811a198f3491de3e7fe942b330407abf82a4ed7c1b311663a
    c69890f4157015853d91e923037c227a33cdd5ec281ca3f79c44546b9d90ca00
    f064c99e3dd97911d39fe9c5d0b23a229a234cb36186c4819e8b9c5927726632
    291d6a418211cc2962e20fe47feb3edf330f2c603a9d48c0fcb5699dbfe58964
    25c5bac4aee82e57a85aaf4e2513e4f05796b07ba2ee47d80506f8d2c25e50fd
    14de71e6c418559302f939b0e1abd576f279c4b2e0feb85c1f28ff18f58891ff
    ef132eef2fa09346aee33c28eb130ff28f5b766953334113211996d20011a198
    e3fc433f9f2541010ae17c1bf202580f6047472fb36857fe843b19f5984009dd
    c324044e847a4f4a0ab34f719595de37252d6235365e9b84392b061085349d73
    203a4a13e96f5432ec0fd4a1ee65accdd5e3904df54c1da510b0ff20dcc0c77f
    cb2c0e0eb605cb0504db87632cf3d8b4dae6e705769d1de354270123cb11450e
    fc60ac47683d7b8d0f811365565fd98c4c8eb936bcab8d069fc33bd801b03ade
    a2e1fbc5aa463d08ca19896d2bf59a071b851e6c239052172f296bfb5e724047
    90a2181014f3b94a4e97d117b438130368cc39dbb2d198065ae3986547926cd2
    162f40a29f0c3c8745c0f50fba3852e566d44575c29d39a03f0cda721984b6f4
    40591f355e12d439ff150aab7613499dbd49adabc8676eef023b15b65bfc5ca0
    6948109f23f350db82123535eb8a7433bdabcb909271a6ecbcb58b936a88cd4e
    8f2e6ff5800175f113253d8fa9ca8885c2f552e657dc603f252e1a8e308f76f0
    be79e2fb8f5d5fbbe2e30ecadd220723c8c0aea8078cdfcb3868263ff8f09400
    54da48781893a7e49ad5aff4af300cd804a6b6279ab3ff3afb64491c85194aab
    760d58a606654f9f4400e8b38591356fbf6425aca26dc85244259ff2b19c41b9
    f96f3ca9ec1dde434da7d2d392b905ddf3d1f9af93d1af5950bd493f5aa731b4
    056df31bd267b6b90a079831aaf579be0a39013137aac6d404f518cfd4684064
    7e78bfe706ca4cf5e9c5453e9f7cfd2b8b4c8d169a44e55c88d4a9a7f9474241
    e221af44860018ab0856972e194cd934
    """
)


def test_a2_client_initial_exact_bytes() -> None:
    client, _ = initial_secrets()
    # the CRYPTO frame padded with PADDING frames to 1162 bytes: 1200 once protected
    payload = A2_CRYPTO_FRAME + bytes(1162 - len(A2_CRYPTO_FRAME))
    sealed = _engine.seal_packet(AES128, client, A2_HEADER, 18, 2, payload)
    assert len(sealed) == 1200
    assert sealed == A2_PROTECTED
    # RFC 9001 §A.2: sample d1b1c98dd7689fb8ec11d242b123dc9b gives mask 437b9aec36
    mask = _engine.header_protection_mask(AES128, client, h("d1b1c98dd7689fb8ec11d242b123dc9b"))
    assert mask == h("437b9aec36")


A3_HEADER = h("c1000000010008f067a5502a4262b50040750001")
A3_PAYLOAD = h(
    """
    02000000000600405a020000560303eefce7f7b37ba1d1632e96677825ddf739
    88cfc79825df566dc5430b9a045a1200130100002e00330024001d00209d3c94
    0d89690b84d08a60993c144eca684d1081287c834d5311bcf32bb9da1a002b00
    020304
    """
)
A3_PROTECTED = h(
    """
    cf000000010008f067a5502a4262b5004075c0d95a482cd0991cd25b0aac406a
    5816b6394100f37a1c69797554780bb38cc5a99f5ede4cf73c3ec2493a1839b3
    dbcba3f6ea46c5b7684df3548e7ddeb9c3bf9c73cc3f3bded74b562bfb19fb84
    022f8ef4cdd93795d77d06edbb7aaf2f58891850abbdca3d20398c276456cbc4
    2158407dd074ee
    """
)


def test_a3_server_initial_exact_bytes() -> None:
    _, server = initial_secrets()
    assert _engine.seal_packet(AES128, server, A3_HEADER, 18, 1, A3_PAYLOAD) == A3_PROTECTED
    mask = _engine.header_protection_mask(AES128, server, h("2cd0991cd25b0aac406a5816b6394100"))
    assert mask == h("2ec0d8356a")


A5_SECRET = h("9ac312a7f877468ebe69422748ad00a15443f18203a07d6060f688f30f21632b")


def test_a5_chacha20_short_header_exact_bytes() -> None:
    assert _engine.derive_packet_keys(CHACHA, A5_SECRET) == (
        h("c6d98ff3441c3fe1b2182094f69caa2ed4b716b65488960a7a984979fb23e1c8"),
        h("e0459b3474bdd0e44a41c144"),
        h("25a282b9e82f06f21f488917a4fc8f1b73573685608597d0efcb076b0ab7a7a4"),
    )
    ku = _engine.next_secret(CHACHA, A5_SECRET)
    assert ku == h("1223504755036d556342ee9361d253421a826c9ecdf3c7148684b36b714881f9")
    assert _engine.hkdf_expand_label(CHACHA, A5_SECRET, "quic ku", 32) == ku
    # a 3-byte packet number 654360564 and no connection ID; the payload a PING frame
    sealed = _engine.seal_packet(CHACHA, A5_SECRET, h("4200bff4"), 1, 654360564, b"\x01")
    assert sealed == h("4cfe4189655e5cd55c41f69080575d7999c25a5bfb")
    mask = _engine.header_protection_mask(CHACHA, A5_SECRET, h("5e5cd55c41f69080575d7999c25a5bfb"))
    assert mask == h("aefefe7d03")


def test_hkdf_expand_label_matches_a_plain_python_one() -> None:
    secret = secret_of(AES128)
    for label, context, length in (("quic key", b"", 16), ("x", b"ctx", 100), ("l" * 249, b"", 7)):
        ours = _engine.hkdf_expand_label(AES128, secret, label, length, context)
        assert ours == py_expand_label(secret, label.encode(), context, length)


# ------------------------------------------------------------------ packets


def plain_header(key_phase: int, pn: int, cid: bytes = CID) -> bytes:
    return bytes([0x43 | key_phase << 2]) + cid + (pn & 0xFFFFFFFF).to_bytes(4, "big")


@pytest.mark.parametrize("suite", SUITES)
@pytest.mark.parametrize("frames", [b"", b"\x01", bytes(range(256)) * 5])
@pytest.mark.parametrize("key_phase", [0, 1])
def test_open_seal_round_trip(suite: int, frames: bytes, key_phase: int) -> None:
    secret = secret_of(suite)
    for pn in (0, 1, 0xFFFFFFFF, 0x1_0000_0005, 2**62 - 1):
        packet = _engine.seal_short_packet(suite, secret, CID, key_phase, pn, frames)
        assert len(packet) == 13 + len(frames) + 16
        assert packet[1:9] == CID  # the connection ID is never masked
        assert packet[0] & 0xC0 == 0x40  # short header, fixed bit: unprotected bits
        assert _engine.open_short_packet(suite, secret, packet, pn - 1) == (key_phase, pn, frames)


def test_packet_numbers_decode_against_the_largest_seen() -> None:
    secret = secret_of(AES128)
    packet = _engine.seal_short_packet(AES128, secret, CID, 0, 0x1_0000_0002, b"\x01")
    # only the low 32 bits travel: the receiver places them near its largest, and a
    # receiver that places them elsewhere gets another nonce: the packet does not verify
    with pytest.raises(RemoteProtocolError, match="does not verify"):
        _engine.open_short_packet(AES128, secret, packet, -1)
    assert _engine.open_short_packet(AES128, secret, packet, 0xFFFF_FFF0)[1] == 0x1_0000_0002


def test_rfc9000_a3_packet_number_examples() -> None:
    # RFC 9000 §A.3's example, and both sides of the window
    assert _engine.decode_packet_number(0xA82F30EA, 0x9B32, 16) == 0xA82F9B32
    assert _engine.decode_packet_number(-1, 5, 32) == 5
    assert _engine.decode_packet_number(0x1_0000_0000, 0xFFFF_FFFF, 32) == 0xFFFF_FFFF
    assert _engine.decode_packet_number(0xFFFF_FFFF, 0, 32) == 0x1_0000_0000
    assert _engine.decode_packet_number(2**62 - 2, 0xFFFF_FFFF, 32) == 2**62 - 1
    assert _engine.decode_packet_number(200, 0x10, 8) == 0x110


@pytest.mark.parametrize("suite", SUITES)
def test_every_flipped_bit_is_refused(suite: int) -> None:
    secret = secret_of(suite)
    packet = _engine.seal_short_packet(suite, secret, CID, 1, 77, b"\x01" + b"\x00" * 10)
    for i in range(len(packet)):
        for bit in range(8):
            damaged = bytearray(packet)
            damaged[i] ^= 1 << bit
            with pytest.raises(RemoteProtocolError):
                _engine.open_short_packet(suite, secret, bytes(damaged), 76)


@pytest.mark.parametrize("suite", SUITES)
def test_every_truncation_is_refused(suite: int) -> None:
    secret = secret_of(suite)
    packet = _engine.seal_short_packet(suite, secret, CID, 0, 5, b"\x30hello datagram")
    for n in range(len(packet)):
        with pytest.raises(RemoteProtocolError):
            _engine.open_short_packet(suite, secret, packet[:n], 4)
    extended = packet + b"\x00"
    with pytest.raises(RemoteProtocolError):
        _engine.open_short_packet(suite, secret, extended, 4)


def test_wrong_key_or_suite_is_refused() -> None:
    packet = _engine.seal_short_packet(AES128, secret_of(AES128), CID, 0, 9, b"\x01")
    with pytest.raises(RemoteProtocolError):
        _engine.open_short_packet(AES128, secret_of(AES128, seed=2), packet, 8)
    # ChaCha20-Poly1305 has a 32-byte secret too: the same bytes, another suite
    with pytest.raises(RemoteProtocolError):
        _engine.open_short_packet(CHACHA, secret_of(AES128), packet, 8)
    # the next key phase's secret is another key
    with pytest.raises(RemoteProtocolError):
        _engine.open_short_packet(AES128, _engine.next_secret(AES128, secret_of(AES128)), packet, 8)


def test_header_bits_checked_after_unmasking() -> None:
    """A packet whose unmasked first byte has reserved bits, no fixed bit or a PN length
    other than 4 is refused, even though its AEAD tag is right."""
    secret = secret_of(AES128)
    _, _, hp = _engine.derive_packet_keys(AES128, secret)
    for first in (0x53, 0x4B, 0x03, 0x42, 0x40):
        header = bytes([first]) + CID + bytes([0, 0, 0, 7])[: (first & 3) + 1]
        sealed = _engine.seal_packet(AES128, secret, header, 9, 7, bytes(20))
        with pytest.raises(RemoteProtocolError):
            _engine.open_short_packet(AES128, secret, sealed, 6)
    # the same route with a valid first byte opens: the refusals are the bits
    good = _engine.seal_packet(AES128, secret, plain_header(0, 7), 9, 7, bytes(20))
    assert _engine.open_short_packet(AES128, secret, good, 6) == (0, 7, bytes(20))
    assert hp == _engine.hkdf_expand_label(AES128, secret, "quic hp", 16)


def test_bad_arguments() -> None:
    secret = secret_of(AES128)
    with pytest.raises(ValueError, match="unknown cipher suite"):
        _engine.derive_packet_keys(0x1304, secret)
    with pytest.raises(ValueError, match="48 bytes"):
        _engine.derive_packet_keys(AES256, secret)
    with pytest.raises(ValueError, match="connection ID"):
        _engine.seal_short_packet(AES128, secret, b"short", 0, 1, b"")
    with pytest.raises(ValueError, match="packet number"):
        _engine.seal_short_packet(AES128, secret, CID, 0, 2**62, b"")
    with pytest.raises(ValueError, match="packet number"):
        _engine.seal_short_packet(AES128, secret, CID, 0, -1, b"")
    with pytest.raises(ValueError, match="largest_pn"):
        _engine.open_short_packet(AES128, secret, bytes(40), -2)
    with pytest.raises(ValueError, match="end with"):
        _engine.seal_packet(AES128, secret, plain_header(0, 1), 8, 1, bytes(20))
    with pytest.raises(ValueError, match="sample"):
        _engine.seal_packet(AES128, secret, b"\x40\x01", 1, 1, b"")
    with pytest.raises(ValueError, match="label"):
        _engine.hkdf_expand_label(AES128, secret, "", 16)
    with pytest.raises(ValueError, match="length"):
        _engine.hkdf_expand_label(AES128, secret, "x", 255 * 32 + 1)
    with pytest.raises(ValueError, match="sample"):
        _engine.header_protection_mask(AES128, secret, bytes(15))
    with pytest.raises(TypeError):
        _engine.seal_short_packet(AES128, "not bytes", CID, 0, 1, b"")


# ------------------------------------------------------------------ key updates, aioquic


@pytest.mark.parametrize("suite", SUITES)
def test_key_update_matches_aioquic(suite: int) -> None:
    secret = secret_of(suite)
    theirs = CryptoContext()
    theirs.setup(cipher_suite=CipherSuite(suite), secret=secret, version=1)
    ours = secret
    for generation in range(1, 4):
        previous = ours
        theirs = next_key_phase(theirs)
        ours = _engine.next_secret(suite, ours)
        # RFC 9001 §6.1, three ways: aioquic's context, its HKDF, the label by hand
        assert ours == theirs.secret
        assert ours == hkdf_expand_label(HASHES[suite], previous, b"quic ku", b"", HASH_LEN[suite])
        assert ours == _engine.hkdf_expand_label(suite, previous, "quic ku", HASH_LEN[suite])
        # a packet of that generation, sealed by aioquic, opens with ours
        pn = 1000 + generation
        packet = theirs.encrypt_packet(plain_header(theirs.key_phase, pn), b"\x01\x00", pn)
        assert _engine.open_short_packet(suite, ours, packet, pn - 1) == (
            theirs.key_phase,
            pn,
            b"\x01\x00",
        )


@pytest.mark.parametrize("suite", SUITES)
@pytest.mark.parametrize("key_phase", [0, 1])
def test_wire_compatible_with_aioquic(suite: int, key_phase: int) -> None:
    secret = secret_of(suite, seed=7)
    assert _engine.derive_packet_keys(suite, secret)[0] == hkdf_expand_label(
        HASHES[suite], secret, b"quic key", b"", KEY_LEN[suite]
    )
    theirs = CryptoContext(key_phase=key_phase)
    theirs.setup(cipher_suite=CipherSuite(suite), secret=secret, version=1)
    for pn, frames in ((0, b"\x01"), (123456789, b"\x30" + bytes(range(200))), (2**33 + 3, b"")):
        # theirs → ours
        packet = theirs.encrypt_packet(plain_header(key_phase, pn), frames, pn)
        assert _engine.open_short_packet(suite, secret, packet, pn - 1) == (key_phase, pn, frames)
        # ours → theirs, and the very same bytes
        ours = _engine.seal_short_packet(suite, secret, CID, key_phase, pn, frames)
        assert ours == packet
        header, payload, number, updated = theirs.decrypt_packet(ours, 9, pn)
        assert (header, payload, number, updated) == (
            plain_header(key_phase, pn),
            frames,
            pn,
            False,
        )


# ------------------------------------------------------------------ the data plane


TRAFFIC_SECRET = h("c0ffee00" * 8)


def test_derive_data_plane_is_what_proto_engine_md_says() -> None:
    dp, cid = _engine.derive_data_plane(AES128, TRAFFIC_SECRET)
    assert dp == py_expand_label(TRAFFIC_SECRET, b"wangate dp", b"", 32)
    assert cid == py_expand_label(dp, b"wangate cid", b"", 8)
    # and the bytes themselves, so that any change shows
    assert dp.hex() == DP_SECRET_HEX
    assert cid.hex() == DP_CID_HEX
    dp384, cid384 = _engine.derive_data_plane(AES256, secret_of(AES256))
    assert dp384 == hkdf_expand_label(hashes.SHA384(), secret_of(AES256), b"wangate dp", b"", 48)
    assert cid384 == hkdf_expand_label(hashes.SHA384(), dp384, b"wangate cid", b"", 8)
    with pytest.raises(ValueError, match="32 bytes"):
        _engine.derive_data_plane(AES128, bytes(48))


def test_proto_engine_md_names_the_labels_used() -> None:
    doc = (VECTORS.parent / "engine.md").read_text()
    for label in ("wangate dp", "wangate cid", "quic key", "quic iv", "quic hp", "quic ku"):
        assert f'"{label}"' in doc
    assert GOLDEN.name in doc


DP_SECRET_HEX = "3b129eda03e9dbcc2c04166c2df45b2df58a72cb436acaa555e2789e66d567bf"
DP_CID_HEX = "b3d0adf81d50f329"


def golden_fields() -> dict[str, Any]:
    """The golden packet: an ACK of 1..5 and 8..10 and a DATAGRAM with a length."""
    dp, cid = _engine.derive_data_plane(AES128, TRAFFIC_SECRET)
    ack = _engine.encode_ack([(8, 10), (1, 5)], 25)
    datagram = b"wangate golden datagram"
    frames = ack + b"\x31" + _engine.encode_varint(len(datagram)) + datagram
    return {
        "suite": AES128,
        "traffic_secret": TRAFFIC_SECRET.hex(),
        "dp_secret": dp.hex(),
        "cid": cid.hex(),
        "key_phase": 0,
        "pn": 0x2A0B0C0D,
        "largest_pn": 0x2A0B0C00,
        "ack": {"ack_delay": 25, "ranges": [[8, 10], [1, 5]]},
        "datagrams": [datagram.hex()],
        "frames": frames.hex(),
    }


def load_golden() -> tuple[dict[str, Any], bytes]:
    lines = GOLDEN.read_text().splitlines()
    (fields_line,) = [line for line in lines if line.startswith("# fields: ")]
    fields = json.loads(fields_line.removeprefix("# fields: "))
    raw = bytes.fromhex(" ".join(line for line in lines if not line.startswith("#")))
    return fields, raw


def test_golden_short_packet_vector() -> None:
    fields, raw = load_golden()
    assert fields == golden_fields()
    dp, cid = _engine.derive_data_plane(fields["suite"], h(fields["traffic_secret"]))
    assert (dp.hex(), cid.hex()) == (fields["dp_secret"], fields["cid"])
    sealed = _engine.seal_short_packet(
        fields["suite"], dp, cid, fields["key_phase"], fields["pn"], h(fields["frames"])
    )
    assert sealed == raw
    assert raw[1:9] == cid
    key_phase, pn, frames = _engine.open_short_packet(
        fields["suite"], dp, raw, fields["largest_pn"]
    )
    assert (key_phase, pn, frames.hex()) == (fields["key_phase"], fields["pn"], fields["frames"])
    parsed = _engine.parse_frames(frames)
    assert parsed == {
        "ack_eliciting": True,
        "ack": {"ack_delay": 25, "ranges": [tuple(r) for r in fields["ack"]["ranges"]]},
        "datagrams": [h(d) for d in fields["datagrams"]],
    }
    # aioquic opens it too: a QUIC v1 short-header packet like any other
    theirs = CryptoContext()
    theirs.setup(cipher_suite=CipherSuite(fields["suite"]), secret=dp, version=1)
    assert theirs.decrypt_packet(raw, 9, fields["largest_pn"])[1] == frames


def write_golden() -> None:
    fields = golden_fields()
    dp = h(fields["dp_secret"])
    packet = _engine.seal_short_packet(
        fields["suite"],
        dp,
        h(fields["cid"]),
        fields["key_phase"],
        fields["pn"],
        h(fields["frames"]),
    )
    lines = [
        "# data-plane short-header packet (proto/engine.md): AES-128-GCM, ACK + DATAGRAM",
        f"# fields: {json.dumps(fields)}",
    ]
    lines += [" ".join(f"{b:02x}" for b in packet[i : i + 16]) for i in range(0, len(packet), 16)]
    GOLDEN.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------ fuzzing


@FAST
@given(st.binary(max_size=200), st.integers(-1, 2**62 - 1), st.sampled_from(SUITES))
def test_random_bytes_never_open(data: bytes, largest: int, suite: int) -> None:
    with pytest.raises(RemoteProtocolError):
        _engine.open_short_packet(suite, secret_of(suite), data, largest)


@FAST
@given(st.binary(max_size=300), st.integers(0, 2**62 - 1), st.integers(0, 1))
def test_random_frames_round_trip(frames: bytes, pn: int, key_phase: int) -> None:
    secret = secret_of(AES256)
    packet = _engine.seal_short_packet(AES256, secret, CID, key_phase, pn, frames)
    assert _engine.open_short_packet(AES256, secret, packet, pn) == (key_phase, pn, frames)


if __name__ == "__main__":
    write_golden()
    sys.exit(0)
