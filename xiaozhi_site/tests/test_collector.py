"""settle_heap: start-up objects frozen out of the collector's reach, young collections rarer,
middle ones smaller."""
from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from xiaozhi_site.collector import MIDDLE_THRESHOLD, OLD_THRESHOLD, YOUNG_THRESHOLD, settle_heap


@pytest.fixture
def collector_restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_it_freezes_the_start_up_heap_and_sets_the_thresholds(collector_restored: None) -> None:
    gc.unfreeze()
    gc.set_threshold(700, 11, 12)
    settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    assert YOUNG_THRESHOLD > 700  # Python's default, which the storm measured against
    # Full collections as often as with Python's 10 x 10 young-to-full cadence, not more.
    assert MIDDLE_THRESHOLD * OLD_THRESHOLD <= 10 * 10
