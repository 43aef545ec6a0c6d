"""The seams of the voice session: what it needs from the database and the engine.

`VoiceSession` (session.py) owns the device protocol, the session's state and its listen
mode; a `VoiceEngine` (engine.py) owns hearing, thinking and speaking. They meet only
through `EngineContext`: the engine reads the mode, sends its messages and audio, and
*reports* what its reply does (`ReplyEvents`); the session decides the state and what the
device hears of it (`tts start`, `tts stop`). Each side can be tested with the real other
side or with `NullEngine` / `NullHooks` below. The socket is the shared `Transport`
(conversations/turns/transport.py).
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from conversations.pipeline.config import SessionConfig, SessionInfo
from conversations.turns.record import TurnRecord
from conversations.turns.transport import Transport
from devices.protocol.messages import Message, TtsSentenceStart
from tools.builtin import SessionToolState
from tools.registry import Toolset

logger = logging.getLogger(__name__)

__all__ = [
    "EngineContext", "EngineFactory", "NullEngine", "NullHooks", "ReplyEvents", "SessionHooks", "Transport",
    "VoiceEngine", "null_engine_factory",
]


class SessionHooks(Protocol):
    """Persistence, implemented with the ORM in conversations/services.py.

    The session calls the async ones from background jobs, in order, never from the frame
    path; `turn_finished` is called on the reply path and must return at once (enqueue).
    """

    async def session_started(self, info: SessionInfo) -> None: ...  # hello answered (online since the claim)

    async def tools_listed(self, server_info: dict, tools: list[dict]) -> None: ...

    def turn_finished(self, turn: TurnRecord) -> None: ...

    async def session_closed(self, info: SessionInfo) -> None: ...  # history drained (offline: the consumer)

    async def touch(self) -> None: ...  # last seen, at most once a minute


class ReplyEvents(Protocol):
    """What a reply does, as the engine reports it to the session (which implements this).

    One reply at a time: `reply_started` → (`reply_speaking`) → `reply_ended`, always ended,
    however the reply stops. The session owns the consequences: a turn makes it THINKING,
    speaking sends `tts start` (SPEAKING), and the end sends `tts stop` if `tts start` went
    out, then returns to the rest state of the listen mode (IDLE in manual mode, else
    LISTENING). So `tts stop` has one sender, the end of the reply, whoever interrupted it.
    """

    def reply_started(self, kind: str) -> None: ...  # "turn" (an utterance ended) | "say" | "greeting"

    async def reply_speaking(self) -> None: ...  # its first words are due

    async def reply_ended(self, interrupted: bool) -> None: ...


@dataclass
class EngineContext:
    """Everything an engine may use; built by the session right after the hello went out."""

    config: SessionConfig
    toolset: Toolset  # built-in tools now; the device's MCP tools join once listed
    send: Callable[[Message], Awaitable[None]]  # JSON to the device, session_id filled in; never `tts start/stop`
    send_audio: Callable[[bytes], Awaitable[None]]  # one Opus packet; dropped unless SPEAKING
    replies: ReplyEvents  # the session
    listen_mode: Callable[[], str]  # "auto" | "manual" | "realtime", the session's
    hooks: SessionHooks  # turn_finished
    voice_activity: Callable[[], None]  # resets the no-voice idle timer
    request_close: Callable[[str], None]  # exit phrase / end_conversation: close (1000)
    tool_state: SessionToolState | None = None  # what built-in tools wrote (end_requested…)
    # The device asked for server-side echo cancellation (`features.aec`, protocol v2): the
    # session reports each sent frame (`on_audio_sent`) and uplink packets carry timestamps.
    server_aec: bool = False


class VoiceEngine(Protocol):
    """What the session calls. `on_*` must return at once (queue and return)."""

    def on_listen_start(self) -> None: ...  # the mode is `ctx.listen_mode()`

    def on_listen_stop(self) -> None: ...

    def on_listen_detect(self, text: str) -> None: ...

    def on_audio(self, opus: bytes, timestamp: int) -> None: ...  # timestamp: v2 uplink stamp (0: none)

    def on_audio_sent(self, opus: bytes, timestamp: int) -> None: ...  # server AEC's reference

    async def interrupt(self, reason: str | None) -> None: ...  # returns once the reply has ended

    async def say(self, text: str, *, record: bool = False) -> None: ...  # returns after the reply ended;
    # record: a turn of the history (an operator's `say`), not the server's own words

    async def aclose(self) -> None: ...


EngineFactory = Callable[[EngineContext], VoiceEngine]


class NullEngine:
    """An engine without a voice: drops audio, and `say` is a reply of subtitles only.

    Lets the protocol layer run (and be tested) without models. It records what it was
    told in `events` as (name, argument) pairs. Its replies are `say` and whatever a test
    reports through `ctx.replies`; `interrupt` ends the reply in progress, if any.
    """

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.events: list[tuple[str, object]] = []
        self.audio_frames = 0

    def on_listen_start(self) -> None:
        self.events.append(("listen_start", self.ctx.listen_mode()))

    def on_listen_stop(self) -> None:
        self.events.append(("listen_stop", None))

    def on_listen_detect(self, text: str) -> None:
        self.events.append(("listen_detect", text))

    async def interrupt(self, reason: str | None) -> None:
        self.events.append(("abort", reason))
        await self.ctx.replies.reply_ended(interrupted=True)

    def on_audio(self, opus: bytes, timestamp: int = 0) -> None:
        self.audio_frames += 1

    def on_audio_sent(self, opus: bytes, timestamp: int) -> None:
        self.events.append(("audio_sent", timestamp))

    async def say(self, text: str, *, record: bool = False) -> None:
        self.events.append(("say", text))
        self.ctx.replies.reply_started("say")
        await self.ctx.replies.reply_speaking()
        await self.ctx.send(TtsSentenceStart(text=text))
        await self.ctx.replies.reply_ended(interrupted=False)

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

    def turn_finished(self, turn: TurnRecord) -> None:
        return None

    async def session_closed(self, info: SessionInfo) -> None:
        return None

    async def touch(self) -> None:
        return None
