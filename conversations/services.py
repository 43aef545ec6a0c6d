"""Write-side services of the conversations app, and the ORM implementation of SessionHooks.

The voice session is plain asyncio; `DbSessionHooks` is the one place where it reaches the
database, always through `database_sync_to_async` and always from the session's background
jobs, never from the frame path.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from conversations.models import Conversation, Turn
from conversations.pipeline.config import SessionInfo, TurnRecord
from devices.models import Device
from devices.presence import device_mark_offline, device_mark_online, device_touch

logger = logging.getLogger(__name__)
T = TypeVar("T")

CONVERSATION_WAIT_SECONDS = 5.0  # a turn written before the conversation row exists waits this long
_TURN_FIELDS = ("user_text", "reply_text", "emotion", "tool_calls", "providers", "timings", "interrupted")


def conversation_start(
    *, session_id: str, device_id: int | None, persona_id: int | None,
    source: str = Conversation.SOURCE_DEVICE, client_address: str = "",
) -> Conversation:
    return Conversation.objects.create(
        session_id=session_id, source=source, device_id=device_id, persona_id=persona_id,
        client_address=client_address[:100],
    )


def conversation_add_turn(*, conversation_id: int, turn: TurnRecord) -> Turn:
    """Idempotent per (conversation, index): a retried write updates instead of failing."""
    values: dict[str, Any] = {name: getattr(turn, name) for name in _TURN_FIELDS}
    values["error"] = turn.error[:200]
    values["emotion"] = turn.emotion[:20]
    stored, _ = Turn.objects.update_or_create(conversation_id=conversation_id, index=turn.index, defaults=values)
    return stored


def conversation_end(*, conversation_id: int) -> None:
    Conversation.objects.filter(pk=conversation_id, ended_at__isnull=True).update(ended_at=timezone.now())


def device_mcp_tools_store(*, device_id: int, server_info: dict, tools: list[dict]) -> None:
    """The device's own tool list, as shown in the admin (user-only tools flagged)."""
    Device.objects.filter(pk=device_id).update(
        mcp_server_info=server_info, mcp_tools=tools, mcp_tools_updated_at=timezone.now(),
    )


@transaction.atomic
def _session_started(*, info: SessionInfo, persona_id: int | None, client_address: str) -> int:
    if info.device_id is not None:
        device_mark_online(device_id=info.device_id, session_id=info.session_id)
    conversation = conversation_start(
        session_id=info.session_id, device_id=info.device_id, persona_id=persona_id,
        client_address=client_address,
    )
    return conversation.pk


@transaction.atomic
def _session_closed(*, info: SessionInfo, conversation_id: int | None) -> None:
    if info.device_id is not None:
        device_mark_offline(device_id=info.device_id, session_id=info.session_id)
    if conversation_id is not None:
        conversation_end(conversation_id=conversation_id)


def _db(func: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    # Not thread-sensitive: presence and history writes must not queue behind sync views
    # (an admin page waiting on a device would hold them for its whole timeout).
    return database_sync_to_async(func, thread_sensitive=False)


class DbSessionHooks:
    """SessionHooks for one device connection: presence, tool list, history."""

    def __init__(self, *, device_id: int | None, persona_id: int | None, client_address: str = "") -> None:
        self.device_id = device_id
        self.persona_id = persona_id
        self.client_address = client_address
        self.conversation_id: int | None = None
        self._started = asyncio.Event()

    async def session_started(self, info: SessionInfo) -> None:
        try:
            self.conversation_id = await _db(_session_started)(
                info=info, persona_id=self.persona_id, client_address=self.client_address,
            )
        finally:
            self._started.set()

    async def tools_listed(self, server_info: dict, tools: list[dict]) -> None:
        if self.device_id is not None:
            await _db(device_mcp_tools_store)(
                device_id=self.device_id, server_info=server_info, tools=tools,
            )

    async def turn_finished(self, turn: TurnRecord) -> None:
        conversation_id = await self._conversation()
        if conversation_id is None:
            logger.warning("turn not stored: the conversation row does not exist", extra={"turn": turn.index})
            return
        await _db(conversation_add_turn)(conversation_id=conversation_id, turn=turn)

    async def session_closed(self, info: SessionInfo) -> None:
        await _db(_session_closed)(info=info, conversation_id=self.conversation_id)

    async def touch(self) -> None:
        if self.device_id is not None:
            await _db(device_touch)(device_id=self.device_id)

    async def _conversation(self) -> int | None:
        # The engine writes turns from its own queue; the first one may race the start.
        try:
            async with asyncio.timeout(CONVERSATION_WAIT_SECONDS):
                await self._started.wait()
        except TimeoutError:
            return None
        return self.conversation_id

