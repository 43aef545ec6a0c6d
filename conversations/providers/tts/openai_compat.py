"""Speech synthesis through an OpenAI-compatible /audio/speech endpoint, streamed as PCM."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from conversations.providers.base import PCMChunk, ProviderError
from conversations.providers.llm.openai_compat import CLIENT_ERRORS, Endpoint, provider_error

logger = logging.getLogger(__name__)

SAMPLE_RATE = 24000  # response_format "pcm" is 24 kHz s16le mono
_READ_BYTES = 4800  # 100 ms: small enough to start playback early, large enough to be cheap


def split_aligned(data: bytes) -> tuple[bytes, bytes]:
    """(whole 16-bit samples, leftover odd byte): network chunks ignore sample boundaries."""
    cut = len(data) - len(data) % 2
    return data[:cut], data[cut:]


class OpenAITTS:
    """Streams speech while the server is still producing it, so playback starts early."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: str = "not-needed",
        model: str = "tts-1",
        timeout: float = 10.0,
        voice: str = "alloy",
        max_retries: int = 0,
        **_: Any,
    ) -> None:
        self._model = model
        self._default_voice = voice
        self._secret = api_key
        self._endpoint = Endpoint(base_url, api_key, timeout, max_retries)

    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        """Yield 24 kHz PCM chunks; `language` is unused (the API infers it from the text)."""
        if not text.strip():
            return
        produced = False
        try:
            async with self._endpoint.client().audio.speech.with_streaming_response.create(
                model=self._model, voice=voice or self._default_voice, input=text, response_format="pcm"
            ) as response:
                carry = b""
                async for data in response.iter_bytes(_READ_BYTES):
                    pcm, carry = split_aligned(carry + data)
                    if pcm:
                        produced = True
                        yield PCMChunk(pcm, SAMPLE_RATE)
        except CLIENT_ERRORS as exc:
            logger.warning("tts request failed", extra={"provider": self.name, "error": type(exc).__name__})
            raise provider_error("TTS request", exc, self._secret) from exc
        if not produced:
            raise ProviderError("TTS returned no audio")
