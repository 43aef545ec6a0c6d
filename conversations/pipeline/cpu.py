"""The shared CPU pool of the voice pipeline, and the batched VAD that runs in it.

Opus and VAD work of every session runs in one small thread pool (as many threads as
cores), never on the event loop. Two measured costs shape this module (2-core reference
box): handing a job to a pool thread costs ~30-90 us of loop and thread time, as much as
decoding a packet; and Silero costs ~105 us per window run alone but ~45 us per window when
16-32 windows share a run. So `CpuMill` hands over the pending jobs of many sessions as one
group, and the hearing's jobs in a group share their model runs (`BatchedSilero`). With 200
sessions streaming real-time speech, decode + VAD p99 went from ~750 ms (saturated) to
~25 ms.
"""
from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from conversations.providers.base import ProviderError
from conversations.providers.vad.silero import CONTEXT_SAMPLES, SAMPLE_RATE, WINDOW_SAMPLES, default_model_path

T = TypeVar("T")
_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str) -> ThreadPoolExecutor:
    with _pools_lock:
        if name not in _pools:
            workers = max(2, min(4, os.cpu_count() or 2))
            _pools[name] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        return _pools[name]


def shared_executor() -> ThreadPoolExecutor:
    """The process-wide pool for hearing (Opus decode, VAD): as many threads as cores (2 to
    4), shared by every session, so 200 sessions do not mean 200 threads on 2 cores."""
    return _pool("voice-hear")


def speech_executor() -> ThreadPoolExecutor:
    """A separate pool for speaking (resample, Opus encode): a reply's first frames must not
    queue behind the hearing groups of a hundred other sessions (measured at 100 devices:
    first frame p99 73 ms with one shared pool)."""
    return _pool("voice-speak")


_Job = tuple[Callable[[], Any], "asyncio.Future[Any]"]
_Outcome = tuple[Any, BaseException | None]


class CpuMill:
    """The shared CPU pool as the hearing uses it: the pending jobs of many sessions run as
    one pool job.

    An executor job per session and packet costs ~30-90 us of event-loop and thread
    hand-off, about as much as decoding the packet; grouping whatever is pending when a pool
    thread frees up pays that once per group and adds no delay when idle (a lone job starts
    at once). At most one group per pool thread is in flight. Order per session holds
    because a session awaits each job before it submits the next.
    """

    _by_executor: weakref.WeakKeyDictionary[Executor, CpuMill] = weakref.WeakKeyDictionary()

    def __init__(self, executor: Executor, max_inflight: int) -> None:
        self._executor = executor
        self._max_inflight = max(1, max_inflight)
        self._inflight = 0
        self._pending: list[_Job] = []

    @classmethod
    def for_executor(cls, executor: Executor) -> CpuMill:
        mill = cls._by_executor.get(executor)
        if mill is None:
            mill = cls._by_executor[executor] = cls(executor, getattr(executor, "_max_workers", 2))
        return mill

    def run(self, job: Callable[[], T]) -> asyncio.Future[T]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((job, future))
        self._start_groups()
        return future

    def _start_groups(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending and self._inflight < self._max_inflight:
            group = [(job, future) for job, future in self._pending if not future.done()]
            self._pending = []
            if not group:
                return
            try:
                done = loop.run_in_executor(self._executor, _run_group, [job for job, _ in group])
            except RuntimeError as exc:  # the pool was shut down (process exit, tests)
                for _job, future in group:
                    future.set_exception(exc)
                return
            self._inflight += 1
            done.add_done_callback(partial(self._finished, group=group))

    def _finished(self, done: asyncio.Future[list[_Outcome]], *, group: list[_Job]) -> None:
        self._inflight -= 1
        failed = done.cancelled() or done.exception() is not None
        outcomes = [(None, RuntimeError("CPU job group failed"))] * len(group) if failed else done.result()
        for (_job, future), (value, error) in zip(group, outcomes, strict=True):
            if future.done():
                continue  # its session stopped waiting (closed)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)
        self._start_groups()


def _run_group(jobs: list[Callable[[], Any]]) -> list[_Outcome]:
    """Run a group in a pool thread. Jobs with a `run_many` (the hearing's) are handed over
    together so they can share model runs; `run_many` returns one (value, error) per job."""
    outcomes: list[_Outcome] = [(None, None)] * len(jobs)
    batches: dict[Any, list[int]] = {}
    for index, job in enumerate(jobs):
        run_many = getattr(job, "run_many", None)
        if run_many is None:
            outcomes[index] = _run_one(job)
        else:
            batches.setdefault(run_many, []).append(index)
    for run_many, indexes in batches.items():
        try:
            results = run_many([jobs[i] for i in indexes])
        except Exception as exc:  # a bug in run_many: every job of the batch fails with it
            results = [(None, exc)] * len(indexes)
        for index, outcome in zip(indexes, results, strict=True):
            outcomes[index] = outcome
    return outcomes


def _run_one(job: Callable[[], Any]) -> _Outcome:
    try:
        return job(), None
    except Exception as exc:
        return None, exc


class VadStream:
    """One session's Silero state: the recurrent state, the 64-sample context and the
    samples not yet forming a 512-sample window. (SileroStream's bookkeeping, held apart
    from the model so the windows of many sessions can share one model run.)"""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.state = np.zeros((2, 1, 128), dtype=np.float32)
        self.context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self.leftover = np.zeros(0, dtype=np.float32)
        self.last = 1.0  # last probability the model gave

    def windows(self, pcm: bytes) -> np.ndarray:
        """The complete windows in `pcm` (plus earlier leftover), shape (n, 512)."""
        samples = np.concatenate([self.leftover, np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0])
        count = samples.size // WINDOW_SAMPLES
        self.leftover = samples[count * WINDOW_SAMPLES :]
        return samples[: count * WINDOW_SAMPLES].reshape(count, WINDOW_SAMPLES)


class BatchedSilero:
    """Silero VAD for many sessions at once: step k runs the k-th new window of every
    session in one onnxruntime call, on one ORT session per pool thread.

    Measured on the 2-core reference box: a run costs ~105 us for one window but ~45 us per
    window at 16-32 windows; a single shared ORT session serialises concurrent runs (9.0k
    windows/s on one thread, 10.2k on two) where one session per thread gives 17.9k. With
    200 sessions streaming, decode + VAD p99 dropped from ~750 ms (saturated) to ~25 ms.
    Digital silence (DTX packets decode to +-1) is probability 0 without a run once the
    model itself has settled on silence, so the end of speech keeps its smoothing.
    """

    SILENCE_PEAK = 0.002  # float samples, about -54 dBFS (65 in s16 units)
    SETTLED = 0.1  # below any sensible threshold_low

    def __init__(self, path: str | None = None) -> None:
        self._path = path
        self._local = threading.local()
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def run(self, streams: list[VadStream], windows: list[np.ndarray]) -> list[list[float]]:
        """Probabilities per stream for its windows, in order; advances every stream."""
        probs: list[list[float]] = [[] for _ in streams]
        for k in range(max((len(w) for w in windows), default=0)):
            live = [i for i, w in enumerate(windows) if len(w) > k and not self._gated(streams[i], w[k], probs[i])]
            if live:
                self._step([streams[i] for i in live], [windows[i][k] for i in live], [probs[i] for i in live])
        return probs

    def _gated(self, stream: VadStream, window: np.ndarray, out: list[float]) -> bool:
        if stream.last >= self.SETTLED or float(np.abs(window).max()) >= self.SILENCE_PEAK:
            return False
        stream.context = window[-CONTEXT_SAMPLES:]
        out.append(0.0)
        return True

    def _step(self, streams: list[VadStream], chunks: list[np.ndarray], outs: list[list[float]]) -> None:
        inputs = np.stack([np.concatenate([s.context, c]) for s, c in zip(streams, chunks, strict=True)])
        states = np.concatenate([s.state for s in streams], axis=1)
        prob, new_states = self._session().run(None, {"input": inputs, "state": states, "sr": self._sr})
        for i, stream in enumerate(streams):
            stream.state = new_states[:, i : i + 1, :]
            stream.context = inputs[i, -CONTEXT_SAMPLES:]
            stream.last = float(prob[i, 0])
            outs[i].append(stream.last)

    def _session(self) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = _load_session(Path(self._path) if self._path else default_model_path())
        return session


def _load_session(path: Path) -> Any:
    """An ORT session with SileroModel's options (one thread each: the model is tiny and
    the pool is shared). A batched `run` on SileroModel itself would make this go away."""
    import onnxruntime as ort  # noqa: PLC0415 - loaded with the first VAD window

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own untyped errors for bad files
        raise ProviderError(f"cannot load Silero VAD model {path}: {exc}") from exc


VAD = BatchedSilero()


