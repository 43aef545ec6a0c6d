from __future__ import annotations

from xiaozhi_site.expiring import Expiring


def test_a_value_is_reused_until_it_expires_and_made_anew_after() -> None:
    made: list[str] = []

    def make(value: str) -> str:
        made.append(value)
        return value

    memo: Expiring[str, str] = Expiring()
    assert memo.get("a", lambda: make("one"), ttl=60) == "one"
    assert memo.get("a", lambda: make("two"), ttl=60) == "one"  # reused
    assert memo.get("b", lambda: make("three"), ttl=0) == "three"
    assert memo.get("b", lambda: make("four"), ttl=0) == "four"  # expired at once
    memo.clear()
    assert memo.get("a", lambda: make("five"), ttl=60) == "five"
    assert made == ["one", "three", "four", "five"]


def test_past_its_size_it_starts_over() -> None:
    memo: Expiring[int, int] = Expiring(max_entries=2)
    for key in range(4):
        memo.get(key, lambda key=key: key, ttl=60)  # type: ignore[misc]
    assert memo.get(0, lambda: -1, ttl=60) == -1  # forgotten when it started over
