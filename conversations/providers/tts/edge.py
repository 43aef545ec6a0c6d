"""Microsoft Edge read-aloud TTS (edge-tts): free, good quality, needs the network.

Each sentence's MP3 is collected whole and then decoded in one go. Sentences are short
(1-5 s of audio, 6-30 KB of MP3) and the service sends them in a few hundred ms, so
incremental MP3 decoding would save little latency for a lot of frame-boundary bookkeeping;
whole-buffer decoding is also what PyAV does most reliably.
"""
from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

from conversations.providers.base import PCMChunk, ProviderError
from conversations.providers.tts.voices import EDGE_VOICES, voice_for
from devices.protocol.audio import decode_audio_file
from devices.protocol.opus import AudioError

logger = logging.getLogger(__name__)

def pick_voice(voice: str, language: str) -> str:
    """A persona's Edge voice ("xx-YY-NameNeural") wins; anything else (an espeak or OpenAI
    voice left over from another provider) falls back to the language's voice (voices.EDGE_VOICES)."""
    if voice and voice.endswith("Neural") and voice.count("-") >= 2:
        return voice
    return voice_for(EDGE_VOICES, language)


def _network_errors() -> tuple[type[BaseException], ...]:
    import aiohttp  # noqa: PLC0415 - comes with edge-tts; imported when edge is used
    import edge_tts.exceptions  # noqa: PLC0415

    # aiohttp's connection errors subclass OSError; ValueError covers a rejected voice name.
    return (
        aiohttp.ClientError,
        OSError,
        TimeoutError,
        ValueError,
        edge_tts.exceptions.EdgeTTSException,
    )


class EdgeTTS:
    """TTS provider (`conversations.providers.base.TTS`) for the Edge read-aloud service."""

    name = "edge"

    def __init__(
        self, connect_timeout: float = 3.0, timeout: float = 10.0, proxy: str | None = None, **_: Any
    ) -> None:
        # edge-tts defaults to a 10 s connect timeout; fallback to espeak must be quicker.
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.proxy = proxy or None  # an HTTP proxy for deployments that need one

    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        if not text.strip():
            return
        mp3 = await self._fetch_mp3(text, pick_voice(voice, language))
        loop = asyncio.get_running_loop()
        try:
            # MP3 decoding is CPU work: keep it off the event loop.
            pcm, rate = await loop.run_in_executor(None, decode_audio_file, mp3)
        except AudioError as exc:
            raise ProviderError(f"edge-tts returned undecodable audio: {exc}") from exc
        if pcm:
            yield PCMChunk(pcm, rate)

    async def _fetch_mp3(self, text: str, voice: str) -> bytes:
        import edge_tts  # noqa: PLC0415 - 0.25 s import, only for personas that use edge

        errors = _network_errors()
        audio = bytearray()
        try:
            async with asyncio.timeout(self.timeout):
                # edge-tts insists on whole seconds for its own timeouts.
                communicate = edge_tts.Communicate(
                    text,
                    voice,
                    proxy=self.proxy,
                    connect_timeout=max(1, math.ceil(self.connect_timeout)),
                    receive_timeout=max(1, math.ceil(self.timeout)),
                )
                async for chunk in communicate.stream():
                    if chunk.get("type") == "audio":
                        audio.extend(chunk.get("data", b""))
        except errors as exc:
            logger.warning("edge tts request failed", extra={"voice": voice, "error": repr(exc)})
            raise ProviderError(f"edge-tts failed: {type(exc).__name__}: {exc}") from exc
        if not audio:
            raise ProviderError("edge-tts returned no audio")
        return bytes(audio)
