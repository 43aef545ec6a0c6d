"""The seams of the voice session: what it needs from the socket, the database and the engine.

`VoiceSession` (session.py) owns the device protocol; a `VoiceEngine` (engine.py) owns
hearing, thinking and speaking. They meet only through `EngineContext`, so each side can be
tested with the real other side or with `NullEngine` / `NullHooks` below.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from conversations.pipeline.config import SessionConfig, SessionInfo, TurnRecord
from conversations.pipeline.states import SessionState
from devices.protocol.messages import Message, TtsSentenceStart, TtsStart, TtsStop
from tools.builtin import SessionToolState
from tools.registry import Toolset

logger = logging.getLogger(__name__)


class Transport(Protocol):
    """The socket, as the consumer exposes it. Sends after close are dropped silently."""

    async def send_text(self, text: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class SessionHooks(Protocol):
    """Persistence, implemented with the ORM in conversations/services.py.

    The session calls these from background jobs, in order, never from the frame path.
    """

    async def session_started(self, info: SessionInfo) -> None: ...  # presence online

    async def tools_listed(self, server_info: dict, tools: list[dict]) -> None: ...

    async def turn_finished(self, turn: TurnRecord) -> None: ...

    async def session_closed(self, info: SessionInfo) -> None: ...  # presence offline

    async def touch(self) -> None: ...  # last seen, at most once a minute


@dataclass
class EngineContext:
    """Everything an engine may use; built by the session right after the hello went out."""

    config: SessionConfig
    toolset: Toolset  # built-in tools now; the device's MCP tools join once listed
    send: Callable[[Message], Awaitable[None]]  # JSON to the device; session_id filled in
    send_audio: Callable[[bytes], Awaitable[None]]  # one Opus packet; dropped unless SPEAKING
    set_state: Callable[[SessionState], None]  # checked transition (IllegalTransition)
    get_state: Callable[[], SessionState]
    hooks: SessionHooks  # turn_finished
    voice_activity: Callable[[], None]  # resets the no-voice idle timer
    request_close: Callable[[str], None]  # exit phrase / end_conversation: close (1000)
    tool_state: SessionToolState | None = None  # what built-in tools wrote (end_requested…)


class VoiceEngine(Protocol):
    """What the session calls. `on_*` must return at once (queue and return)."""

    def on_listen_start(self, mode: str) -> None: ...

    def on_listen_stop(self) -> None: ...

    def on_listen_detect(self, text: str) -> None: ...

    def on_abort(self, reason: str | None) -> None: ...

    def on_audio(self, opus: bytes) -> None: ...

    async def say(self, text: str) -> None: ...

    async def aclose(self) -> None: ...


EngineFactory = Callable[[EngineContext], VoiceEngine]


class NullEngine:
    """An engine without a voice: drops audio, and `say` sends the text frames only.

    Lets the protocol layer run (and be tested) without models. It records what it was
    told in `events` as (name, argument) pairs.
    """

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.events: list[tuple[str, object]] = []
        self.audio_frames = 0

    def on_listen_start(self, mode: str) -> None:
        self.events.append(("listen_start", mode))

    def on_listen_stop(self) -> None:
        self.events.append(("listen_stop", None))

    def on_listen_detect(self, text: str) -> None:
        self.events.append(("listen_detect", text))

    def on_abort(self, reason: str | None) -> None:
        self.events.append(("abort", reason))

    def on_audio(self, opus: bytes) -> None:
        self.audio_frames += 1

    async def say(self, text: str) -> None:
        self.events.append(("say", text))
        await self.ctx.send(TtsStart())
        await self.ctx.send(TtsSentenceStart(text=text))
        await self.ctx.send(TtsStop())

    async def aclose(self) -> None:
        self.events.append(("close", None))


def null_engine_factory(ctx: EngineContext) -> NullEngine:
    return NullEngine(ctx)


class NullHooks:
    """Hooks that persist nothing (tests, or a server run without a database)."""

    async def session_started(self, info: SessionInfo) -> None:
        return None

    async def tools_listed(self, server_info: dict, tools: list[dict]) -> None:
        return None

    async def turn_finished(self, turn: TurnRecord) -> None:
        return None

    async def session_closed(self, info: SessionInfo) -> None:
        return None

    async def touch(self) -> None:
        return None
