"""The settings of a process that runs a gateway's event loop (wangate.daemon_process)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from wangate.daemon_process import YOUNG_COLLECTION_THRESHOLD, tune_collector


@pytest.fixture
def collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_start_up_objects_are_frozen_and_the_young_threshold_raised(
    collector_restored: None,
) -> None:
    _, middle, old = gc.get_threshold()
    loaded = _Node()  # what start-up made
    tune_collector()
    assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, middle, old)
    assert gc.get_freeze_count() > 0
    assert not gc.is_finalized(loaded)
    assert not any(obj is loaded for obj in gc.get_objects())  # out of the collector's sight


def test_cycles_made_later_are_still_collected(collector_restored: None) -> None:
    tune_collector()
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    assert gone() is not None  # a cycle: reference counting alone keeps it
    # allocations past the young threshold run a collection without being asked
    keep = [[] for _ in range(YOUNG_COLLECTION_THRESHOLD + 1)]
    assert gone() is None
    del keep
