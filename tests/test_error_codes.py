"""Error codes live in one enum; each says whether it closes the connection."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import wangate
from wangate.core.frames import Ack, Hello
from wangate.core.session import PeerSession
from wangate.errors import ErrorCode, LinkError, RemoteProtocolError
from wangate.localapi.protocol import FATAL_CODES, FrameError, decode_prefix

SOURCE = Path(wangate.__file__).parent
CODE_LITERAL = re.compile(
    r'code="([a-z_]+)"|FrameError\(\s*"([a-z_]+)"|error_reply\([^,]+, "([a-z_]+)"'
)


def test_every_code_the_product_uses_is_in_the_enum() -> None:
    used = set()
    for path in SOURCE.rglob("*.py"):
        for match in CODE_LITERAL.finditer(path.read_text()):
            used.add(next(group for group in match.groups() if group))
    assert used  # the pattern still finds them
    assert sorted(used - {code.value for code in ErrorCode}) == []


def test_the_codes_that_close_the_connection() -> None:
    closing = sorted(code.value for code in ErrorCode if code.closes_connection)
    assert closing == [
        "access_denied",
        "bad_flags",
        "bad_magic",
        "bad_version",
        "header_too_large",
        "too_large",
        "too_many_connections",
    ]
    assert frozenset(closing) == FATAL_CODES
    assert not ErrorCode.BAD_REQUEST.closes_connection


def test_quic_close_codes() -> None:
    assert [(code.name, code.value, code.unexpected) for code in LinkError] == [
        ("AUTHENTICATION_FAILED", 0x2A, True),
        ("PROTOCOL", 0x102, True),
        ("DUPLICATE", 0x103, False),
        ("SHUTDOWN", 0x104, False),
        ("RESET", 0x105, True),
    ]


def test_a_malformed_frame_from_a_client_is_a_remote_error() -> None:
    with pytest.raises(RemoteProtocolError) as error:
        decode_prefix(b"XX" + bytes(14), 1 << 20)
    assert isinstance(error.value, FrameError) and error.value.code == "bad_magic"


def test_control_frames_are_dispatched_by_type_and_others_are_the_peers_error() -> None:
    session = PeerSession("bj", "sh", max_message_bytes=1 << 20, inbox_window_bytes=1 << 20, now=0)
    session.path_up("a", datagram_bytes=1400, now=0.0)
    session.handle_control("a", Ack(0, 0, ()), 0.1)  # known: handled
    with pytest.raises(RemoteProtocolError, match="unexpected hello frame on path a"):
        session.handle_control("a", Hello("sh", "a", 1, 1 << 20), 0.2)
    with pytest.raises(RemoteProtocolError, match="unexpected str frame on path a"):
        session.handle_control("a", "not a frame", 0.3)  # type: ignore[arg-type]
