"""Live tests of provider configurations, for the admin's "Test" buttons.

One probe builds one configuration's provider and asks it one small thing: an LLM a short
question (its reply and time to first token), a TTS a sentence (the audio, as WAV), an ASR the
bundled sample (conversations/providers/samples/). Each probe is bounded by the
configuration's timeout, provider set-up included, so a dead endpoint never holds the admin
longer than that. Errors become one readable line (timeout, refused key, DNS failure,
connection refused, HTTP status), with the key redacted. Plain async Python: the admin view
loads the ProviderSpec and awaits `probe`.
"""
from __future__ import annotations

import asyncio
import io
import socket
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.utils.translation import gettext as _

from conversations.pipeline.config import ProviderSpec
from conversations.pipeline.fallback import DEFAULT_TIMEOUTS
from conversations.providers import registry
from conversations.providers.tts.voices import base_language
from devices.protocol.audio import resample

SAMPLE_PATH = Path(__file__).parent / "providers" / "samples" / "asr-sample-en.wav"
SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog."
LLM_QUESTION = "Say hello and tell me your name in one short sentence."
SENTENCES = {
    "en": "Hello! This is how I sound.",
    "zh": "你好！这就是我的声音。",
}
MAX_TEXT_CHARS = 500
MAX_AUDIO_SECONDS = 30
MAX_PROBE_TEXT = 300  # what a caller may ask a TTS to say


@dataclass
class ProbeResult:
    stage: str
    name: str
    kind: str
    ok: bool = False
    ms: float = 0.0
    text: str = ""  # the LLM's reply, the ASR's transcript
    first_token_ms: float | None = None
    expected: str = ""  # the ASR sample's sentence
    error: str = ""
    audio_wav: bytes = field(default=b"", repr=False)

    def as_json(self) -> dict[str, Any]:
        data = {"stage": self.stage, "name": self.name, "kind": self.kind, "ok": self.ok, "ms": round(self.ms),
                "text": self.text, "error": self.error}
        if self.first_token_ms is not None:
            data["first_token_ms"] = round(self.first_token_ms)
        if self.expected:
            data["expected"] = self.expected
        return data


def probe_timeout(stage: str, spec: ProviderSpec) -> float:
    return float(spec.kwargs.get("timeout") or DEFAULT_TIMEOUTS.get(stage, 15.0))


def tts_sentence(language: str) -> str:
    return SENTENCES.get(base_language(language), SENTENCES["en"])


async def probe(
    stage: str, spec: ProviderSpec, *, language: str = "en", voice: str = "", model: str = "", text: str = "",
) -> ProbeResult:
    """Test one configuration; never raises, never takes longer than its timeout."""
    result = ProbeResult(stage=stage, name=spec.name, kind=spec.kind)
    timeout = probe_timeout(stage, spec)
    started = time.perf_counter()
    provider: Any = None
    try:
        async with asyncio.timeout(timeout):
            # Building may import an SDK or load a model: off the event loop, inside the bound.
            provider = await asyncio.to_thread(registry.build, stage, spec.kind, **spec.kwargs)
            if stage in ("llm", "vision"):
                await _llm(provider, result, spec.model or model, started)
            elif stage == "tts":
                await _tts(provider, result, text[:MAX_PROBE_TEXT] or tts_sentence(language), voice or spec.voice,
                           language)
            elif stage == "asr":
                await _asr(provider, result)
            else:
                raise ValueError(f"no probe for stage {stage!r}")
        result.ok = True
    except Exception as exc:  # every failure is the probe's answer
        result.error = readable_error(exc, timeout, str(spec.kwargs.get("api_key") or ""))
    finally:
        result.ms = (time.perf_counter() - started) * 1000
        close = getattr(provider, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:  # noqa: BLE001 - closing a client we are done with
                pass
    return result


async def _llm(provider: Any, result: ProbeResult, model: str, started: float) -> None:
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
                {"role": "user", "content": LLM_QUESTION}]
    parts: list[str] = []
    stream = provider.stream(messages, tools=None, model=model, temperature=0.2, max_tokens=60)
    try:
        async for delta in stream:
            if delta.text:
                if result.first_token_ms is None:
                    result.first_token_ms = (time.perf_counter() - started) * 1000
                parts.append(delta.text)
    finally:
        await stream.aclose()
    result.text = "".join(parts).strip()[:MAX_TEXT_CHARS]


async def _tts(provider: Any, result: ProbeResult, sentence: str, voice: str, language: str) -> None:
    rate = 0
    pcm = bytearray()
    async for chunk in provider.synthesize(sentence, voice=voice, language=language):
        rate = rate or chunk.sample_rate
        data = chunk.pcm if chunk.sample_rate == rate else resample(chunk.pcm, chunk.sample_rate, rate)
        pcm += data
        if len(pcm) > rate * 2 * MAX_AUDIO_SECONDS:
            break
    if not pcm:
        raise RuntimeError(_("The engine returned no audio."))
    result.text = sentence
    result.audio_wav = wav_bytes(bytes(pcm), rate)


async def _asr(provider: Any, result: ProbeResult) -> None:
    pcm, rate = read_sample()
    result.expected = SAMPLE_TEXT
    result.text = (await provider.transcribe(pcm, rate, "en") or "").strip()[:MAX_TEXT_CHARS]


def read_sample() -> tuple[bytes, int]:
    with wave.open(str(SAMPLE_PATH), "rb") as sample:
        return sample.readframes(sample.getnframes()), sample.getframerate()


def wav_bytes(pcm: bytes, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm[: len(pcm) - len(pcm) % 2])
    return buffer.getvalue()


# -- readable errors -----------------------------------------------------------------------------

_DNS_WORDS = ("name or service not known", "nodename nor servname", "temporary failure in name resolution",
              "getaddrinfo failed", "no address associated", "cannot connect to host")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def readable_error(exc: BaseException, timeout: float, secret: str = "") -> str:
    """One line an operator can act on; never the key."""
    chain = _chain(exc)
    text = " ".join(str(e) for e in chain).lower()
    if isinstance(exc, TimeoutError) or any(isinstance(e, TimeoutError) for e in chain[:1]):
        message = _("No answer within %(seconds)s s (the configuration's timeout).") % {"seconds": f"{timeout:g}"}
    elif status := next((getattr(e, "status_code", None) for e in chain if getattr(e, "status_code", None)), None):
        if status in (401, 403):
            message = _("The endpoint refused the API key (HTTP %(status)s).") % {"status": status}
        else:
            message = _("The endpoint answered HTTP %(status)s: %(detail)s") % {"status": status,
                                                                               "detail": _detail(exc)}
    elif any(isinstance(e, socket.gaierror) for e in chain) or any(word in text for word in _DNS_WORDS[:5]):
        message = _("The host name could not be resolved (DNS failure).")
    elif any(isinstance(e, ConnectionRefusedError) for e in chain) or "connection refused" in text:
        message = _("Connection refused: nothing answers at that address and port.")
    elif isinstance(exc, (TypeError, KeyError)):
        message = _("The configuration is incomplete for this kind: %(detail)s") % {"detail": _detail(exc)}
    else:
        message = _detail(exc)
    if len(secret) >= 4:
        message = message.replace(secret, "***")
    return message[:400]


def _detail(exc: BaseException) -> str:
    return str(exc).strip()[:300] or type(exc).__name__
