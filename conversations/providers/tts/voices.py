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

# Piper voice models (rhasspy piper-voices names) for the Piper provider to pick with
# `voice_for(PIPER_VOICES, language)`; Piper has no Japanese or Korean voice, so those fall
# back to English there (or to the next provider in the persona's chain).
PIPER_VOICES: dict[str, str] = {
    "en": "en_US-lessac-medium",
    "zh": "zh_CN-huayan-medium",
    "de": "de_DE-thorsten-medium",
    "fr": "fr_FR-siwis-medium",
    "ru": "ru_RU-irina-medium",
    "pt": "pt_BR-faber-medium",
    "es": "es_ES-davefx-medium",
    "it": "it_IT-paola-medium",
}


def base_language(language: str | None) -> str:
    """"zh-CN", "zh_Hans", "ZH" -> "zh"."""
    return (language or "").replace("_", "-").split("-")[0].strip().lower()


def voice_for(table: dict[str, str], language: str | None) -> str:
    """The table's voice for `language`, or its English voice."""
    return table.get(base_language(language)) or table[FALLBACK_LANGUAGE]
