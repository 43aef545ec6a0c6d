"""Zero-latency and failing providers for tests and benchmarks.

They implement the real provider contracts (conversations/providers/base.py) and register
themselves in the provider registry when this module is imported, so a running server can
use them with `XIAOZHI_PROVIDER_PLUGINS=testing.fake_providers` and a persona listing e.g.
asr ["fake_echo"], llm ["fake_echo"], tts ["fake_tone"]. Options come from the session's
provider configuration like any provider's (`"asr.fake_echo": {"text": "hi"}`).

Kinds:
- asr  fake_echo: answers `text` (or the next of `script`) at once.
- llm  fake_echo: streams `reply` (default: an emoji and the user's words) at once; with
       `tool_calls` it first calls those tools, then answers after the tool results;
       `stall_after=N` goes silent for good after N chunks of the answer.
- tts  fake_tone: `duration_ms` of a 440 Hz tone per sentence at once.
- asr/llm/tts fail: raise ProviderError (after `delay` seconds).
- asr/llm/tts hang: never answer (for timeout fallbacks).
"""
from __future__ import annotations

import asyncio
import functools
import json
import math
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from conversations.providers.base import LLMDelta, PCMChunk, ProviderError, ToolCall
from conversations.providers.registry import REGISTRY

_MODULE = __name__


class FakeEchoASR:
    name = "fake_echo"

    def __init__(self, text: str = "hello", script: list[str] | None = None, **_: Any) -> None:
        self.text = text
        self.script: deque[str] = deque(script or [])
        self.calls: list[int] = []  # PCM byte counts, for assertions

    async def transcribe(self, pcm: bytes, sample_rate: int, language: str | None) -> str:
        self.calls.append(len(pcm))
        return self.script.popleft() if self.script else self.text


class FakeEchoLLM:
    name = "fake_echo"

    def __init__(
        self,
        reply: str = "",
        tool_calls: list[dict[str, Any]] | None = None,
        first_token_delay: float = 0.0,
        chunk_chars: int = 8,
        stall_after: int | None = None,
        **_: Any,
    ) -> None:
        self.reply = reply
        self.tool_calls = list(tool_calls or [])
        self.first_token_delay = float(first_token_delay)
        self.chunk_chars = max(1, int(chunk_chars))
        self.stall_after = stall_after
        self.requests: list[list[dict]] = []
        self.cancelled = 0  # requests whose caller went away before the reply ended

    async def stream(
        self, messages: list[dict], *, tools: list[dict] | None, model: str, temperature: float, max_tokens: int
    ) -> AsyncIterator[LLMDelta]:
        self.requests.append(messages)
        if self.first_token_delay:
            try:
                await asyncio.sleep(self.first_token_delay)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.tool_calls and tools and messages and messages[-1].get("role") == "user":
            yield LLMDelta(tool_calls=[_call(i, c) for i, c in enumerate(self.tool_calls)])
            return
        text = self.reply or f"🙂 You said: {_last_user_text(messages)}."
        for number, start in enumerate(range(0, len(text), self.chunk_chars)):
            if number == self.stall_after:
                await asyncio.Event().wait()  # a model that stops sending and never finishes
            yield LLMDelta(text=text[start : start + self.chunk_chars])


def _call(index: int, spec: dict[str, Any]) -> ToolCall:
    arguments = spec.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(id=f"call_fake_{index}", name=str(spec["name"]), arguments=text)


def _last_user_text(messages: list[dict]) -> str:
    users = [m for m in messages if m.get("role") == "user"]
    return str(users[-1].get("content", "")) if users else ""


class FakeToneTTS:
    name = "fake_tone"

    def __init__(
        self, duration_ms: float = 600.0, sample_rate: int = 24000, frequency: float = 440.0, **_: Any
    ) -> None:
        self.duration_ms = float(duration_ms)
        self.sample_rate = int(sample_rate)
        self.frequency = float(frequency)
        self.sentences: list[str] = []

    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        self.sentences.append(text)
        yield PCMChunk(tone(self.duration_ms, self.sample_rate, self.frequency), self.sample_rate)


@functools.lru_cache(maxsize=32)
def tone(duration_ms: float, sample_rate: int, frequency: float = 440.0, amplitude: float = 0.3) -> bytes:
    """A sine tone as s16le mono PCM. Cached: the zero-latency TTS answers every turn with
    the same tone, and computing it anew ran on the server's event loop each time (~3.5 % of
    the loop's samples at P1's 200 devices), a cost no real provider puts there."""
    n = int(sample_rate * duration_ms / 1000)
    t = np.arange(n, dtype=np.float32) / sample_rate
    wave = amplitude * 32767 * np.sin(2 * math.pi * frequency * t)
    return wave.astype("<i2").tobytes()


class _Failing:
    name = "fail"

    def __init__(self, delay: float = 0.0, message: str = "scripted failure", **_: Any) -> None:
        self.delay = float(delay)
        self.message = message
        self.calls = 0

    async def _fail(self) -> None:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        raise ProviderError(self.message)


class FailingASR(_Failing):
    async def transcribe(self, pcm: bytes, sample_rate: int, language: str | None) -> str:
        await self._fail()
        return ""


class FailingLLM(_Failing):
    async def stream(self, messages: list[dict], **_: Any) -> AsyncIterator[LLMDelta]:
        await self._fail()
        yield LLMDelta()  # pragma: no cover - unreachable, makes this a generator


class FailingTTS(_Failing):
    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        await self._fail()
        yield PCMChunk(b"", 0)  # pragma: no cover


class _Hanging:
    name = "hang"

    def __init__(self, **_: Any) -> None:
        self.calls = 0

    async def _hang(self) -> None:
        self.calls += 1
        await asyncio.Event().wait()


class HangingASR(_Hanging):
    async def transcribe(self, pcm: bytes, sample_rate: int, language: str | None) -> str:
        await self._hang()
        return ""


class HangingLLM(_Hanging):
    async def stream(self, messages: list[dict], **_: Any) -> AsyncIterator[LLMDelta]:
        await self._hang()
        yield LLMDelta()  # pragma: no cover


class HangingTTS(_Hanging):
    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        await self._hang()
        yield PCMChunk(b"", 0)  # pragma: no cover


KINDS: dict[str, dict[str, str]] = {
    "asr": {"fake_echo": "FakeEchoASR", "fail": "FailingASR", "hang": "HangingASR"},
    "llm": {"fake_echo": "FakeEchoLLM", "fail": "FailingLLM", "hang": "HangingLLM"},
    "tts": {"fake_tone": "FakeToneTTS", "fail": "FailingTTS", "hang": "HangingTTS"},
}


def register(registry: dict[str, dict[str, str]] = REGISTRY) -> None:
    """Add the fake kinds to the provider registry (idempotent)."""
    for stage, kinds in KINDS.items():
        for kind, class_name in kinds.items():
            registry[stage].setdefault(kind, f"{_MODULE}.{class_name}")


register()
