"""DeviceConsumer: the thin Channels adapter between a device socket and its VoiceSession.

Channels awaits one handler at a time per consumer (socket frames and channel-layer events
share one queue), so every handler here returns quickly: frames are handed to the session,
commands run in tasks. All slow setup (auth, config: one DB hop) happens before `accept`,
so by the time the device can send its hello the session is ready to answer it at once.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar
from urllib.parse import parse_qsl

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from redis.exceptions import TimeoutError as RedisTimeoutError

from conversations.pipeline.aio import TaskSet
from conversations.pipeline.commands import command_name, mcp_result
from conversations.pipeline.config import SessionConfig
from conversations.pipeline.contracts import EngineContext, VoiceEngine
from conversations.pipeline.engine import VoiceEngine as FullVoiceEngine
from conversations.pipeline.session import CloseCode, VoiceSession
from conversations.selectors import (
    header_value,
    persona_for_device,
    request_base_url,
    scope_client_address,
    session_config_for,
)
from conversations.services import DbSessionHooks
from dashboard.live import REGISTRY as LIVE_FIGURES
from devices.auth import DeviceAuthResult, device_authenticate
from devices.models import device_group_name
from devices.presence import TOUCH_INTERVAL_SECONDS

logger = logging.getLogger(__name__)

LAYER_RETRY_SECONDS = 1.0


def voice_engine_factory(ctx: EngineContext) -> VoiceEngine:
    return FullVoiceEngine(ctx)


def _prepare(scope: dict[str, Any]) -> tuple[DeviceAuthResult, SessionConfig | None, int | None]:
    """Authenticate and load the session configuration in one thread hop (sync, ORM)."""
    headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", ())}
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    auth = device_authenticate(headers=headers, query=query)
    if not auth.ok or auth.device is None:
        return auth, None, None
    persona = persona_for_device(auth.device)
    config = session_config_for(auth.device, auth, persona=persona, request_base_url=request_base_url(scope))
    return auth, config, persona.pk


class DeviceConsumer(AsyncWebsocketConsumer):
    """`/xiaozhi/v1/`: one device, one VoiceSession. Implements the session's Transport."""

    active_connections: ClassVar[int] = 0  # per process; over the limit new sockets get 1013
    engine_factory = staticmethod(voice_engine_factory)

    async def connect(self) -> None:
        self.session: VoiceSession | None = None
        self._group: str | None = None
        self._open = False
        self._counted = False
        self._commands = TaskSet("device commands")
        if DeviceConsumer.active_connections >= settings.XIAOZHI_MAX_DEVICE_CONNECTIONS:
            logger.warning("device connection refused: too many connections")
            await self._refuse(CloseCode.TRY_AGAIN_LATER, "too many connections")
            return
        DeviceConsumer.active_connections += 1
        self._counted = True
        try:
            # Not thread-sensitive: a connecting device must not queue behind sync views.
            prepare = database_sync_to_async(_prepare, thread_sensitive=False)
            auth, config, persona_id = await prepare(self.scope)
        except Exception:
            logger.exception("device connection setup failed")
            await self._refuse(CloseCode.INTERNAL_ERROR, "internal error")
            return
        if config is None or auth.device is None:
            await self._refuse(auth.close_code or CloseCode.AUTH_FAILED, auth.reason or "refused")
            return
        try:
            await self._start(auth.device.pk, config, persona_id)
        except Exception:  # e.g. the channel layer (Redis) is unreachable
            logger.exception("device session start failed")
            await self._refuse(CloseCode.INTERNAL_ERROR, "internal error")

    async def _refuse(self, code: int, reason: str) -> None:
        # Accept first: a close before accept is an HTTP 403 without code or reason.
        if not self._open:
            await self.accept()
            self._open = True
        await self.close(code=code, reason=reason)

    async def _start(self, device_pk: int, config: SessionConfig, persona_id: int | None) -> None:
        hooks = DbSessionHooks(device_id=device_pk, persona_id=persona_id,
                               client_address=scope_client_address(self.scope))
        self.session = VoiceSession(self, config, hooks, self.engine_factory,
                                    protocol_header=header_value(self.scope, b"protocol-version") or None,
                                    touch_interval=TOUCH_INTERVAL_SECONDS)
        LIVE_FIGURES.track_device(self)  # the dashboard counts sessions by state
        self._group = device_group_name(device_pk)
        await self.channel_layer.group_add(self._group, self.channel_name)
        await self.accept()
        self._open = True
        await self.session.start()

    # -- channel layer: commands only, so its trouble must never end a voice session -------

    @property
    def channel_receive(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        return self._receive_command

    @channel_receive.setter
    def channel_receive(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        # AsyncConsumer.__call__ assigns the layer's receive here; we wrap it.
        self._layer_receive = receive

    async def _receive_command(self) -> dict[str, Any]:
        """The layer's receive, retried instead of raised.

        Channels lets a failing layer receive end the consumer, closing the device's socket.
        A Redis restart, or the read timeout redis-py 8 puts at the same 5 s as
        channels_redis's blocking pop, would then cut off a conversation; commands just
        pause instead.
        """
        while True:
            try:
                return await self._layer_receive()
            except RedisTimeoutError:
                continue  # an idle poll that lost the race with the socket timeout
            except Exception:
                logger.warning("channel layer receive failed, retrying", exc_info=True)
                await asyncio.sleep(LAYER_RETRY_SECONDS)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch without its `aclose_old_connections()` before every handler.

        That call hops to the single thread-sensitive sync thread: once per audio frame
        (~17/s per device, shared by all devices), and it stalls behind any blocking sync
        view; an admin action waiting for a device tool call would deadlock with it until
        the timeout. This consumer never uses the ORM directly: its DB work goes through
        `database_sync_to_async`, which cleans up connections itself. Unknown channel-layer
        events are logged instead of killing the device's connection.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            logger.warning("device consumer ignored an unknown event", extra={"event_type": message.get("type")})
            return
        await handler(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        session = self.session
        if session is None:
            return
        if text_data is not None:
            await session.feed_text(text_data)
        elif bytes_data is not None:
            await session.feed_bytes(bytes_data)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # As dispatch above: no trip through the sync thread before the session is closed,
        # so a tool call waiting on this device fails at once instead of at its timeout.
        await self.disconnect(message.get("code", 1006))
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        self._open = False
        if self._group is not None:
            await self.channel_layer.group_discard(self._group, self.channel_name)
        if self.session is not None:
            await self.session.aclose()  # fails pending tool calls: their callers hear it now
        await self._commands.aclose()
        if self._counted:
            DeviceConsumer.active_connections -= 1
            self._counted = False

    # -- Transport ---------------------------------------------------------------------------

    async def send_text(self, text: str) -> None:
        if self._open:
            await self.send(text_data=text)

    async def send_bytes(self, data: bytes) -> None:
        if self._open:
            await self.send(bytes_data=data)

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        if not self._open:
            return
        self._open = False
        await super().close(code=code, reason=reason)

    # -- channel-layer commands (devices/commands.py) ----------------------------------------

    async def device_command(self, event: dict[str, Any]) -> None:
        if self.session is None:
            return
        try:
            self._commands.create(self._run_command(self.session, event), name="device-command")
        except RuntimeError:  # the socket is closing
            logger.info("device command dropped: the connection is closing")

    # The per-command event types of docs/architecture.md land in the same place.
    device_reboot = device_alert = device_custom = device_say = device_mcp_call = device_command

    async def _run_command(self, session: VoiceSession, event: dict[str, Any]) -> None:
        reply_channel = event.get("reply_channel")
        try:
            result = await session.handle_command(event)
        except asyncio.CancelledError:
            if command_name(event) == "mcp_call":
                await self._reply(reply_channel, mcp_result(error="the device disconnected", offline=True))
            raise
        await self._reply(reply_channel, result)

    async def _reply(self, reply_channel: object, result: dict[str, Any] | None) -> None:
        if result is None or not isinstance(reply_channel, str) or not reply_channel:
            return
        try:
            await self.channel_layer.send(reply_channel, result)
        except Exception:
            logger.warning("device command result could not be delivered", exc_info=True)
