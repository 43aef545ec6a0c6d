"""The simulated device's acoustic echo: what its speaker plays comes back into its microphone.

A device built for server-side AEC (`CONFIG_USE_SERVER_AEC`, hello `features.aec`) does not
cancel its own voice: the microphone hears the user *and* the reply. `EchoPath` models that
as a timeline of the speaker's output at 16 kHz (each accepted downlink frame written at the
moment it starts playing) and a room: the output delayed by `delay_ms` (device buffers plus
the way through the air), scaled by `gain`, plus a few decaying reflections (`taps`:
(extra delay ms, relative gain) pairs). `mix` adds the echo of a capture window to the
user's 60 ms of microphone PCM.

`AecStamps` is the firmware's timestamp queue, exactly: a played frame with timestamp > 0
pushes it (when it starts playing: `AudioOutputTask` after `OutputData`), and every encoded
uplink packet pops the front — used as the packet's timestamp while at most
`MAX_TIMESTAMPS_IN_QUEUE` (3) are queued, otherwise 0 and the front is dropped anyway
[FW main/audio/audio_service.cc `PushTaskToEncodeQueue`].
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from devices.protocol.audio import resample

RATE = 16000
MAX_TIMESTAMPS_IN_QUEUE = 3
DEFAULT_TAPS: tuple[tuple[float, float], ...] = ((0.0, 1.0), (7.0, 0.45), (19.0, 0.25), (37.0, 0.12))
HISTORY_S = 10.0  # speaker output kept for the echo (longer than any delay + window)


def parse_taps(text: str) -> tuple[tuple[float, float], ...]:
    """ "0:1,7:0.45,19:0.25" → ((0, 1), (7, 0.45), (19, 0.25)); raises ValueError."""
    taps: list[tuple[float, float]] = []
    for part in text.split(","):
        delay, _, gain = part.strip().partition(":")
        taps.append((float(delay), float(gain)))
    if not taps or any(d < 0 or d > 500 or not -4 <= g <= 4 for d, g in taps):
        raise ValueError("taps are 'ms:gain' pairs, 0 <= ms <= 500, -4 <= gain <= 4")
    return tuple(taps)


@dataclass
class EchoPath:
    """Speaker → room → microphone. Times are `time.monotonic()` seconds."""

    delay_ms: float = 60.0
    gain: float = 0.5
    taps: tuple[tuple[float, float], ...] = DEFAULT_TAPS
    t0: float = 0.0  # timeline origin (set on the first frame)
    _out: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    _origin: int = 0  # timeline sample index of _out[0]

    def play(self, start: float, pcm: bytes, rate: int) -> None:
        """A decoded downlink frame starts playing at `start`."""
        samples = np.frombuffer(resample(pcm, rate, RATE) if rate != RATE else pcm, "<i2").astype(np.float32)
        if not self.t0:
            self.t0 = start
        begin = round((start - self.t0) * RATE) - self._origin
        end = begin + len(samples)
        if end > len(self._out):
            self._out = np.concatenate([self._out, np.zeros(end - len(self._out), np.float32)])
        if begin >= 0:
            self._out[begin:end] = samples
        self._trim()

    def cut(self, at: float) -> None:
        """Nothing plays after `at` (the decode queue was reset): drop what was scheduled."""
        if self.t0:
            begin = max(0, round((at - self.t0) * RATE) - self._origin)
            self._out[begin:] = 0.0

    def echo(self, start: float, samples: int) -> np.ndarray:
        """The echo the microphone picks up over `samples` from `start` (float s16 units)."""
        out = np.zeros(samples, np.float32)
        if not self.t0:
            return out
        first = round((start - self.t0) * RATE) - self._origin
        for tap_ms, tap_gain in self.taps:
            lag = round((self.delay_ms + tap_ms) * RATE / 1000)
            lo, hi = first - lag, first - lag + samples
            a, b = max(lo, 0), min(hi, len(self._out))
            if a < b:
                out[a - lo : b - lo] += self.gain * tap_gain * self._out[a:b]
        return out

    def mix(self, start: float, mic: bytes) -> bytes:
        """`mic` (the user's s16le 16 kHz PCM captured from `start`) plus the room's echo."""
        user = np.frombuffer(mic, "<i2").astype(np.float32)
        return np.clip(np.rint(user + self.echo(start, len(user))), -32768, 32767).astype("<i2").tobytes()

    def _trim(self) -> None:
        excess = len(self._out) - int(HISTORY_S * RATE)
        if excess > 0:
            self._out = self._out[excess:]
            self._origin += excess


class AecStamps:
    """The firmware's `timestamp_queue_` (see the module docstring)."""

    def __init__(self) -> None:
        self._scheduled: deque[tuple[float, int]] = deque()  # (play start, stamp), not yet played
        self.queue: deque[int] = deque()
        self.dropped = 0

    def played(self, start: float, stamp: int) -> None:
        if stamp > 0:
            self._scheduled.append((start, stamp))

    def clear_scheduled(self) -> None:
        """Frames that will never play (the decode queue was reset)."""
        self._scheduled.clear()

    def for_uplink(self, now: float) -> int:
        while self._scheduled and self._scheduled[0][0] <= now:
            self.queue.append(self._scheduled.popleft()[1])
        if not self.queue:
            return 0
        stamp = self.queue.popleft()
        if len(self.queue) + 1 <= MAX_TIMESTAMPS_IN_QUEUE:
            return stamp
        self.dropped += 1  # "Timestamp queue (n) is full, dropping timestamp"
        return 0
