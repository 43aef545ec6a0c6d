"""GatewayConsumer: the thin Channels adapter between a text client and a GatewaySession.

connect → authenticate the API key (auth.py; CLOUD_AUTH=required: accept, then `error`
UNAUTHORIZED and close 4001 without a valid key) → admit (the key's connection cap, then
CLOUD_MAX_CONNECTIONS, seed §11.1: close 1013 when full) and start a session; receive → the
key's rate limit for `text_input`, then `session.feed()`; disconnect → `session.aclose()`
and the key's slot back. The per-key counts hold over every web worker (limits.py: in Redis
with REDIS_URL); CLOUD_MAX_CONNECTIONS is a per-process protection limit, counted here.
Process-wide pieces live here because they need settings: the connection counters, the
session store (store.py explains why it is in-process) and one LLM client per event loop
(building an OpenAI client costs ~35 ms of TLS setup, too much to pay on every connection).
"""
from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from conversations.gateway import protocol
from conversations.gateway.auth import (
    CLOSE_TRY_AGAIN_LATER,
    CLOSE_UNAUTHORIZED,
    AuthErrorCode,
    KeyGrant,
    credential,
    error_message,
    is_text_input,
)
from conversations.gateway.keys import gateway_key_authenticate, key_group
from conversations.gateway.limits import KeyLimiter, KeySlot
from conversations.gateway.protocol import ErrorCode
from conversations.gateway.services import GatewayLLM, gateway_characters, gateway_llm, gateway_llm_chain
from conversations.gateway.session import GatewaySession
from conversations.gateway.session_config import SYSTEM_PROMPT, GatewayConfig
from conversations.gateway.store import SessionStore
from conversations.models import Conversation
from conversations.pipeline.config import ProviderSpec
from conversations.pipeline.fallback import ProviderChain
from conversations.selectors import scope_client_address
from conversations.services import HISTORY
from conversations.turns.history import ConversationKey
from conversations.turns.record import TurnRecord
from dashboard.live import REGISTRY as LIVE_FIGURES

if TYPE_CHECKING:
    from asgiref.typing import WebSocketReceiveEvent

log = logging.getLogger(__name__)

CLOSE_INTERNAL_ERROR = 1011


def gateway_config(characters: list[dict[str, str]], system_prompt: str = "", model: str = "") -> GatewayConfig:
    """`model`: the persona's (`GatewayLLM.model`); empty: LLM_MODEL."""
    return GatewayConfig(
        model=model or settings.LLM_MODEL,
        llm_timeout=settings.LLM_TIMEOUT,
        llm_inter_token_timeout=settings.LLM_INTER_TOKEN_TIMEOUT,
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
        system_prompt=system_prompt or SYSTEM_PROMPT,
    )


class _Process:
    """Per-process state: live connection counts, the key limiter (its counts shared by the
    workers when Redis links them), the session store, the shared LLM chains (one per chain of
    configurations: personas sharing configurations share clients and the failed-provider
    cooldowns)."""

    def __init__(self) -> None:
        self.connections = 0
        self.keys = KeyLimiter.for_url(settings.REDIS_URL)
        self.store = SessionStore(timeout=3600.0, cleanup_interval=60.0, on_expired=_conversations_end)
        self.history = HISTORY
        # (specs) -> chain; replaceable, e.g. by a test
        self.llm_factory: Callable[[tuple[ProviderSpec, ...]], ProviderChain] = gateway_llm_chain
        self._llm: dict[tuple[Any, ...], ProviderChain] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def admit(self) -> bool:
        # Synchronous on purpose: no await between the check and the increment.
        if self.connections >= settings.CLOUD_MAX_CONNECTIONS:
            return False
        self.connections += 1
        return True

    def acquire(self, specs: tuple[ProviderSpec, ...]) -> ProviderChain:
        """Per admitted connection: the loop's LLM chain for `specs`; the first connection
        starts the sweeper. An edited configuration gives new specs, hence a new chain."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first connection, or a new loop (tests)
            self._loop = loop
            self._llm = {}
        key = tuple((spec.name, spec.kind, spec.model, repr(sorted(spec.kwargs.items()))) for spec in specs)
        if key not in self._llm:
            self._llm[key] = self.llm_factory(specs)
        self.store.timeout = settings.CLOUD_SESSION_TIMEOUT
        self.store.cleanup_interval = settings.CLOUD_SESSION_CLEANUP_INTERVAL
        self.store.max_detached = settings.CLOUD_MAX_DETACHED_SESSIONS
        self.store.max_history_bytes = settings.CLOUD_SESSION_HISTORY_BYTES
        self.store.start_sweeper()
        return self._llm[key]

    async def release(self) -> None:
        self.connections -= 1
        if self.connections > 0:
            return
        # The last connection is gone: no timer on a quiet server (the LLM clients' idle
        # connections are the process's, conversations/providers/llm/openai_compat.py).
        chains, self._llm, self._loop = self._llm, {}, None
        await self.store.stop_sweeper()
        await self.history.flush()
        for llm in chains.values():
            await llm.aclose()


def _session_data(persona_id: int | None) -> tuple[list[dict[str, str]], GatewayLLM]:
    """One database hop per connection: the role-play characters and the LLM chain and model."""
    return gateway_characters(), gateway_llm(persona_id)


async def _conversations_end(session_ids: list[str]) -> None:
    for session_id in session_ids:
        HISTORY.end_conversation(ConversationKey(session_id, Conversation.SOURCE_GATEWAY))


PROCESS = _Process()


class _HistoryHooks:
    """GatewayHooks: exchanges go to the process's HistoryWriter, stored as
    Conversation(source="gateway") + Turn rows for conversation review."""

    def __init__(self, client_address: str) -> None:
        self.client_address = client_address

    def turn_finished(self, turn: TurnRecord) -> None:
        key = ConversationKey(turn.session_id, Conversation.SOURCE_GATEWAY, client_address=self.client_address)
        PROCESS.history.add_turn(key, turn)

    def session_ended(self, session_id: str) -> None:
        PROCESS.history.end_conversation(ConversationKey(session_id, Conversation.SOURCE_GATEWAY))


class GatewayConsumer(AsyncWebsocketConsumer):
    session: GatewaySession | None = None
    admitted: bool = False
    grant: KeyGrant | None = None  # the authenticated key (None with CLOUD_AUTH=open)
    key_slot: KeySlot | None = None  # this connection's place in its key's count
    revoked: bool = False

    async def connect(self) -> None:
        await self.accept()
        try:
            if settings.CLOUD_AUTH == "required":
                self.grant = await self._authenticate()
                if self.grant is None:
                    return
            if not await self._admit():
                return
            self.admitted = True
            persona_id = self.grant.persona_id if self.grant else None
            characters, persona_llm = await database_sync_to_async(_session_data)(persona_id)
            llm = PROCESS.acquire(persona_llm.specs)
            if self.grant is not None:
                await self._join_key_group(self.grant.key_id)
            hooks = _HistoryHooks(scope_client_address(self.scope))
            config = gateway_config(characters, self.grant.system_prompt if self.grant else "", persona_llm.model)
            self.session = GatewaySession(self, config, PROCESS.store, llm, hooks)
            LIVE_FIGURES.track_gateway(self)  # the dashboard counts connected clients
            await self.session.start()
        except Exception:
            log.exception("gateway session failed to start")
            await self.send(text_data=protocol.encode(protocol.error(ErrorCode.INTERNAL_ERROR, "Internal error")))
            await self.close(code=CLOSE_INTERNAL_ERROR, reason="internal error")

    async def _authenticate(self) -> KeyGrant | None:
        """The handshake's key, checked before the connection counts or costs anything."""
        secret = credential(self.scope)
        grant = await database_sync_to_async(gateway_key_authenticate)(secret) if secret else None
        if grant is None:
            address = scope_client_address(self.scope)
            if secret:
                log.warning("gateway connection refused, invalid or revoked key", extra={"address": address})
                message, reason = "Invalid or revoked key", "invalid key"
            else:
                log.info("gateway connection refused, no key", extra={"address": address})
                message, reason = "Authentication required", "key missing"
            details = "send an API key as 'Authorization: Bearer <key>' or '?token=<key>'"
            error = error_message(AuthErrorCode.UNAUTHORIZED, message, details)
            await self._refuse(error, CLOSE_UNAUTHORIZED, reason)
        return grant

    async def _admit(self) -> bool:
        """The key's connection cap (over all workers), then the process's."""
        grant = self.grant
        if grant is not None:
            self.key_slot = await PROCESS.keys.open(grant)
            if self.key_slot is None:
                log.warning("gateway connection refused, key connection cap", extra={"key_id": grant.key_id})
                details = f"this key may hold {grant.max_connections} connections at once"
                error = error_message(AuthErrorCode.RATE_LIMITED, "Too many connections for this key", details)
                await self._refuse(error, CLOSE_TRY_AGAIN_LATER, "too many connections for this key")
                return False
        if not PROCESS.admit():  # synchronous: no await between its check and its count
            await self._close_key_slot()
            log.warning("gateway connection refused, limit reached", extra={"limit": settings.CLOUD_MAX_CONNECTIONS})
            await self.close(code=CLOSE_TRY_AGAIN_LATER, reason="too many connections")
            return False
        return True

    async def _refuse(self, error: dict[str, Any], code: int, reason: str) -> None:
        await self.send(text_data=protocol.encode(error))
        await self.close(code=code, reason=reason)

    async def _join_key_group(self, key_id: int) -> None:
        # Revoking the key in the admin reaches this connection through the channel layer.
        try:
            await self.channel_layer.group_add(key_group(key_id), self.channel_name)
        except Exception:
            log.warning("gateway connection not reachable for key revocation", extra={"key_id": key_id})

    async def gateway_key_revoked(self, event: dict[str, Any]) -> None:
        """The admin revoked (or deleted) this connection's key."""
        self.revoked = True
        error = error_message(AuthErrorCode.UNAUTHORIZED, "Key revoked", "the key was revoked by an administrator")
        await self._refuse(error, CLOSE_UNAUTHORIZED, "key revoked")

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels runs close_old_connections() on the single DB thread before every handler.
        # Frames never touch the ORM (history goes through database_sync_to_async, which does
        # its own cleanup), and that hop would queue each frame behind the last turn's write.
        if message["type"] == "websocket.receive":
            await self.websocket_receive(cast("WebSocketReceiveEvent", message))
            return
        await super().dispatch(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.session is None or self.revoked:
            return
        if text_data is not None:
            if self.grant is not None and is_text_input(text_data, settings.CLOUD_MAX_MESSAGE_BYTES):
                if not await self._request_allowed(self.grant):
                    return
            await self.session.feed(text_data)
        elif bytes_data is not None:
            await self.session.feed_bytes(bytes_data)

    async def _request_allowed(self, grant: KeyGrant) -> bool:
        wait = await PROCESS.keys.request(grant)
        if not wait:
            return True
        log.info("gateway request refused, key rate limit", extra={"key_id": grant.key_id})
        details = f"at most {grant.requests_per_minute} requests per minute; retry in {math.ceil(wait)} s"
        error = error_message(AuthErrorCode.RATE_LIMITED, "Rate limit exceeded", details)
        await self.send(text_data=protocol.encode(error))
        return False

    async def disconnect(self, code: int) -> None:
        session, self.session = self.session, None
        admitted, self.admitted = self.admitted, False
        try:
            await self._close_key_slot()
            if session is not None:
                await session.aclose()
        finally:
            if admitted:
                await PROCESS.release()
                if self.grant is not None:
                    await self._leave_key_group(self.grant.key_id)

    async def _close_key_slot(self) -> None:
        """Give the key's slot back. Its refresh stops and a count in this process drops
        before the first suspension, so a cancelled disconnect keeps no slot here (one in
        Redis expires by itself, SLOT_TTL)."""
        slot, self.key_slot = self.key_slot, None
        if slot is not None:
            await PROCESS.keys.close(slot)

    async def _leave_key_group(self, key_id: int) -> None:
        try:
            await self.channel_layer.group_discard(key_group(key_id), self.channel_name)
        except Exception:
            log.info("gateway key group discard failed", extra={"key_id": key_id})

    async def send_text(self, text: str) -> None:
        """Transport for the session."""
        await self.send(text_data=text)

    async def send_bytes(self, data: bytes) -> None:
        await self.send(bytes_data=data)
