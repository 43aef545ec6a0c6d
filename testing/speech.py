"""Real speech for tests and benchmarks, synthesized offline with espeak-ng.

Whisper tiny.en transcribes espeak almost perfectly and Silero VAD detects it, so these
helpers give end-to-end tests genuine audio without shipping recordings. Blocking calls:
use them from test setup or executor threads, not from a running event loop's hot path.
"""
from __future__ import annotations

from pathlib import Path

from devices.protocol.audio import write_wav
from devices.protocol.opus import OpusEncoder
from simulator.speech import espeak_available, speak

__all__ = ["espeak_available", "opus_packets", "silence", "speak", "speak_wav", "with_silence", "word_edits"]

DEVICE_RATE = 16000  # uplink rate of the Xiaozhi firmware
DEVICE_FRAME_MS = 60


def speak_wav(path: str | Path, text: str, rate: int = DEVICE_RATE) -> Path:
    """Write `text` as a mono 16-bit WAV at `rate`; returns the path."""
    write_wav(path, speak(text, rate=rate), rate)
    return Path(path)


def silence(rate: int, ms: float) -> bytes:
    return bytes(int(rate * ms / 1000) * 2)


def with_silence(pcm: bytes, rate: int, before_ms: float, after_ms: float) -> bytes:
    """Pad `pcm` with digital silence, e.g. to give VAD a clear start and end."""
    return silence(rate, before_ms) + pcm + silence(rate, after_ms)


def opus_packets(pcm16k: bytes, *, dtx: bool = True) -> list[bytes]:
    """Encode 16 kHz PCM as the device does: 60 ms frames, application audio, DTX on.

    The last frame is zero-padded. With DTX, silence turns into 1-byte packets, which is
    exactly what a real device sends between utterances.
    """
    encoder = OpusEncoder(DEVICE_RATE, DEVICE_FRAME_MS, bitrate=24000, application="audio", dtx=dtx)
    size = encoder.frame_bytes
    return [encoder.encode(pcm16k[i : i + size]) for i in range(0, len(pcm16k), size)]


def word_edits(reference: list[str], heard: list[str]) -> int:
    """Word-level edit distance (substitutions, insertions, deletions): what a transcript got
    wrong, for ASR tests and bench/asr_accuracy.py."""
    row = list(range(len(heard) + 1))
    for i, ref_word in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, heard_word in enumerate(heard, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref_word != heard_word))
    return row[-1]
