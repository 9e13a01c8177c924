"""The cold-page probe (bench/localapi/cold_pages.c): built with gcc, its medians whole."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bench.localapi import cold
from bench.transport.floor import build

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("cold") / "cold_pages", cold.SOURCE)


def test_the_probe_reports_every_median(binary: Path) -> None:
    result = cold.run_probe(binary, gap_ms=1, rounds=3)
    assert set(result) == set(cold.KEYS)
    assert (result["pages"], result["gap_us"], result["rounds"]) == (256, 1000, 3)
    for key in cold.KEYS[3:-1]:
        assert result[key] > 0, key
    assert result["anon_huge_kb"] >= -1  # -1: the kernel does not say


def test_the_probe_refuses_a_round_count_out_of_range(binary: Path) -> None:
    for rounds in (0, 1001):
        with pytest.raises(subprocess.CalledProcessError) as refused:
            cold.run_probe(binary, gap_ms=0, rounds=rounds)
        assert refused.value.returncode == 2
        assert "rounds must be 1..1000" in refused.value.stderr
