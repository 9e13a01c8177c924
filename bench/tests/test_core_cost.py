"""``bench transport core``: the core's own cost per datagram, timed on a real session
pair; the round moves every datagram it pulls through the receiver."""

from __future__ import annotations

import pytest

from bench.transport import core


def test_a_round_pulls_handles_and_acks_every_datagram(capsys: pytest.CaptureFixture[str]) -> None:
    pulled_us, handled_us, acked_us = core.one_round(1452, 256)
    assert pulled_us > 0 and handled_us > 0 and acked_us > 0
    assert core.main(["--datagram", "1452", "--datagrams", "128", "--rounds", "1"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| datagram | pulled")
    assert rows[2].startswith("| 1452 | ")
    assert len(rows) == 3
