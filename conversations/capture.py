"""What the realtime pipeline hands over after a turn for review: its audio and the providers
it tried. Plain data, no Django, no I/O: the pipeline only appends to lists here (one append
per 60 ms packet), and the history writer turns the result into files and JSON after the turn
(conversations/recording.py, conversations/services.py).

Provider attempts, as stored in `Turn.provider_attempts` (one list per stage, in the order the
providers were tried; TTS and LLM may have several entries per kind, one per call):

    {"asr": [{"kind": "faster_whisper", "ok": true, "ms": 310.0}],
     "tts": [{"kind": "edge", "ok": false, "error": "ClientConnectorDNSError", "ms": 12.0},
             {"kind": "espeak", "ok": true, "ms": 15.0}]}

`ms` is how long the attempt took; for a failure, the time lost before the next provider was
tried. `error` is the exception's class name (never its message: messages can carry URLs and
keys). A stage without entries is left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STAGES = ("asr", "llm", "tts")
MAX_ATTEMPTS_PER_STAGE = 50  # one turn's row stays small whatever a broken provider does
MAX_ERROR_CHARS = 120
UPLINK_RATE = 16000  # the firmware's uplink Opus rate


@dataclass
class AudioTrack:
    """Opus packets of one direction of a turn, exactly as heard or sent (not re-encoded).

    `packets` is appended to by the pipeline, one packet per frame; `sample_rate` is the
    rate the packets were encoded at (16 kHz uplink, the hello's rate downlink).
    """

    sample_rate: int
    packets: list[bytes] = field(default_factory=list)

    def add(self, packet: bytes) -> None:
        self.packets.append(packet)

    def __bool__(self) -> bool:
        return bool(self.packets)


@dataclass
class TurnAudio:
    """Both directions of one turn: the user's utterance (with the pre-roll the server kept)
    and every reply packet sent to the device, up to an interruption."""

    uplink: AudioTrack = field(default_factory=lambda: AudioTrack(UPLINK_RATE))
    downlink: AudioTrack = field(default_factory=lambda: AudioTrack(24000))

    @classmethod
    def for_rates(cls, *, uplink_rate: int = UPLINK_RATE, downlink_rate: int = 24000) -> TurnAudio:
        return cls(uplink=AudioTrack(uplink_rate), downlink=AudioTrack(downlink_rate))


@dataclass(frozen=True)
class ProviderAttempt:
    kind: str
    ok: bool
    ms: float
    error: str = ""

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "ok": self.ok, "ms": round(self.ms, 1)}
        if not self.ok:
            data["error"] = self.error[:MAX_ERROR_CHARS] or "error"
        return data


@dataclass
class AttemptLog:
    """Collects a turn's provider attempts; `as_json()` is what `Turn.provider_attempts` holds.

    Usage in a fallback chain: `log.failed("tts", "edge", exc, ms)` for every provider that
    raised, `log.served("tts", "espeak", ms)` for the one that answered.
    """

    stages: dict[str, list[ProviderAttempt]] = field(default_factory=dict)

    def add(self, stage: str, attempt: ProviderAttempt) -> None:
        attempts = self.stages.setdefault(stage, [])
        if len(attempts) < MAX_ATTEMPTS_PER_STAGE:
            attempts.append(attempt)

    def served(self, stage: str, kind: str, ms: float) -> None:
        self.add(stage, ProviderAttempt(kind=kind, ok=True, ms=ms))

    def failed(self, stage: str, kind: str, error: BaseException | str, ms: float) -> None:
        name = error if isinstance(error, str) else type(error).__name__
        self.add(stage, ProviderAttempt(kind=kind, ok=False, ms=ms, error=name))

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        ordered = [*STAGES, *sorted(set(self.stages) - set(STAGES))]
        return {stage: [a.as_json() for a in self.stages[stage]] for stage in ordered if self.stages.get(stage)}


def attempts_from_json(data: object) -> dict[str, list[ProviderAttempt]]:
    """Read `Turn.provider_attempts` back, skipping anything malformed (it is only evidence)."""
    if not isinstance(data, dict):
        return {}
    result: dict[str, list[ProviderAttempt]] = {}
    for stage, entries in data.items():
        if not isinstance(stage, str) or not isinstance(entries, list):
            continue
        attempts = [_attempt(entry) for entry in entries[:MAX_ATTEMPTS_PER_STAGE]]
        kept = [a for a in attempts if a is not None]
        if kept:
            result[stage] = kept
    return result


def _attempt(entry: object) -> ProviderAttempt | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str):
        return None
    ms = entry.get("ms", 0)
    ms = float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else 0.0
    error = entry.get("error", "")
    return ProviderAttempt(kind=entry["kind"][:64], ok=entry.get("ok") is True, ms=max(ms, 0.0),
                           error=str(error)[:MAX_ERROR_CHARS] if error else "")
