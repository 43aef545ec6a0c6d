"""A per-process memo whose entries live a few seconds: what the connect path reuses while a
fleet connects together (conversations/selectors.py, tools/selectors.py)."""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Expiring(Generic[K, V]):
    """`get(key, make, ttl)`: the value made for `key` less than `ttl` seconds ago, or a new one.

    Keys are few (personas, their revisions, server-name sets), so past `max_entries` it simply
    starts over rather than tracking ages. Values are shared by every caller: immutable, or
    treated as read-only."""

    def __init__(self, max_entries: int = 256) -> None:
        self._entries: dict[K, tuple[float, V]] = {}
        self._max_entries = max_entries

    def get(self, key: K, make: Callable[[], V], ttl: float) -> V:
        now = time.monotonic()
        found = self._entries.get(key)
        if found is not None and found[0] > now:
            return found[1]
        value = make()
        if len(self._entries) > self._max_entries:
            self._entries.clear()
        self._entries[key] = (now + ttl, value)
        return value

    def clear(self) -> None:
        self._entries.clear()
