"""Rate-limit counters live in the cache, which outlives a test: every test starts fresh."""
from __future__ import annotations

import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    cache.clear()
