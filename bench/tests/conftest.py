"""The bench's own tests in the tiers of tests/conftest.py (its pure ones here; the
runner's lab runs carry ``netns``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assign_tiers

TIERS = {
    "test_cold_pages.py": "daemons",
    "test_collective_bound.py": "pure",
    "test_core_cost.py": "pure",
    "test_floor.py": "daemons",
    "test_jobs.py": "pure",
    "test_runner.py": "pure",
    "test_soak.py": "pure",
    "test_suites.py": "pure",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    assign_tiers(items, TIERS, Path(__file__).resolve().parent)
