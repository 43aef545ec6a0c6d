"""One cache client per process, for the code on the request path.

Django's `cache` is context-local under ASGI (`caches` keeps its backends in an asgiref
`Local`): every request runs in a context of its own, so each one built a new `RedisCache`,
hence a new Redis connection pool, and connected to Redis again, with the client's handshake,
for the two round trips of a rate-limit count. py-spy on the reboot storm (two workers, 5,000
check-ins) found 71 % of the check-in threads' samples in the cache and 55 % in connecting.
The backends' clients are thread-safe (redis-py's connection pool; LocMemCache's lock), so
one per process serves every request and thread.
"""
from __future__ import annotations

import functools

from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.base import BaseCache


@functools.cache
def shared_cache() -> BaseCache:
    """The default cache, one instance per process (settings read at first use)."""
    return caches.create_connection(DEFAULT_CACHE_ALIAS)
