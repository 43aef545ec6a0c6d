"""A voice session and its engine with a configurable SessionConfig, driven like a device:
the real session and engine, the zero-latency fake providers, a recording transport.
Shared by the capture and bounded-wait tests (virtual time)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import testing.fake_providers  # noqa: F401 - registers the fake provider kinds
from conversations.pipeline.config import DeviceInfo, PersonaConfig, SessionConfig
from conversations.pipeline.engine import VoiceEngine
from conversations.pipeline.listen import SpeechStopped, Utterance
from conversations.pipeline.session import VoiceSession
from conversations.tests.fakes import (
    PLAIN_HELLO,
    RecordingHooks,
    RecordingTransport,
    until,
)
from conversations.tests.test_engine import PROVIDERS, make_persona
from testing.speech import opus_packets, silence, speak

MakeRig = Callable[..., Awaitable["CaptureRig"]]


class CaptureRig:
    """A session + engine with a configurable SessionConfig, driven like a device."""

    def __init__(self, persona: PersonaConfig, providers: dict[str, dict[str, Any]], **config: Any) -> None:
        self.config = SessionConfig(
            session_id="7f1c2d3e-0000-4000-8000-0000000000c1",
            device=DeviceInfo(id=1, mac="aa:bb:cc:dd:ee:01", name="desk"),
            persona=persona, providers=providers, llm_model="fake", **config,
        )
        self.transport = RecordingTransport()
        self.hooks = RecordingHooks()
        self.engines: list[VoiceEngine] = []
        self.session = VoiceSession(self.transport, self.config, self.hooks, self._factory)
        self.fed: list[bytes] = []
        self.utterances: list[Utterance] = []

    def _factory(self, ctx: Any) -> VoiceEngine:
        engine = VoiceEngine(ctx)
        self.engines.append(engine)
        deliver = engine.hearing._on_event

        def observe(event: Any) -> None:  # the utterances the engine is handed, for comparison
            if isinstance(event, SpeechStopped):
                self.utterances.append(event.utterance)
            deliver(event)

        engine.hearing._on_event = observe
        return engine

    @property
    def engine(self) -> VoiceEngine:
        return self.engines[0]

    async def say_words(self, text: str, trailing_ms: int = 900) -> list[bytes]:
        packets = opus_packets(silence(16000, 300) + speak(text) + silence(16000, trailing_ms))
        for packet in packets:
            self.fed.append(packet)
            await self.session.feed_bytes(packet)
            await asyncio.sleep(0.001)
        return packets

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> None:
        await until(predicate, timeout, what=lambda: f"wire so far: {self.transport.kinds()}")


@asynccontextmanager
async def capture_rigs() -> AsyncIterator[MakeRig]:
    """`make(persona=None, providers=None, **session_config)` → a connected rig; all closed at exit."""
    rigs: list[CaptureRig] = []

    async def make(persona: PersonaConfig | None = None, providers: dict[str, dict[str, Any]] | None = None,
                   **config: Any) -> CaptureRig:
        r = CaptureRig(persona or make_persona(), {**PROVIDERS, **(providers or {})}, **config)
        rigs.append(r)
        await r.session.start()
        await r.session.feed_text(PLAIN_HELLO)
        return r

    yield make
    for r in rigs:
        await r.session.aclose()
