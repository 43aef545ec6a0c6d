"""GatewayConsumer: the thin Channels adapter between a text client and a GatewaySession.

connect → admit (CLOUD_MAX_CONNECTIONS, seed §11.1: accept, then close 1013 when full) and
start a session; receive → `session.feed()`; disconnect → `session.aclose()`. Process-wide
pieces live here because they need settings: the connection counter, the session store
(store.py explains why it is in-process) and one LLM client per event loop (building an
OpenAI client costs ~35 ms of TLS setup, too much to pay on every connection).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from conversations.gateway import protocol
from conversations.gateway.protocol import ErrorCode
from conversations.gateway.history import HistoryWriter, PendingTurn
from conversations.gateway.services import gateway_characters, gateway_conversations_end, gateway_history_save
from conversations.gateway.config import GatewayConfig, TurnRecord
from conversations.gateway.session import GatewaySession
from conversations.gateway.store import SessionStore
from conversations.providers.base import LLM
from conversations.providers.registry import build
from conversations.selectors import scope_client_address
from dashboard.live import REGISTRY as LIVE_FIGURES

log = logging.getLogger(__name__)

CLOSE_TRY_AGAIN_LATER = 1013  # seed §11.1: the server is full
CLOSE_INTERNAL_ERROR = 1011
_LLM_TIMEOUT_MARGIN = 5.0  # the session's own LLM deadline must fire first (→ TIMEOUT)


def gateway_config(characters: list[dict[str, str]]) -> GatewayConfig:
    return GatewayConfig(
        model=settings.LLM_MODEL,
        llm_timeout=settings.LLM_TIMEOUT,
        temperature=settings.LLM_TEMPERATURE,
        max_tokens=settings.LLM_MAX_TOKENS,
        max_tokens_limit=settings.LLM_MAX_TOKENS,
        enable_context=settings.LLM_ENABLE_CONTEXT,
        history_messages=settings.CLOUD_HISTORY_MESSAGES,
        client_tools_enabled=settings.CLIENT_TOOLS_ENABLED,
        client_tools_max=settings.CLIENT_TOOLS_MAX_COUNT,
        client_tool_timeout=settings.TOOLS_CLIENT_TIMEOUT,
        server_tool_timeout=settings.TOOLS_SERVER_TIMEOUT,
        max_message_bytes=settings.CLOUD_MAX_MESSAGE_BYTES,
        idle_timeout=settings.CLOUD_PING_TIMEOUT,
        idle_check_interval=settings.CLOUD_PING_INTERVAL,
        timezone=settings.TIME_ZONE,
        weather_base_url=settings.WEATHER_BASE_URL,
        geocoding_url=settings.WEATHER_GEOCODING_URL,
        characters=tuple(characters),
    )


def build_llm() -> LLM:
    """The gateway's LLM: the OpenAI-compatible provider configured by the LLM_* settings."""
    return build(  # type: ignore[no-any-return]
        "llm",
        "openai",
        base_url=settings.LLM_BASE_URL,
        api_key=settings.LLM_API_KEY,
        timeout=settings.LLM_TIMEOUT + _LLM_TIMEOUT_MARGIN,
    )


class _Process:
    """Per-process state: live connection count, the session store, the shared LLM."""

    def __init__(self) -> None:
        self.connections = 0
        self.store = SessionStore(timeout=3600.0, cleanup_interval=60.0, on_expired=_conversations_end)
        self.history = HistoryWriter(_history_save)
        self.llm_factory: Callable[[], LLM] = build_llm  # replaceable, e.g. by a test
        self._llm: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def admit(self) -> bool:
        # Synchronous on purpose: no await between the check and the increment.
        if self.connections >= settings.CLOUD_MAX_CONNECTIONS:
            return False
        self.connections += 1
        return True

    def acquire(self) -> LLM:
        """Per admitted connection: the loop's LLM client; the first one starts the sweeper."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first connection, or a new loop (tests)
            self._loop = loop
            self._llm = self.llm_factory()
        self.store.timeout = settings.CLOUD_SESSION_TIMEOUT
        self.store.cleanup_interval = settings.CLOUD_SESSION_CLEANUP_INTERVAL
        self.store.start_sweeper()
        self.history.start()
        return self._llm  # type: ignore[no-any-return]

    async def release(self) -> None:
        self.connections -= 1
        if self.connections > 0:
            return
        # The last connection is gone: no timer and no idle HTTP pool on a quiet server.
        llm, self._llm, self._loop = self._llm, None, None
        await self.store.stop_sweeper()
        await self.history.aclose()
        if llm is not None and hasattr(llm, "aclose"):
            await llm.aclose()


async def _conversations_end(session_ids: list[str]) -> None:
    await database_sync_to_async(gateway_conversations_end)(session_ids=session_ids)


async def _history_save(turns: list[PendingTurn], ended: list[str]) -> None:
    await database_sync_to_async(gateway_history_save)(turns=turns, ended_session_ids=ended, model=settings.LLM_MODEL)


PROCESS = _Process()


class _HistoryHooks:
    """GatewayHooks: exchanges go to the process's HistoryWriter, stored as
    Conversation(source="gateway") + Turn rows for conversation review."""

    def __init__(self, client_address: str) -> None:
        self.client_address = client_address

    def turn_finished(self, turn: TurnRecord) -> None:
        PROCESS.history.add_turn(turn, self.client_address)

    def session_ended(self, session_id: str) -> None:
        PROCESS.history.end_session(session_id)


class GatewayConsumer(AsyncWebsocketConsumer):
    session: GatewaySession | None = None
    admitted: bool = False

    async def connect(self) -> None:
        await self.accept()
        if not PROCESS.admit():
            log.warning("gateway connection refused, limit reached", extra={"limit": settings.CLOUD_MAX_CONNECTIONS})
            await self.close(code=CLOSE_TRY_AGAIN_LATER, reason="too many connections")
            return
        self.admitted = True
        try:
            llm = PROCESS.acquire()
            characters = await database_sync_to_async(gateway_characters)()
            hooks = _HistoryHooks(scope_client_address(self.scope))
            self.session = GatewaySession(self, gateway_config(characters), PROCESS.store, llm, hooks)
            LIVE_FIGURES.track_gateway(self)  # the dashboard counts connected clients
            await self.session.start()
        except Exception:
            log.exception("gateway session failed to start")
            await self.send(text_data=protocol.encode(protocol.error(ErrorCode.INTERNAL_ERROR, "Internal error")))
            await self.close(code=CLOSE_INTERNAL_ERROR, reason="internal error")

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels runs close_old_connections() on the single DB thread before every handler.
        # Frames never touch the ORM (history goes through database_sync_to_async, which does
        # its own cleanup), and that hop would queue each frame behind the last turn's write.
        if message["type"] == "websocket.receive":
            await self.websocket_receive(message)
            return
        await super().dispatch(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.session is None:
            return
        if text_data is not None:
            await self.session.feed(text_data)
        elif bytes_data is not None:
            await self.session.feed_bytes(bytes_data)

    async def disconnect(self, code: int) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.aclose()
        if self.admitted:
            self.admitted = False
            await PROCESS.release()

    async def send_text(self, text: str) -> None:
        """Transport for the session."""
        await self.send(text_data=text)
