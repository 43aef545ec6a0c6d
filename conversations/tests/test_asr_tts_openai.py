"""OpenAITTS and OpenAIASR against the fake cloud over real HTTP."""
from __future__ import annotations

import io
import time
import wave
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from conversations.providers.asr.openai_compat import OpenAIASR, pcm_to_wav, whisper_language
from conversations.providers.base import ASR, TTS, PCMChunk, ProviderError
from conversations.providers.registry import build
from conversations.providers.tts.openai_compat import OpenAITTS, split_aligned
from testing.fake_openai import FakeOpenAI, Reply


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(transcript="hello world") as server:
        yield server


@pytest.fixture
async def tts(fake: FakeOpenAI) -> AsyncIterator[OpenAITTS]:
    provider = OpenAITTS(fake.base_url, timeout=5)
    yield provider


@pytest.fixture
async def asr(fake: FakeOpenAI) -> AsyncIterator[OpenAIASR]:
    provider = OpenAIASR(fake.base_url, timeout=5)
    yield provider


async def _speak(tts: OpenAITTS, text: str = "Hello world") -> list[PCMChunk]:
    return [chunk async for chunk in tts.synthesize(text, voice="nova", language="en")]


async def test_both_are_built_from_the_registry_and_meet_the_contracts(fake: FakeOpenAI) -> None:
    tts = build("tts", "openai", base_url=fake.base_url, model="tts-1-hd", extra="ignored")
    asr = build("asr", "openai", base_url=fake.base_url, model="whisper-large", extra="ignored")
    assert isinstance(tts, TTS) and isinstance(asr, ASR)
    assert (tts.name, asr.name) == ("openai", "openai")


async def test_tts_streams_whole_samples_at_24khz(fake: FakeOpenAI, tts: OpenAITTS) -> None:
    fake.speech_chunk_bytes = 1001  # odd network chunks must not split samples
    chunks = await _speak(tts)
    assert len(chunks) > 1
    assert {c.sample_rate for c in chunks} == {24000}
    assert all(len(c.pcm) % 2 == 0 and c.pcm for c in chunks)
    samples = np.frombuffer(b"".join(c.pcm for c in chunks), dtype="<i2").astype(np.float64)
    assert len(samples) > 12000 and np.sqrt(np.mean(samples**2)) > 300  # real speech, not silence


async def test_tts_asks_for_pcm_with_the_voice_and_model(fake: FakeOpenAI, tts: OpenAITTS) -> None:
    await _speak(tts, "你好")
    [request] = fake.requests
    assert request.body == {"input": "你好", "model": "tts-1", "voice": "nova", "response_format": "pcm"}


async def test_tts_skips_empty_text_without_a_request(fake: FakeOpenAI, tts: OpenAITTS) -> None:
    assert await _speak(tts, "  ") == []
    assert fake.requests == []


@pytest.mark.parametrize(
    ("reply", "message"),
    [(Reply(status=500, error="tts down"), "500"), (Reply(drop_after=2), "TTS request failed")],
)
async def test_tts_failures_become_provider_errors(
    fake: FakeOpenAI, tts: OpenAITTS, reply: Reply, message: str
) -> None:
    fake.script_speech(reply)
    with pytest.raises(ProviderError, match=message):
        await _speak(tts)


async def test_tts_times_out_on_a_hanging_server(fake: FakeOpenAI) -> None:
    fake.script_speech(Reply(hang=True))
    tts = OpenAITTS(fake.base_url, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ProviderError):
        await _speak(tts)
    assert time.monotonic() - started < 2


async def test_tts_can_be_interrupted_midway(fake: FakeOpenAI, tts: OpenAITTS) -> None:
    fake.script_speech(Reply(chunk_delay=0.05))
    stream = tts.synthesize("This sentence is interrupted by the user.", voice="", language="en")
    await anext(stream)
    await stream.aclose()
    assert await _speak(tts, "Again.")


async def test_asr_sends_a_wav_and_returns_stripped_text(fake: FakeOpenAI, asr: OpenAIASR) -> None:
    fake.script_transcriptions(Reply(text="  今天天气怎么样？ \n"))
    pcm = np.zeros(16000, dtype="<i2").tobytes()
    assert await asr.transcribe(pcm, 16000, "zh-CN") == "今天天气怎么样？"
    [request] = fake.requests
    assert request.body == {"model": "whisper-1", "language": "zh"}
    with wave.open(io.BytesIO(request.file or b"")) as wav:
        shape = (wav.getframerate(), wav.getnchannels(), wav.getsampwidth(), wav.getnframes())
    assert shape == (16000, 1, 2, 16000)


async def test_asr_round_trips_speech_from_the_fake_tts(
    fake: FakeOpenAI, tts: OpenAITTS, asr: OpenAIASR
) -> None:
    pcm = b"".join(c.pcm for c in await _speak(tts, "hello world"))
    assert await asr.transcribe(pcm, 24000, None) == "hello world"
    sent = fake.requests[-1]
    assert "language" not in sent.body
    with wave.open(io.BytesIO(sent.file or b"")) as wav:
        assert wav.readframes(wav.getnframes()) == pcm


async def test_asr_returns_empty_text_for_no_audio(fake: FakeOpenAI, asr: OpenAIASR) -> None:
    assert await asr.transcribe(b"", 16000, "en") == ""
    assert fake.requests == []


@pytest.mark.parametrize("reply", [Reply(status=500), Reply(status=429, error="slow down")])
async def test_asr_failures_become_provider_errors(fake: FakeOpenAI, asr: OpenAIASR, reply: Reply) -> None:
    fake.script_transcriptions(reply)
    with pytest.raises(ProviderError, match=str(reply.status)):
        await asr.transcribe(b"\x00\x01" * 800, 16000, "en")


async def test_asr_times_out_on_a_hanging_server(fake: FakeOpenAI) -> None:
    fake.script_transcriptions(Reply(hang=True))
    asr = OpenAIASR(fake.base_url, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ProviderError):
        await asr.transcribe(b"\x00\x01" * 800, 16000, "en")
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    ("data", "aligned", "rest"),
    [
        (b"", b"", b""),
        (b"\x01", b"", b"\x01"),
        (b"\x01\x02\x03", b"\x01\x02", b"\x03"),
        (b"\x01\x02", b"\x01\x02", b""),
    ],
)
def test_split_aligned_keeps_whole_samples(data: bytes, aligned: bytes, rest: bytes) -> None:
    assert split_aligned(data) == (aligned, rest)


@pytest.mark.parametrize(
    ("language", "code"),
    [(None, None), ("", None), ("zh-CN", "zh"), ("en_US", "en"), ("ZH", "zh"), ("ja", "ja")],
)
def test_whisper_language_takes_the_iso_639_1_part(language: str | None, code: str | None) -> None:
    assert whisper_language(language) == code


def test_pcm_to_wav_drops_a_trailing_half_sample() -> None:
    with wave.open(io.BytesIO(pcm_to_wav(b"\x01\x02\x03", 8000))) as wav:
        assert (wav.getframerate(), wav.getnframes()) == (8000, 1)
