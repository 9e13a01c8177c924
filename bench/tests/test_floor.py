"""The kernel-UDP floor probe (bench/transport/udp_floor.c): built with gcc, run on
loopback for a moment, its reports whole and self-consistent."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.transport import floor

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return floor.build(tmp_path_factory.mktemp("floor") / "udp_floor")


def check_report(report: dict[str, Any], role: str, size: int) -> None:
    assert set(floor.REPORT_KEYS) <= set(report), report
    assert report["role"] == role
    assert report["size"] == size
    assert report["bytes"] == report["datagrams"] * size
    assert report["cpu_s"] == pytest.approx(report["user_s"] + report["sys_s"], abs=2e-6)


def test_floor_probe_receives_what_it_counts(binary: Path) -> None:
    reports = floor.run_probe(binary, 1452, duration=0.3)
    check_report(reports["send"], "send", 1452)
    check_report(reports["recv"], "recv", 1452)
    assert "rcvbuf_bytes" in reports["recv"]
    assert reports["recv"]["datagrams"] > 0
    assert reports["recv"]["datagrams"] <= reports["send"]["datagrams"]
    result = floor.FloorResult(1452, "plain", reports["send"], reports["recv"])
    assert result.drops >= 0
    assert result.mbit_per_cpu_s > 0


def test_floor_probe_sends_exactly_count_with_gso(binary: Path) -> None:
    try:
        reports = floor.run_probe(binary, 1452, count=1000, gso=True)
    except floor.FloorError as exc:
        if "UDP_SEGMENT" in str(exc) or "UDP_GRO" in str(exc):
            pytest.skip(f"UDP GSO/GRO unavailable: {exc}")
        raise
    assert reports["send"]["datagrams"] == 1000  # 22 super-buffers of 45, and one of 10
    check_report(reports["send"], "send", 1452)
    check_report(reports["recv"], "recv", 1452)
    assert 0 < reports["recv"]["datagrams"] <= 1000


def test_build_names_gcc_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(floor.FloorError, match="gcc"):
        floor.build(tmp_path / "udp_floor")
