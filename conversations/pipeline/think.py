"""Thinking: a voice turn's LLM conversation (system prompt, the session's context window,
tools) on the shared LLM ↔ tools loop (conversations/turns/tool_loop.py), and the reply's
emotion.

`Thinker.think()` hands reply text to `on_text` as the model writes it (the turn speaks it at
once); tool calls run one after another through the session's Toolset, at most
`MAX_TOOL_DEPTH` rounds, the last one without tools so the model has to answer. Cancelling
the caller cancels the LLM request and any running tool.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from conversations.pipeline.config import DeviceInfo, PersonaConfig
from conversations.pipeline.fallback import ProviderChain
from conversations.pipeline.prompt import render_system_prompt
from conversations.pipeline.text import EMOJI_EMOTIONS, is_speakable, split_emotion
from conversations.turns.tool_loop import MAX_TOOL_ROUNDS, LLMOptions, OnText, Thought, ToolLoop, WaitWatcher
from tools.builtin import SessionToolState
from tools.registry import Toolset

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_EMOTION", "EMOTION_EMOJI", "MAX_TOOL_DEPTH", "EmotionGate", "Thinker", "Thought"]

MAX_TOOL_DEPTH = MAX_TOOL_ROUNDS
DEFAULT_EMOTION = "neutral"
_EMOTION_WAIT_CHARS = 24  # give up waiting for a leading emoji after this much text
# One emoji per emotion for the `llm` frame's text (the firmware only reads `emotion`).
EMOTION_EMOJI: dict[str, str] = {}
for _emoji, _emotion in EMOJI_EMOTIONS.items():
    EMOTION_EMOJI.setdefault(_emotion, _emoji)


class EmotionGate:
    """Holds back the start of a reply until its leading emoji, if any, is known.

    The emoji becomes the device's face (one `llm` frame per turn) and never reaches TTS.
    """

    def __init__(self) -> None:
        self._buf = ""
        self.emotion: str | None = None

    def push(self, delta: str) -> tuple[str | None, str]:
        """(emotion if decided just now, text to pass on)."""
        if self.emotion is not None:
            return None, delta
        self._buf += delta
        if not is_speakable(self._buf) and len(self._buf) < _EMOTION_WAIT_CHARS:
            return None, ""
        return self._decide()

    def flush(self) -> tuple[str | None, str]:
        """End of the reply: decide with whatever arrived (neutral when nothing did)."""
        if self.emotion is not None:
            return None, ""
        return self._decide()

    def _decide(self) -> tuple[str | None, str]:
        emotion, rest = split_emotion(self._buf)
        self.emotion = emotion or DEFAULT_EMOTION
        self._buf = ""
        return self.emotion, rest


class Thinker:
    """Per-session LLM conversation: system prompt, the last `context_turns` turns, tools."""

    def __init__(
        self,
        *,
        persona: PersonaConfig,
        device: DeviceInfo,
        toolset: Toolset,
        model: str,
        tool_state: SessionToolState | None = None,
        clock: Callable[[], float] = time.monotonic,
        first_token_timeout: float | None = None,
        inter_token_timeout: float | None = None,
    ) -> None:
        self._first_token_timeout = first_token_timeout
        self._inter_token_timeout = inter_token_timeout
        self._persona = persona
        self._device = device
        self._toolset = toolset
        self._model = model
        self._state = tool_state
        self._clock = clock
        self._history: deque[tuple[str, str]] = deque(maxlen=max(0, persona.context_turns))

    def messages(self, user_text: str) -> list[dict[str, Any]]:
        language = self._state.language if self._state is not None else None
        system = render_system_prompt(self._persona, self._device, self._state, language=language)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for user, assistant in self._history:
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        messages.append({"role": "user", "content": user_text})
        return messages

    def remember(self, user_text: str, reply_text: str) -> None:
        """Keep a finished (or interrupted) exchange in the context window."""
        if user_text:
            self._history.append((user_text, reply_text))

    async def think(
        self, chain: ProviderChain, user_text: str, thought: Thought, on_text: OnText | None = None,
        watcher: WaitWatcher | None = None, before_tools: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Reply text to `on_text` as it streams. Raises ProviderError when no LLM answers (or
        one breaks or stalls); `watcher` hears of the user's waits (the filler); tool calls
        wait for `before_tools` (an early reply runs none before its turn is certain)."""
        loop = ToolLoop(
            toolset=self._toolset,
            options=LLMOptions(self._model, self._persona.temperature, self._persona.max_tokens),
            max_rounds=MAX_TOOL_DEPTH,
            clock=self._clock,
            first_token_timeout=self._first_token_timeout,
            inter_token_timeout=self._inter_token_timeout,
            watcher=watcher,
            before_tools=before_tools,
        )
        await loop.run(chain, self.messages(user_text), thought, on_text)
