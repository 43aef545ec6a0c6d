"""Each API key's limits over every web worker: its live connections and its request rate.

With REDIS_URL the web workers (`XIAOZHI_WORKERS`, xiaozhi_site/webserver.py) count in Redis,
so a key gets its limits once however many workers there are; without it there is one
process and the counts stay in its memory (auth.KeyLimits).

In Redis, crash-safe by construction:
- connections: a sorted set per key, one member per live connection, scored by the moment
  it expires (`SLOT_TTL`). The holding connection pushes that moment on every
  `SLOT_REFRESH` seconds; only unexpired members count. A worker killed with SIGKILL cannot
  close its connections, but it stops refreshing them: their slots come back within
  `SLOT_TTL` seconds.
- the request rate: the token bucket of auth.KeyLimits, as a hash per key updated by one Lua
  script, so two workers can never both take the last token. A bucket nobody touched for a
  minute is full again, so the hash expires then.
Time is Redis's (`TIME`, in the scripts): the workers' clocks never matter. Tests may pass a
clock instead.

Redis unreachable (down, restarting, slower than `REDIS_TIMEOUT`): the call falls back to this
process's counts, logged once until Redis answers again. Refusing every client because the
limiter is down would be worse than counting per worker for a while; the connection slots
taken meanwhile stay in this process and are given back here.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from conversations.gateway.auth import KeyGrant, KeyLimits

log = logging.getLogger(__name__)

# What "Redis unreachable" means here; anything else is a bug and propagates.
_UNREACHABLE = (RedisError, OSError, TimeoutError)

SLOT_TTL = 30.0  # s: a connection whose worker stopped refreshing it counts no longer than this
SLOT_REFRESH = 10.0  # s: well under SLOT_TTL, so a busy event loop never loses a live slot
REDIS_TIMEOUT = 1.0  # s, connecting and each command
_PREFIX = "xiaozhi:gateway:key:"

# Every script starts here: ARGV[1] is "now" in ms, or "" for Redis's own clock (TIME).
_NOW = """
local now = tonumber(ARGV[1])
if not now then local t = redis.call('TIME'); now = t[1] * 1000 + math.floor(t[2] / 1000) end
"""

# KEYS[1] the key's connections; ARGV: now (ms, "" for Redis TIME), max connections, member, ttl (ms)
_OPEN = _NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return 1
"""

# KEYS[1] the key's connections; ARGV: now (ms or ""), member, ttl (ms). Adds the member back
# if it had expired (its worker stalled, or Redis was away): the connection is live.
_REFRESH = _NOW + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3])) end
return 1
"""

# KEYS[1] the key's connections; ARGV: now (ms or ""). Live members.
_COUNT = _NOW + """
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
"""

# KEYS[1] the key's bucket; ARGV: now (ms or ""), capacity (requests per minute).
# Returns "0" when a token was taken, else the milliseconds until one is (a string: Redis
# would truncate a Lua number to an integer).
_REQUEST = _NOW + """
local capacity = tonumber(ARGV[2])
local per_ms = capacity / 60000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens, updated = tonumber(state[1]), tonumber(state[2])
if not tokens or not updated then tokens, updated = capacity, now end
if now > updated then tokens = tokens + (now - updated) * per_ms; updated = now end
if tokens > capacity then tokens = capacity end
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / per_ms end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'updated', string.format('%.3f', updated))
redis.call('PEXPIRE', KEYS[1], 61000)
return string.format('%.3f', wait)
"""


@dataclass(eq=False)
class KeySlot:
    """One connection's place in its key's count. `shared`: in Redis (else in this process)."""

    key_id: int
    redis_key: str
    member: str
    shared: bool
    refresher: asyncio.Task[None] | None = field(default=None, repr=False)


def redis_key(grant: KeyGrant, what: str) -> str:
    """`what` ("connections", "bucket") of a key. Its stored prefix goes beside its id: a
    database rebuilt from scratch reuses ids, and must not inherit an old key's counts."""
    return f"{_PREFIX}{grant.key_id}:{grant.prefix}:{what}"


class RedisKeyLimits:
    """The counts of every worker, in Redis; each call is one script, atomic in Redis.

    Raises redis's errors and TimeoutError: KeyLimiter decides what they mean.
    """

    def __init__(self, url: str, *, clock: Callable[[], float] | None = None, slot_ttl: float = SLOT_TTL,
                 timeout: float = REDIS_TIMEOUT) -> None:
        self.url = url
        self.slot_ttl = slot_ttl
        self.timeout = timeout
        self._clock = clock  # seconds; None: Redis TIME
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scripts: dict[str, Any] = {}

    def _redis(self) -> Any:
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:  # a client belongs to one event loop
            self._client = redis.asyncio.Redis.from_url(
                self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 0),  # a limit check waits for one try, not three
            )
            self._loop = loop
            self._scripts = {name: self._client.register_script(source) for name, source in
                             (("open", _OPEN), ("refresh", _REFRESH), ("count", _COUNT), ("request", _REQUEST))}
        return self._client

    def _now(self) -> str:
        return "" if self._clock is None else f"{self._clock() * 1000:.3f}"

    async def _run(self, name: str, keys: list[str], *args: Any) -> Any:
        self._redis()
        async with asyncio.timeout(2 * self.timeout):  # the whole call, connecting included
            return await self._scripts[name](keys=keys, args=[self._now(), *args])

    async def open(self, grant: KeyGrant, member: str) -> bool:
        ttl = int(self.slot_ttl * 1000)
        return bool(await self._run("open", [redis_key(grant, "connections")], grant.max_connections, member, ttl))

    async def refresh(self, connections: str, member: str) -> None:
        await self._run("refresh", [connections], member, int(self.slot_ttl * 1000))

    async def close(self, connections: str, member: str) -> None:
        client = self._redis()
        async with asyncio.timeout(2 * self.timeout):
            await client.zrem(connections, member)

    async def connections(self, grant: KeyGrant) -> int:
        return int(await self._run("count", [redis_key(grant, "connections")]))

    async def request(self, grant: KeyGrant) -> float:
        """As KeyLimits.request: 0.0 when allowed, else the seconds until a request is."""
        wait_ms = await self._run("request", [redis_key(grant, "bucket")], grant.requests_per_minute)
        return float(wait_ms) / 1000.0

    async def aclose(self) -> None:
        client, self._client, self._loop = self._client, None, None
        if client is not None:
            await client.aclose()


class KeyLimiter:
    """What the consumer uses: open a slot (and keep it alive), close it, take a request.

    Shared in Redis when `redis` is given, else (and while Redis is unreachable) this
    process's KeyLimits. Each slot's refresh task is owned by its KeySlot and cancelled by
    `close`, which the consumer calls on disconnect.
    """

    def __init__(self, redis: RedisKeyLimits | None = None, *, local: KeyLimits | None = None,
                 refresh_interval: float = SLOT_REFRESH) -> None:
        self.redis = redis
        self.local = local or KeyLimits()
        self.refresh_interval = refresh_interval
        self._failing = False

    @classmethod
    def for_url(cls, url: str) -> KeyLimiter:
        return cls(RedisKeyLimits(url) if url else None)

    async def open(self, grant: KeyGrant) -> KeySlot | None:
        """A slot for one more connection of the key, or None at its `max_connections`."""
        if self.redis is not None:
            member = uuid.uuid4().hex
            try:
                allowed = await self.redis.open(grant, member)
            except _UNREACHABLE as error:  # count here instead
                self._unreachable(error)
            else:
                self._reachable()
                if not allowed:
                    return None
                slot = KeySlot(grant.key_id, redis_key(grant, "connections"), member, shared=True)
                slot.refresher = asyncio.get_running_loop().create_task(
                    self._keep_alive(slot), name=f"gateway-key-slot-{grant.key_id}")
                return slot
        if not self.local.open(grant):
            return None
        return KeySlot(grant.key_id, "", "", shared=False)

    async def close(self, slot: KeySlot) -> None:
        """Give the slot back. Everything in this process happens before the first await, so a
        cancelled disconnect leaves nothing behind here; a slot Redis did not hear about
        expires after SLOT_TTL."""
        if slot.refresher is not None:
            slot.refresher.cancel()
            slot.refresher = None
        if not slot.shared:
            self.local.close(slot.key_id)
            return
        assert self.redis is not None
        try:
            await self.redis.close(slot.redis_key, slot.member)
        except _UNREACHABLE as error:
            self._unreachable(error)

    async def request(self, grant: KeyGrant) -> float:
        """Take one of the key's requests: 0.0 when allowed, else the seconds to wait."""
        if self.redis is not None:
            try:
                wait = await self.redis.request(grant)
            except _UNREACHABLE as error:
                self._unreachable(error)
            else:
                self._reachable()
                return wait
        return self.local.request(grant)

    async def _keep_alive(self, slot: KeySlot) -> None:
        assert self.redis is not None
        while True:
            await asyncio.sleep(self.refresh_interval)
            try:
                await self.redis.refresh(slot.redis_key, slot.member)
            except _UNREACHABLE as error:  # the next refresh puts the slot back
                self._unreachable(error)
            else:
                self._reachable()

    def _unreachable(self, error: BaseException) -> None:
        if not self._failing:
            self._failing = True
            log.warning("gateway key limits: Redis unreachable, counting in this process until it is back",
                        extra={"error": repr(error)})

    def _reachable(self) -> None:
        if self._failing:
            self._failing = False
            log.info("gateway key limits: Redis reachable again, counting over all workers")

