"""Kind-specific options of a provider configuration, one pydantic model per (stage, kind).

A `ProviderConfig` (conversations/models.py) has common fields (base URL, API key, model,
voice, timeout) and an `options` JSON object for what only one kind understands. The object
is checked here when the config is saved, so a typo ("thread": 2) is a form error and not a
TypeError in the middle of a device's turn. Unknown keys are rejected. A kind without a model
here takes no options. Plain pydantic, no Django: the admin form turns `OptionsError` into a
field error.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIOptions(NoOptions):
    """Any OpenAI-compatible endpoint (chat, speech, transcriptions)."""

    max_retries: int = Field(0, ge=0, le=3)


class FasterWhisperOptions(NoOptions):
    compute_type: Literal["int8", "int8_float32", "float32", "float16"] = "int8"
    threads: int = Field(2, ge=1, le=16)
    max_concurrency: int = Field(1, ge=1, le=8)
    window_s: int = Field(30, ge=8, le=30)  # < 30: the short window alone, faster, less accurate
    fast_pass: bool = True  # a 12 s window first, kept when the decoder is sure (faster_whisper.py)


class EdgeOptions(NoOptions):
    connect_timeout: float = Field(3.0, gt=0, le=60)
    proxy: str | None = Field(None, max_length=300, pattern=r"^https?://\S+$")


class EspeakOptions(NoOptions):
    binary: str = Field("espeak-ng", min_length=1, max_length=300)
    speed: int = Field(175, ge=80, le=450)


class PiperOptions(NoOptions):
    voices_dir: str = Field("", max_length=500)  # empty: XIAOZHI_PIPER_VOICES_DIR
    threads: int = Field(1, ge=1, le=8)  # ONNX threads per synthesis


OPTIONS: dict[tuple[str, str], type[NoOptions]] = {
    ("asr", "faster_whisper"): FasterWhisperOptions,
    ("asr", "openai"): OpenAIOptions,
    ("llm", "openai"): OpenAIOptions,
    ("tts", "openai"): OpenAIOptions,
    ("tts", "edge"): EdgeOptions,
    ("tts", "espeak"): EspeakOptions,
    ("tts", "piper"): PiperOptions,
    ("vision", "openai"): OpenAIOptions,
}


class OptionsError(ValueError):
    """Options that do not fit the kind; `problems` are readable lines, one per field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def options_model(stage: str, kind: str) -> type[NoOptions]:
    return OPTIONS.get((stage, kind), NoOptions)


def validate_options(stage: str, kind: str, data: object) -> dict[str, Any]:
    """The options as given (only keys that were set), or OptionsError."""
    if not isinstance(data, dict):
        raise OptionsError(["options must be a JSON object"])
    try:
        parsed = options_model(stage, kind).model_validate(data)
    except ValidationError as exc:
        raise OptionsError([_problem(error) for error in exc.errors()]) from None
    return parsed.model_dump(exclude_unset=True)


def option_names(stage: str, kind: str) -> list[str]:
    return list(options_model(stage, kind).model_fields)


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error.get("loc", ())) or "options"
    if error.get("type") == "extra_forbidden":
        return f"{where}: unknown option"
    return f"{where}: {error.get('msg', 'invalid')}"
