"""Silero VAD through onnxruntime, plus the endpointing logic that turns probabilities into
speech start/stop events.

The model runner (SileroModel/SileroStream) and the decision logic (VADDetector) are kept
apart on purpose: the detector is pure arithmetic over probabilities, so it is unit-tested
with synthetic numbers, while the model is tested on real speech.

The `silero_vad` package is never imported: its `__init__` imports torch (which we do not
ship) and calls `torch.set_num_threads(1)` globally. We only borrow its ONNX file.
"""
from __future__ import annotations

import importlib.util
import logging
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from conversations.providers.base import ProviderError

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 512  # what silero_vad.onnx expects at 16 kHz (32 ms)
CONTEXT_SAMPLES = 64  # tail of the previous window prepended to each input, as silero does
WINDOW_MS = WINDOW_SAMPLES * 1000 / SAMPLE_RATE
_STATE_SHAPE = (2, 1, 128)


def default_model_path() -> Path:
    """Locate `silero_vad/data/silero_vad.onnx` without executing the package."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ProviderError("silero-vad is not installed (pip install --no-deps silero-vad)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise ProviderError(f"Silero VAD model file not found: {path}")
    return path


class SileroModel:
    """One onnxruntime session per process and model file; `run` is thread-safe in ORT."""

    _instances: ClassVar[dict[Path, SileroModel]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort  # noqa: PLC0415 - keep import cost off modules that skip VAD

        options = ort.SessionOptions()
        # One thread each: many sessions share 2 cores, and a 32 ms window is too small to
        # gain from intra-op parallelism (measured 120 us per window single-threaded).
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        try:
            self._session: Any = ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # ORT raises its own untyped errors for bad files
            raise ProviderError(f"cannot load Silero VAD model {path}: {exc}") from exc
        self.path = path
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    @classmethod
    def shared(cls, path: str | Path | None = None) -> SileroModel:
        """The process-wide model for `path` (default: the file shipped with silero-vad)."""
        resolved = Path(path) if path else default_model_path()
        with cls._lock:
            model = cls._instances.get(resolved)
            if model is None:
                model = cls(resolved)
                cls._instances[resolved] = model
                logger.info("silero vad model loaded", extra={"path": str(resolved)})
            return model

    def run(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """One step: `window` is float32 (1, 64+512) in [-1, 1]; returns (prob, new state)."""
        prob, new_state = self._session.run(
            None, {"input": window, "state": state, "sr": self._sr}
        )
        return float(prob[0, 0]), new_state


class SileroStream:
    """Per-session recurrent state over a continuous 16 kHz stream. Not thread-safe."""

    def __init__(self, model: SileroModel | None = None) -> None:
        self._model = model or SileroModel.shared()
        self.reset()

    def reset(self) -> None:
        """Forget the audio so far (new `listen start`)."""
        self._state = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros((1, CONTEXT_SAMPLES), dtype=np.float32)
        self._leftover = np.zeros(0, dtype=np.float32)

    def probabilities(self, pcm16k: bytes) -> list[float]:
        """Speech probability for each complete 512-sample window; the rest waits for more."""
        if len(pcm16k) % 2:
            raise ValueError(f"PCM length {len(pcm16k)} is not a whole number of s16 samples")
        fresh = np.frombuffer(pcm16k, dtype="<i2").astype(np.float32) / 32768.0
        samples = np.concatenate([self._leftover, fresh])
        count = samples.size // WINDOW_SAMPLES
        self._leftover = samples[count * WINDOW_SAMPLES :]
        windows = samples[: count * WINDOW_SAMPLES].reshape(-1, WINDOW_SAMPLES)
        return [self._step(window) for window in windows]

    def _step(self, chunk: np.ndarray) -> float:
        window = np.concatenate([self._context, chunk[None, :]], axis=1)
        prob, self._state = self._model.run(window, self._state)
        self._context = window[:, -CONTEXT_SAMPLES:]
        return prob


SPEECH_STARTED = "speech_started"
SPEECH_STOPPED = "speech_stopped"


@dataclass(frozen=True)
class VADEvent:
    """An endpointing decision; all times are ms of audio since the detector's last reset.

    `at_ms` is when the decision could be made (end of the deciding window). `speech_start_ms`
    is the start of the first voiced window of the utterance, so callers can keep pre-roll
    from there. `speech_end_ms` (stop events only) is the end of the last voiced window.
    """

    kind: str
    at_ms: float
    speech_start_ms: float
    speech_end_ms: float | None = None


class VADDetector:
    """Dual-threshold endpointing over per-window probabilities (protocol-reference §9).

    - A window is voiced if prob >= `threshold`, unvoiced if prob <= `threshold_low`, and in
      between keeps the previous window's verdict (hysteresis against flicker).
    - "Have voice" = at least `min_voiced` of the last `history` windows are voiced.
    - Speech starts when "have voice" holds and the utterance (from its first voiced window)
      is at least `min_speech_ms` long; stops when "have voice" has been false for
      `min_silence_ms` since it was last true.
    """

    def __init__(
        self,
        threshold: float = 0.5,
        threshold_low: float = 0.3,
        min_silence_ms: float = 200.0,
        min_speech_ms: float = 0.0,
        *,
        window_ms: float = WINDOW_MS,
        history: int = 5,
        min_voiced: int = 3,
    ) -> None:
        if not 0.0 <= threshold_low <= threshold <= 1.0:
            raise ValueError("need 0 <= threshold_low <= threshold <= 1")
        if not 1 <= min_voiced <= history:
            raise ValueError("need 1 <= min_voiced <= history")
        self.threshold, self.threshold_low = threshold, threshold_low
        self.min_silence_ms, self.min_speech_ms = min_silence_ms, min_speech_ms
        self.window_ms, self.min_voiced = window_ms, min_voiced
        self._recent: deque[bool] = deque(maxlen=history)
        self.reset()

    def reset(self) -> None:
        self._recent.clear()
        self._windows = 0
        self._voiced = False
        self.in_speech = False
        self._start_ms: float | None = None  # first voiced window of the current candidate
        self._last_voiced_end_ms = 0.0  # end of the last individually voiced window
        self._last_have_voice_ms = 0.0  # last time the majority said "voice"

    @property
    def position_ms(self) -> float:
        """Audio consumed so far."""
        return self._windows * self.window_ms

    def feed(self, probabilities: list[float]) -> list[VADEvent]:
        """Consume window probabilities in order; return the events they caused."""
        events: list[VADEvent] = []
        for prob in probabilities:
            event = self._step(prob)
            if event is not None:
                events.append(event)
        return events

    def _step(self, prob: float) -> VADEvent | None:
        window_start = self.position_ms
        self._windows += 1
        now = self.position_ms
        if prob >= self.threshold:
            self._voiced = True
        elif prob <= self.threshold_low:
            self._voiced = False
        self._recent.append(self._voiced)
        have_voice = sum(self._recent) >= self.min_voiced
        if have_voice:
            self._last_have_voice_ms = now
        # Stop is judged before this window is credited to the utterance, so a voiced window
        # that arrives as the silence timer expires starts the next candidate instead.
        event = self._stopped(now, have_voice) if self.in_speech else None
        if self._voiced:
            self._last_voiced_end_ms = now
            if self._start_ms is None:
                self._start_ms = window_start
        if not self.in_speech and event is None:
            event = self._started(now, have_voice)
        return event

    def _started(self, now: float, have_voice: bool) -> VADEvent | None:
        if not any(self._recent):
            self._start_ms = None  # the candidate died out before it was long enough
            return None
        if not have_voice or self._start_ms is None:
            return None
        if self._last_voiced_end_ms - self._start_ms < self.min_speech_ms:
            return None
        self.in_speech = True
        return VADEvent(SPEECH_STARTED, now, self._start_ms)

    def _stopped(self, now: float, have_voice: bool) -> VADEvent | None:
        if have_voice or now - self._last_have_voice_ms < self.min_silence_ms:
            return None
        start = self._start_ms if self._start_ms is not None else 0.0
        self.in_speech = False
        self._start_ms = None
        return VADEvent(SPEECH_STOPPED, now, start, self._last_voiced_end_ms)
