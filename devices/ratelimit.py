"""Fixed-window attempt counters in Django's cache, per client address and global.

Fixed windows (not sliding) because `cache.add` + `cache.incr` are atomic on every shared
backend (Redis, memcached), and on Redis both go in one round trip (every OTA check-in
counts); a burst at a window edge can reach twice the limit, which is fine for the purpose
(making a 10^6 code space slow to guess).
The cache must be shared by every web process (settings: Redis when REDIS_URL is set).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache.backends.redis import RedisCache

from xiaozhi_site.shared_cache import shared_cache

logger = logging.getLogger(__name__)

# The firmware polls /activate every 3 s for up to 10 attempts, then re-checks OTA, so one
# device makes about 20 calls a minute; this leaves room for a few devices behind one NAT.
ACTIVATE_POLLS_PER_ADDRESS = 120
ACTIVATE_POLL_WINDOW_SECONDS = 60


@dataclass(frozen=True)
class RateLimit:
    scope: str
    per_address: int
    global_limit: int | None
    window_seconds: int


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after: int = 0


def code_entry_limit() -> RateLimit:
    """Activation-code guesses (the admin bind form), from settings."""
    return RateLimit(
        scope="bind",
        per_address=settings.XIAOZHI_ACTIVATION_RATE_PER_IP,
        global_limit=settings.XIAOZHI_ACTIVATION_RATE_GLOBAL,
        window_seconds=settings.XIAOZHI_ACTIVATION_RATE_WINDOW_SECONDS,
    )


def activate_poll_limit() -> RateLimit:
    return RateLimit(
        scope="activate",
        per_address=ACTIVATE_POLLS_PER_ADDRESS,
        global_limit=None,
        window_seconds=ACTIVATE_POLL_WINDOW_SECONDS,
    )


def ota_check_limit() -> RateLimit:
    """OTA checks per address: one per boot and one per ~30 s activation cycle per device,
    so the default leaves room for many devices behind one NAT, not for a flood."""
    return RateLimit(
        scope="ota",
        per_address=settings.XIAOZHI_OTA_RATE_PER_IP,
        global_limit=None,
        window_seconds=settings.XIAOZHI_OTA_RATE_WINDOW_SECONDS,
    )


def new_device_limit() -> RateLimit:
    """MACs seen for the first time per address: each one costs a device row and a 24 h code."""
    return RateLimit(
        scope="new-device",
        per_address=settings.XIAOZHI_NEW_DEVICE_RATE_PER_IP,
        global_limit=None,
        window_seconds=settings.XIAOZHI_NEW_DEVICE_RATE_WINDOW_SECONDS,
    )


def _count(key: str, window_seconds: int) -> int:
    # The key's timeout outlives the window, so the count never races an expiry inside it.
    cache = shared_cache()
    timeout = window_seconds * 2
    if isinstance(cache, RedisCache):
        # add + incr in one round trip, not three (Django's incr is EXISTS, then INCRBY), on
        # the cache's own client and pool, key and encoding (Django stores an int as its digits)
        full = cache.make_and_validate_key(key)
        pipe = cache._cache.get_client(full, write=True).pipeline(transaction=False)
        pipe.set(full, 0, ex=timeout, nx=True)
        pipe.incr(full)
        _, count = pipe.execute()
        return int(count)
    cache.add(key, 0, timeout=timeout)  # a no-op when the key exists
    try:
        return cache.incr(key)
    except ValueError:  # evicted between add() and incr()
        cache.add(key, 1, timeout=timeout)
        return 1


def rate_limit_hit(*, limit: RateLimit, address: str, now: float | None = None) -> RateDecision:
    """Count one attempt from `address`; say whether it may go ahead."""
    now = time.time() if now is None else now
    window = int(now // limit.window_seconds)
    retry_after = int((window + 1) * limit.window_seconds - now) + 1
    if _count(f"rl:{limit.scope}:ip:{address}:{window}", limit.window_seconds) > limit.per_address:
        logger.warning("rate limit reached for an address", extra={"scope": limit.scope, "address": address})
        return RateDecision(False, retry_after)
    if limit.global_limit is not None:
        if _count(f"rl:{limit.scope}:all:{window}", limit.window_seconds) > limit.global_limit:
            logger.warning("global rate limit reached", extra={"scope": limit.scope})
            return RateDecision(False, retry_after)
    return RateDecision(True)
