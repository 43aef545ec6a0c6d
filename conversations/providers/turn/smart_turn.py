"""Smart Turn v3.2: is the user done speaking? An 8.7 MB ONNX model run through onnxruntime.

The model file ships inside the `pipecat-ai` wheel (BSD-2), installed with `--no-deps` like
silero-vad: we only locate the file through the package's installed metadata, never import
`pipecat` (its `__init__` needs loguru and the rest of the framework). Features are our own
(features.py).

One ORT session per process (`registry.shared`), built on first use in a model thread;
`XIAOZHI_TURN_MODEL_THREADS` sets its intra-op threads. Inference (~75-90 ms on one core)
runs in this provider's own small thread pool, never on the event loop nor in the hearing
pool (a 90 ms job there would hold up every session's decode + VAD). A semaphore bounds the
predictions running or queued per process; beyond it `predict` fails at once with
`TurnModelBusy`, and the hearing ends that pause with the fixed silence window instead of
queueing behind stale work.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from conversations.providers.base import ProviderError, TurnVerdict, onnx_session
from conversations.providers.turn.features import SAMPLE_RATE, last_window, log_mel

logger = logging.getLogger(__name__)

MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
THRESHOLD = 0.5  # the model's sigmoid output; above it the turn is complete (as pipecat)


class TurnModelBusy(ProviderError):
    """Too many predictions running or waiting in this process."""


def default_model_path() -> Path:
    """The ONNX file from the installed pipecat-ai distribution, without importing it."""
    try:
        dist = importlib.metadata.distribution("pipecat-ai")
    except importlib.metadata.PackageNotFoundError:
        raise ProviderError("pipecat-ai is not installed (pip install --no-deps pipecat-ai)") from None
    path = Path(str(dist.locate_file(MODEL_FILE)))
    if not path.is_file():
        raise ProviderError(f"Smart Turn model file not found: {path}")
    return path


class SmartTurn:
    """The end-of-turn provider (providers/base.py `TurnModel`)."""

    name = "smart_turn"

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        threads: int = 1,
        concurrency: int = 2,
        backlog: int = 8,
        **_: Any,
    ) -> None:
        self.path = Path(path) if path else default_model_path()
        self._threads = max(1, int(threads))
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(concurrency)), thread_name_prefix="voice-turn")
        # Running plus queued predictions; a non-blocking acquire, so a burst sheds load.
        self._slots = threading.BoundedSemaphore(max(1, int(concurrency)) + max(0, int(backlog)))
        self._session: Any = None
        self._load_lock = threading.Lock()

    async def predict(self, pcm16k: bytes) -> TurnVerdict:
        """Is the utterance in `pcm16k` (16 kHz s16 mono, ending now) complete?"""
        if not self._slots.acquire(blocking=False):
            raise TurnModelBusy("turn model busy")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self.predict_blocking, pcm16k)
        finally:
            self._slots.release()

    def predict_blocking(self, pcm16k: bytes) -> TurnVerdict:
        started = time.perf_counter()
        features = log_mel(last_window(pcm16k))[np.newaxis]
        try:
            output = self.session().run(None, {"input_features": features})[0]
        except ProviderError:
            raise
        except Exception as exc:  # ORT raises its own untyped errors
            raise ProviderError(f"turn model failed: {exc}") from exc
        probability = float(np.asarray(output).reshape(-1)[0])
        elapsed_ms = (time.perf_counter() - started) * 1000
        return TurnVerdict(probability > THRESHOLD, probability, elapsed_ms)

    def warm(self) -> None:
        """Load the model in a model thread now, so the first pause does not pay for it.
        Once loaded, nothing: every connecting session calls this (no thread hop each)."""
        if self._session is None:
            self._pool.submit(self.session)

    def session(self) -> Any:
        with self._load_lock:
            if self._session is None:
                self._session = _load_session(self.path, self._threads)
            return self._session


def _load_session(path: Path, threads: int) -> Any:
    try:
        session = onnx_session(str(path), threads)
    except Exception as exc:
        raise ProviderError(f"cannot load Smart Turn model {path}: {exc}") from exc
    logger.info("smart turn model loaded", extra={"path": str(path), "threads": threads, "sample_rate": SAMPLE_RATE})
    return session
