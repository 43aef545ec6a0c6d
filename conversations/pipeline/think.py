"""Thinking: the LLM stream with its tool-call loop, the session's context window, and the
reply's emotion.

`Thinker.stream()` yields reply text as the model writes it; when the model asks for tools
it runs them through the session's Toolset (which never raises, so a failing tool becomes
text the model can apologise about) and asks again, at most `MAX_TOOL_DEPTH` rounds, the
last one without tools so the model has to answer. Cancelling the consumer cancels the LLM
request and any running tool (Toolset.call lets CancelledError through).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from conversations.pipeline import fallback
from conversations.pipeline.config import DeviceInfo, PersonaConfig
from conversations.pipeline.fallback import ProviderChain
from conversations.pipeline.prompt import render_system_prompt
from conversations.pipeline.text import EMOJI_EMOTIONS, is_speakable, split_emotion
from conversations.providers.base import ToolCall
from tools.builtin import SessionToolState
from tools.registry import ToolCallRecord, Toolset

log = logging.getLogger(__name__)

MAX_TOOL_DEPTH = 5
DEFAULT_EMOTION = "neutral"
_EMOTION_WAIT_CHARS = 24  # give up waiting for a leading emoji after this much text
# One emoji per emotion for the `llm` frame's text (the firmware only reads `emotion`).
EMOTION_EMOJI: dict[str, str] = {}
for _emoji, _emotion in EMOJI_EMOTIONS.items():
    EMOTION_EMOJI.setdefault(_emotion, _emoji)


@dataclass
class Thought:
    """What one turn's thinking produced, for the turn record."""

    reply_text: str = ""
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    first_token_at: float | None = None

    def tool_call_dicts(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(record) for record in self.tool_calls]


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


def tool_message(call: ToolCall, record: ToolCallRecord) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": record.result}


def assistant_tool_message(text: str, calls: list[ToolCall]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }


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
    ) -> None:
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

    async def stream(self, chain: ProviderChain, user_text: str, thought: Thought) -> AsyncIterator[str]:
        """Reply text deltas. Raises ProviderError when no LLM answers (or one breaks)."""
        messages = self.messages(user_text)
        for depth in range(MAX_TOOL_DEPTH + 1):
            tools = self._toolset.llm_tools() if depth < MAX_TOOL_DEPTH else []
            calls: list[ToolCall] = []
            parts: list[str] = []
            async for text, new_calls in self._round(chain, messages, tools, thought):
                if text:
                    parts.append(text)
                    yield text
                calls = new_calls or calls
            if not calls:
                return
            messages.append(assistant_tool_message("".join(parts), calls))
            for call in calls:
                record = await self._toolset.call(call.name, call.arguments)
                thought.tool_calls.append(record)
                messages.append(tool_message(call, record))
        log.warning("tool-call depth limit reached", extra={"depth": MAX_TOOL_DEPTH})

    async def _round(
        self, chain: ProviderChain, messages: list[dict[str, Any]], tools: list[dict], thought: Thought
    ) -> AsyncIterator[tuple[str, list[ToolCall] | None]]:
        kind, deltas = await fallback.stream_llm(
            chain,
            messages,
            tools=tools or None,
            model=self._model,
            temperature=self._persona.temperature,
            max_tokens=self._persona.max_tokens,
        )
        if kind not in thought.providers:
            thought.providers.append(kind)
        async for delta in deltas:
            if thought.first_token_at is None and (delta.text or delta.tool_calls):
                thought.first_token_at = self._clock()
            thought.reply_text += delta.text
            yield delta.text, delta.tool_calls
