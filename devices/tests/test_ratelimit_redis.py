"""The rate-limit count on Redis: one round trip, the cache's own key and encoding, the
window's expiry (integration tier: a real Redis)."""
from __future__ import annotations

from typing import Any

import pytest
import redis
from django.core.cache.backends.redis import RedisCache

from devices.ratelimit import RateLimit, rate_limit_hit
from xiaozhi_site.shared_cache import shared_cache

pytestmark = pytest.mark.integration

LIMIT = RateLimit(scope="test", per_address=3, global_limit=5, window_seconds=60)


def test_counts_go_to_redis_in_one_round_trip_each(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = shared_cache()
    assert isinstance(cache, RedisCache)
    server = cache._cache.get_client(write=True)
    trips: list[int] = []
    execute = redis.client.Pipeline.execute

    def counting(self: redis.client.Pipeline, *args: Any, **kwargs: Any) -> Any:
        trips.append(len(self.command_stack))
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting)
    now = 1_000_000.0
    decisions = [rate_limit_hit(limit=LIMIT, address="192.0.2.7", now=now).allowed for _ in range(4)]
    assert decisions == [True, True, True, False]  # the fourth is over the address's 3
    assert trips == [2] * 7  # address and global per call, the refused one stops at the address
    window = int(now // LIMIT.window_seconds)
    key = f"rl:test:ip:192.0.2.7:{window}"
    assert shared_cache().get(key) == 4  # the cache reads what the pipeline wrote
    assert shared_cache().get(f"rl:test:all:{window}") == 3
    ttl = server.ttl(shared_cache().make_and_validate_key(key))
    assert 0 < ttl <= 2 * LIMIT.window_seconds


def test_the_global_limit_holds_across_addresses() -> None:
    now = 2_000_000.0
    allowed = [rate_limit_hit(limit=LIMIT, address=f"198.51.100.{n}", now=now).allowed for n in range(7)]
    assert allowed == [True] * 5 + [False] * 2
    assert rate_limit_hit(limit=LIMIT, address="198.51.100.99", now=now + 60).allowed  # the next window
