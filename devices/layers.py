"""The Redis channel layer with retries, selected in settings.CHANNEL_LAYERS when REDIS_URL
is set.

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
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

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
