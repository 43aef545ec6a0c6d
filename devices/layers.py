"""The Redis channel layer with retries, selected in settings.CHANNEL_LAYERS when REDIS_URL
is set (and, without Redis, Channels' in-process layer with a cheaper expiry sweep).

Device sockets use the layer only for commands (admin, manage.py, Celery) and the
"replaced" event, so Redis trouble must never end a conversation or fail a command that a
second try would deliver:

- `receive` retries instead of raising. Channels lets a failing receive end the consumer,
  which closes the device's socket; a Redis restart, or the read timeout redis-py puts at
  the same 5 s as channels_redis's blocking pop, would then cut off a conversation.
- sends retry a few times: after a Redis restart the first command meets a pooled
  connection that is dead, and failed with a 500 in the admin before.

This is the supported extension point (a layer class named in settings), so no consumer
overrides Channels internals.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from channels.layers import InMemoryChannelLayer as BaseInMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

T = TypeVar("T")

RECEIVE_RETRY_SECONDS = 1.0
SEND_RETRY_DELAYS = (0.1, 0.5, 1.0)  # then the error reaches the caller (a command fails visibly)
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)


class ResilientRedisChannelLayer(RedisChannelLayer):
    async def receive(self, channel: str) -> dict[str, Any]:
        while True:
            try:
                return await super().receive(channel)
            except RedisTimeoutError:
                continue  # an idle poll that lost the race with the socket timeout
            except (RedisError, OSError) as exc:
                # One line, no traceback: during an outage this repeats every second.
                logger.warning("channel layer receive failed, retrying", extra={"error": repr(exc)})
                await asyncio.sleep(RECEIVE_RETRY_SECONDS)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        await _retried(lambda: super(ResilientRedisChannelLayer, self).send(channel, message))

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await _retried(lambda: super(ResilientRedisChannelLayer, self).group_send(group, message))

    async def group_add(self, group: str, channel: str) -> None:
        await _retried(lambda: super(ResilientRedisChannelLayer, self).group_add(group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        await _retried(lambda: super(ResilientRedisChannelLayer, self).group_discard(group, channel))


async def _retried(call: Callable[[], Awaitable[T]]) -> T:
    for delay in SEND_RETRY_DELAYS:
        try:
            return await call()
        except _TRANSIENT as exc:
            logger.warning("channel layer call failed, retrying", extra={"error": repr(exc)})
            await asyncio.sleep(delay)
    return await call()


class InMemoryChannelLayer(BaseInMemoryChannelLayer):
    """Channels' in-process layer (one worker without Redis), with its expiry sweep throttled.

    Channels sweeps every channel for expired messages on each `receive` and `group_send`; every
    connected device waits in a `receive`, so each connect or command cost a walk over all the
    devices (quadratic in a reboot storm: ~5 % of a connect's CPU at 1,500 devices). Here the
    sweep runs at most once per CLEAN_INTERVAL_SECONDS: a message still expires, up to that
    much later than its `expiry` (60 s by default).
    """

    CLEAN_INTERVAL_SECONDS = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_clean = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now < self._next_clean:
            return
        self._next_clean = now + self.CLEAN_INTERVAL_SECONDS
        super()._clean_expired()  # type: ignore[misc]  # not in the stubs: a private method
