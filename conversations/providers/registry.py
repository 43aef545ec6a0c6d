"""Provider registry: kind -> dotted path, imported lazily on first use.

Adding a provider is one line here plus one module. Persona admin choices are derived from
this table, so the admin can never offer a kind the code does not know.

`build` makes a provider per call (a session's ASR, LLM and TTS chains); `shared` makes one
per process and options, for providers whose point is to be shared: the VAD batches the
windows of every session into the same model runs.
"""
from __future__ import annotations

import threading
from importlib import import_module
from typing import Any

REGISTRY: dict[str, dict[str, str]] = {
    "vad": {
        "silero": "conversations.providers.vad.silero.SileroVAD",
    },
    "turn": {
        "smart_turn": "conversations.providers.turn.smart_turn.SmartTurn",
    },
    "aec": {
        "webrtc": "conversations.providers.aec.webrtc.WebRtcAEC",
    },
    "asr": {
        "faster_whisper": "conversations.providers.asr.faster_whisper.FasterWhisperASR",
        "openai": "conversations.providers.asr.openai_compat.OpenAIASR",
    },
    "llm": {
        "openai": "conversations.providers.llm.openai_compat.OpenAILLM",
    },
    # Camera questions (devices/vision.py asks the model itself; the class serves the admin's Test).
    "vision": {
        "openai": "conversations.providers.llm.openai_compat.OpenAILLM",
    },
    "tts": {
        "edge": "conversations.providers.tts.edge.EdgeTTS",
        "openai": "conversations.providers.tts.openai_compat.OpenAITTS",
        "piper": "conversations.providers.tts.piper.PiperTTS",
        "espeak": "conversations.providers.tts.espeak.EspeakTTS",
    },
}

_classes: dict[tuple[str, str], type] = {}
_shared: dict[tuple[str, str, str], Any] = {}
_shared_lock = threading.Lock()


def choices(stage: str) -> list[tuple[str, str]]:
    return [(kind, kind) for kind in REGISTRY[stage]]


def provider_class(stage: str, kind: str) -> type:
    key = (stage, kind)
    if key not in _classes:
        try:
            path = REGISTRY[stage][kind]
        except KeyError:
            raise KeyError(f"unknown {stage} provider {kind!r}") from None
        module_name, _, class_name = path.rpartition(".")
        _classes[key] = getattr(import_module(module_name), class_name)
    return _classes[key]


def build(stage: str, kind: str, **config: Any) -> Any:
    """Instantiate a provider; `config` holds its keyword options (URLs, keys, model)."""
    return provider_class(stage, kind)(**config)


def shared(stage: str, kind: str, **config: Any) -> Any:
    """The process's one provider of this kind and options (built on first use)."""
    key = (stage, kind, repr(sorted(config.items())))
    with _shared_lock:
        if key not in _shared:
            _shared[key] = build(stage, kind, **config)
        return _shared[key]
