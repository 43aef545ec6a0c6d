"""The record of one finished (or failed, or interrupted) turn, stored off the reply path."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conversations.capture import TurnAudio


@dataclass
class TurnRecord:
    """One exchange, as conversation review shows it (a `Turn` row).

    `index` numbers the turns of one conversation (idempotent: a turn written twice is
    updated). `timings` are milliseconds: for a voice turn relative to the end of speech
    (`speech_end` is 0; asr_done, llm_first_token, tts_first_audio, first_frame_sent,
    last_frame_sent), for a gateway turn the LLM time and the total (llm_ms, total_ms).
    `session_id` names the conversation when a connection can switch between several (the
    gateway); a device connection has one, known to its hooks.

    `provider_attempts` is `AttemptLog.as_json()` (conversations/capture.py): every provider
    tried per stage. `audio` holds the turn's Opus packets (device turns, when recorded);
    the history writer hands them to the audio writer once the row is stored.
    """

    index: int
    user_text: str = ""
    reply_text: str = ""
    emotion: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    providers: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    interrupted: bool = False
    error: str = ""
    session_id: str = ""
    provider_attempts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    audio: TurnAudio | None = field(default=None, repr=False)
