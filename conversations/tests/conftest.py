"""Fixtures shared by the consumer tests."""
from __future__ import annotations

from typing import Any

import pytest

from xiaozhi_site.db_threads import DEVICE_DB


@pytest.fixture
def database_hops(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every call handed to the device database threads, in order."""
    hops: list[object] = []
    submit = DEVICE_DB.submit

    def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(DEVICE_DB, "submit", counted)
    return hops
