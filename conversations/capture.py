"""What the realtime pipeline hands over after a turn for review: its audio and the providers
it tried. Plain data, no Django, no I/O: the pipeline only appends to lists here (one append
per 60 ms packet), and the history writer turns the result into files and JSON after the turn
(conversations/recording.py, conversations/services.py).

Provider attempts, as stored in `Turn.provider_attempts` (one list per stage, in the order the
providers were tried; TTS and LLM may have several entries per kind, one per call):

    {"asr": [{"kind": "faster_whisper", "ok": true, "ms": 310.0}],
     "llm": [{"kind": "openai", "config": "DeepSeek", "ok": false, "error": "ProviderError", "ms": 40.0},
             {"kind": "openai", "config": "Local Ollama", "ok": true, "ms": 420.0}],
     "tts": [{"kind": "edge", "ok": false, "error": "ClientConnectorDNSError", "ms": 12.0},
             {"kind": "espeak", "ok": true, "ms": 15.0}]}

`config` names the provider configuration (conversations.ProviderConfig) that was tried, so
two endpoints of the same kind can be told apart; it is left out when the chain was built
from bare kinds (tests, benchmarks).

`ms` is how long the attempt took to answer (ASR: the transcription; LLM: its first token;
TTS: a sentence's first audio); for a failure, the time lost before the next provider was
tried (a stream that broke after its first item: the whole attempt). `error` is the
exception's class name (never its message: messages can carry URLs and keys). A stage without
entries is left out.

TTS runs once per sentence, so its successes are collapsed: a success of the provider that
also served the stage's previous attempt adds nothing (a reply of twenty sentences spoken by
one engine is one entry); every failure, and the first success after a change of provider,
is kept. LLM attempts are kept one per call (one per tool-loop round).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

STAGES = ("asr", "llm", "tts")
COLLAPSED_STAGES = frozenset({"tts"})  # one call per sentence: repeated successes add nothing
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


class PacketTrail:
    """The uplink packets behind a PCM buffer, so an utterance's packets can be cut out with
    the same bounds as its PCM (endpointing.py's `Ear`: pre-roll included).

    Positions are byte offsets in the decoded PCM stream. The hearing job calls `add` for
    every packet it decodes; trimming and cutting happen once per batch and once per
    utterance. Packets and their PCM sizes are kept side by side, not as a (packet, size)
    tuple per packet: a tuple is an object the garbage collector tracks until its next young
    collection, and the trails of a few hundred talking devices made ~3,000 of them a second
    per worker, three quarters of what set off every young collection (5-17 ms pauses every
    2-3 s) and, through them, the older generation's (30-60 ms; docs/performance.md, session
    34). Bytes and small ints are never tracked.
    """

    def __init__(self) -> None:
        self.packets: deque[bytes] = deque()
        self.sizes: deque[int] = deque()  # decoded PCM bytes of each packet
        self.start = 0  # stream offset of the first packet's PCM

    def add(self, packet: bytes, size: int) -> None:
        self.packets.append(packet)
        self.sizes.append(size)

    def clear(self) -> None:
        self.packets.clear()
        self.sizes.clear()
        self.start = 0

    def drop_before(self, offset: int) -> None:
        """Forget packets whose PCM ends at or before `offset` (the buffer dropped it)."""
        sizes = self.sizes
        while sizes and self.start + sizes[0] <= offset:
            self.start += sizes.popleft()
            self.packets.popleft()

    def between(self, begin: int, end: int) -> list[bytes]:
        """The packets whose PCM overlaps [begin, end): they cover the slice, a few ms more."""
        packets: list[bytes] = []
        position = self.start
        for packet, size in zip(self.packets, self.sizes, strict=True):
            if position >= end:
                break
            if position + size > begin:
                packets.append(packet)
            position += size
        return packets

    def take_all(self) -> list[bytes]:
        packets = list(self.packets)
        self.clear()
        return packets


@dataclass(frozen=True)
class ProviderAttempt:
    kind: str
    ok: bool
    ms: float
    error: str = ""
    config: str = ""  # the ProviderConfig's name, when the chain was built from configs

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        if self.config:
            data["config"] = self.config
        data.update({"ok": self.ok, "ms": round(self.ms, 1)})
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

    def add(self, stage: str, attempt: ProviderAttempt) -> ProviderAttempt | None:
        attempts = self.stages.setdefault(stage, [])
        if len(attempts) >= MAX_ATTEMPTS_PER_STAGE:
            return None
        attempts.append(attempt)
        return attempt

    def served(self, stage: str, kind: str, ms: float, config: str = "") -> ProviderAttempt | None:
        """Record a success; returns its entry (None when collapsed into the previous one)."""
        previous = self.stages.get(stage)
        if (stage in COLLAPSED_STAGES and previous and previous[-1].ok and previous[-1].kind == kind
                and previous[-1].config == config):
            return None
        return self.add(stage, ProviderAttempt(kind=kind, ok=True, ms=ms, config=config))

    def failed(self, stage: str, kind: str, error: BaseException | str, ms: float, config: str = "") -> None:
        self.add(stage, ProviderAttempt(kind=kind, ok=False, ms=ms, error=_error_name(error), config=config))

    def broke(self, stage: str, entry: ProviderAttempt | None, kind: str, error: BaseException | str,
              ms: float, config: str = "") -> None:
        """A stream that answered (`entry`, from `served`) and then failed: that success
        becomes a failure, so a model that stalled after its first token reads as failed and
        not as "served, then failed". A collapsed success (None) gets a failure of its own."""
        attempts = self.stages.get(stage, [])
        failure = ProviderAttempt(kind=kind, ok=False, ms=ms, error=_error_name(error), config=config)
        for position in range(len(attempts) - 1, -1, -1):
            if attempts[position] is entry:
                attempts[position] = failure
                return
        self.add(stage, failure)

    def extend(self, other: AttemptLog) -> None:
        """Add another log's attempts after this one's (a speculative ASR the turn used)."""
        for stage, attempts in other.stages.items():
            for attempt in attempts:
                self.add(stage, attempt)

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        ordered = [*STAGES, *sorted(set(self.stages) - set(STAGES))]
        return {stage: [a.as_json() for a in self.stages[stage]] for stage in ordered if self.stages.get(stage)}


def _error_name(error: BaseException | str) -> str:
    return error if isinstance(error, str) else type(error).__name__


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
    config = entry.get("config")
    return ProviderAttempt(kind=entry["kind"][:64], ok=entry.get("ok") is True, ms=max(ms, 0.0),
                           error=str(error)[:MAX_ERROR_CHARS] if error else "",
                           config=config[:100] if isinstance(config, str) else "")
