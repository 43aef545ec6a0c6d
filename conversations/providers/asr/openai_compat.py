"""Speech recognition through an OpenAI-compatible /audio/transcriptions endpoint."""
from __future__ import annotations

import io
import logging
import wave
from typing import Any

from conversations.providers.base import ProviderError
from conversations.providers.llm.openai_compat import CLIENT_ERRORS, Endpoint, provider_error

logger = logging.getLogger(__name__)


def pcm_to_wav(pcm: bytes, sample_rate: int) -> bytes:
    """Wrap s16le mono PCM in a WAV container, in memory (the API wants a file)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm[: len(pcm) - len(pcm) % 2])
    return buffer.getvalue()


def whisper_language(language: str | None) -> str | None:
    """ "zh-CN" -> "zh": the API takes ISO-639-1 codes and rejects locale tags."""
    if not language:
        return None
    return language.replace("_", "-").split("-")[0].lower() or None


class OpenAIASR:
    """Whole-utterance transcription (Whisper API, or any server speaking its format)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: str = "not-needed",
        model: str = "whisper-1",
        timeout: float = 15.0,
        max_retries: int = 0,
        **_: Any,
    ) -> None:
        self._model = model
        self._secret = api_key
        self._endpoint = Endpoint(base_url, api_key, timeout, max_retries)

    async def transcribe(self, pcm: bytes, sample_rate: int, language: str | None) -> str:
        if len(pcm) < 2:
            return ""
        wav = pcm_to_wav(pcm, sample_rate)
        params: dict[str, Any] = {"model": self._model, "file": ("audio.wav", wav, "audio/wav")}
        if code := whisper_language(language):
            params["language"] = code
        try:
            result = await self._endpoint.client().audio.transcriptions.create(**params)
        except CLIENT_ERRORS as exc:
            logger.warning("asr request failed", extra={"provider": self.name, "error": type(exc).__name__})
            raise provider_error("ASR request", exc, self._secret) from exc
        text = getattr(result, "text", result)
        if not isinstance(text, str):
            raise ProviderError("ASR reply has no text")
        return text.strip()
