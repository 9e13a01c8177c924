"""The half-open caps, the handshake timeout and the answer budget, without sockets."""

from __future__ import annotations

import pytest

from wangate.core.admission import AdmissionLimits, HandshakeAdmission, Refusal
from wangate.errors import LocalProtocolError

LIMITS = AdmissionLimits(
    max_half_open=4,
    max_half_open_per_source=2,
    handshake_timeout_s=5.0,
    responses_per_s=10.0,
    response_burst=3,
    known_responses_per_s=1.0,
    known_response_burst=2,
    known_sources=2,
)


def admit(adm: HandshakeAdmission[str], key: str, source: str, now: float) -> Refusal | None:
    refusal = adm.refusal(source)
    if refusal is None:
        adm.add(key, source, now)
    return refusal


def test_the_per_source_cap_refuses_a_third_connection_from_one_address() -> None:
    adm: HandshakeAdmission[str] = HandshakeAdmission(LIMITS, now=0.0)
    assert admit(adm, "a1", "10.0.0.1", 0.0) is None
    assert admit(adm, "a2", "10.0.0.1", 0.0) is None
    assert admit(adm, "a3", "10.0.0.1", 0.0) == Refusal("source", "10.0.0.1")
    assert admit(adm, "b1", "10.0.0.2", 0.0) is None  # another source still has room
    assert adm.half_open == 3
    assert adm.half_open_from("10.0.0.1") == 2
    assert adm.refused_source == 1
    assert adm.refused_total == 0
    with pytest.raises(LocalProtocolError):
        adm.add("a4", "10.0.0.1", 0.0)  # add() without room is our own bug


def test_the_total_cap_refuses_any_source_once_full() -> None:
    adm: HandshakeAdmission[str] = HandshakeAdmission(LIMITS, now=0.0)
    for i in range(4):
        assert admit(adm, f"c{i}", f"10.0.1.{i}", 0.0) is None
    assert admit(adm, "c4", "10.0.1.9", 0.0) == Refusal("total", "10.0.1.9")
    assert adm.refused_total == 1
    adm.closed("c0")  # a connection that went away frees its slot at once
    assert adm.half_open == 3
    assert admit(adm, "c5", "10.0.1.9", 0.0) is None


def test_authenticated_connections_leave_the_caps_and_their_source_becomes_known() -> None:
    adm: HandshakeAdmission[str] = HandshakeAdmission(LIMITS, now=0.0)
    assert admit(adm, "peer", "10.0.2.1", 0.0) is None
    adm.established("peer")
    assert adm.half_open == 0
    assert adm.established_count == 1
    assert adm.is_known("10.0.2.1")
    for i in range(4):  # strangers fill the total cap...
        assert admit(adm, f"s{i}", f"10.0.3.{i}", 0.0) is None
    assert admit(adm, "x", "10.0.3.99", 0.0) == Refusal("total", "10.0.3.99")
    # ...but a peer's address reconnects, within its own per-source cap
    assert admit(adm, "peer2", "10.0.2.1", 0.0) is None
    assert admit(adm, "peer3", "10.0.2.1", 0.0) is None
    assert admit(adm, "peer4", "10.0.2.1", 0.0) == Refusal("source", "10.0.2.1")


def test_known_sources_are_bounded_least_recent_first() -> None:
    adm: HandshakeAdmission[str] = HandshakeAdmission(LIMITS, now=0.0)
    for i in range(3):
        admit(adm, f"k{i}", f"10.0.4.{i}", 0.0)
        adm.established(f"k{i}")
    assert [adm.is_known(f"10.0.4.{i}") for i in range(3)] == [False, True, True]


def test_handshakes_expire_in_order_and_leave_nothing_behind() -> None:
    adm: HandshakeAdmission[str] = HandshakeAdmission(LIMITS, now=0.0)
    assert adm.get_timer() is None
    admit(adm, "e1", "10.0.5.1", 1.0)
    admit(adm, "e2", "10.0.5.1", 2.0)
    admit(adm, "e3", "10.0.5.2", 3.0)
    assert adm.get_timer() == 6.0
    assert adm.expire(5.999) == []
    assert adm.expire(7.0) == ["e1", "e2"]
    assert adm.get_timer() == 8.0
    assert adm.half_open_from("10.0.5.1") == 0
    assert adm.expire(8.0) == ["e3"]
    assert adm.timed_out == 3
    assert adm.half_open == 0
    assert adm._per_source == {}
    assert adm._deadlines == {}
    assert adm.get_timer() is None
    adm.established("e1")  # late news of a forgotten connection changes nothing
    adm.closed("e2")
    assert adm.established_count == 0
    assert not adm.is_known("10.0.5.1")


def test_answers_come_from_a_bucket_for_strangers_and_one_for_known_sources() -> None:
    adm: HandshakeAdmission[str] = HandshakeAdmission(LIMITS, now=0.0)
    admit(adm, "p", "10.0.6.1", 0.0)
    adm.established("p")
    assert [adm.may_respond("10.9.9.9", 0.0) for _ in range(4)] == [True, True, True, False]
    assert adm.may_respond("10.9.9.8", 0.05) is False  # half a token by now
    assert adm.may_respond("10.9.9.8", 0.1) is True  # 10 per second
    assert adm.may_respond("10.9.9.8", 0.1) is False
    # the strangers' bucket is empty; the peer's address has its own
    assert [adm.may_respond("10.0.6.1", 0.1) for _ in range(3)] == [True, True, False]
    assert adm.responses_dropped == 4


def test_limits_are_checked() -> None:
    with pytest.raises(LocalProtocolError):
        AdmissionLimits(max_half_open=0)
    with pytest.raises(LocalProtocolError):
        AdmissionLimits(handshake_timeout_s=0)
    with pytest.raises(LocalProtocolError):
        AdmissionLimits(response_burst=0)
