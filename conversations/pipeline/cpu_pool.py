"""The voice pipeline's shared CPU pools, and the mill that hands them work in groups.

Opus and VAD work of every session runs in one small thread pool (as many threads as
cores), never on the event loop; speaking has a pool of its own. Two measured costs shape
this module (2-core reference box): handing a job to a pool thread costs ~30-90 us of loop
and thread time, as much as decoding a packet; and a model run is far cheaper per item when
many items share it (Silero: ~200 us for one window alone, ~20-35 us per window at 16-32). So
`CpuMill` hands over the pending jobs of many sessions as one pool job, and jobs submitted
with a `BatchRunner` (the hearing's: decode + VAD + endpointing) are given to that runner
together, in one call. With 200 sessions streaming real-time speech, decode + VAD p99 went
from ~750 ms (saturated) to ~25 ms.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
J = TypeVar("J")
Outcome = tuple[Any, BaseException | None]  # (value, error) of one job
log = logging.getLogger(__name__)
_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str) -> ThreadPoolExecutor:
    with _pools_lock:
        if name not in _pools:
            single_threaded_blas()
            workers = hearing_threads() if name == "voice-hear" else max(2, min(4, os.cpu_count() or 2))
            _pools[name] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        return _pools[name]


def single_threaded_blas() -> None:
    """numpy's products in these pools are small (Smart Turn's features, Whisper's mel filter
    bank) and the pools' threads run side by side: BLAS threads of their own would only spin
    against them and the event loop. Applied when a process makes its first pool."""
    import numpy  # noqa: F401, PLC0415 - loads BLAS, so that the limit reaches it
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    threadpool_limits(limits=1, user_api="blas")


def hearing_threads(environ: Mapping[str, str] | None = None, cores: int | None = None) -> int:
    """Threads of a process's hearing pool: its share of the cores. One web process: as many
    as cores (2 to 4). `XIAOZHI_WORKERS` processes (the runner tells each how many there are)
    share the cores: cores / workers each (1 to 4), so the machine does not run twice as many
    busy hearing threads as it has cores. P2 at 300 devices, two workers on 2 cores (issue 17):
    322-329 us of server CPU per frame with one thread each against 336-339 with two."""
    env = os.environ if environ is None else environ
    cores = cores or os.cpu_count() or 2
    try:
        workers = max(1, int(env.get("XIAOZHI_WORKERS", "") or 1))
    except ValueError:
        workers = 1
    if workers == 1:
        return max(2, min(4, cores))
    return max(1, min(4, cores // workers))


def shared_executor() -> ThreadPoolExecutor:
    """The process-wide pool for hearing (Opus decode, VAD): the process's share of the cores
    (`hearing_threads`), shared by every session, so 200 sessions do not mean 200 threads on
    2 cores."""
    return _pool("voice-hear")


def speech_executor() -> ThreadPoolExecutor:
    """A separate pool for speaking (resample, Opus encode): a reply's first frames must not
    queue behind the hearing groups of a hundred other sessions (measured at 100 devices:
    first frame p99 73 ms with one shared pool)."""
    return _pool("voice-speak")


def first_words_executor() -> ThreadPoolExecutor:
    """A pool for a reply's first frames only: they must not queue behind the later frames of
    the replies already speaking either (P1 with 200 devices talking: the speaking pool's
    threads were as busy as the hearing's, and a first slice waited its turn behind them)."""
    return _pool("voice-first-words")


class BatchRunner(Protocol, Generic[J]):
    """Runs many jobs of one kind in one call (in a pool thread), so they can share work
    such as model runs. Runners that compare equal share a call. Returns one (value, error)
    per job, in order; a job's failure is its own."""

    def run_batch(self, jobs: list[J]) -> list[Outcome]: ...


class JobSink(Protocol):
    """Who waits for a job without a future (`CpuMill.submit`): its outcome is handed over
    by a plain call on the loop, so no task has to wake up for it (the hearing's batches)."""

    def done(self) -> bool:
        """True once nobody waits any more (a closed session): a job not started is skipped."""
        ...

    def deliver(self, value: Any, error: BaseException | None) -> None: ...


# (runner or None for a plain job, the job, its future or sink)
_Pending = tuple["BatchRunner[Any] | None", Any, "asyncio.Future[Any] | JobSink"]


class CpuMill:
    """The shared CPU pool as the hearing uses it: the pending jobs of many sessions run as
    one pool job.

    An executor job per session and packet costs ~30-90 us of event-loop and thread
    hand-off, about as much as decoding the packet; grouping whatever is pending when a pool
    thread frees up pays that once per group and adds no delay when idle (a lone job starts
    at once); under load a group waits a few ms for more jobs (`gather_s`). At most one
    group per pool thread is in flight. Order per session holds
    because a session awaits each job before it submits the next.

    The hearing goes one step further (`at_tick` + `submit`): sessions with packets waiting
    register for the end of the loop tick, and one callback per tick collects all their
    batches; results come back to each session by a call (`JobSink.deliver`), not through a
    future and a task wake-up per session and batch.
    """

    _by_executor: weakref.WeakKeyDictionary[Executor, CpuMill] = weakref.WeakKeyDictionary()

    # Under load (the last group had `busy_group` jobs or more) a group waits up to
    # `gather_s` for `full_group` jobs: Silero costs ~200 us for a window alone and ~35 us per
    # window in runs of 16, and under load the mill otherwise starts whatever is pending the
    # moment a thread frees up (a few jobs). P2 at 250 devices, two workers (issue 17):
    # p99 213-283 ms -> 36 ms, 415 -> 355 us of server CPU per frame. A lone job (a quiet
    # server) still starts at once; the wait is inside the 60 ms hearing budget.
    gather_s = 0.008
    busy_group = 4
    full_group = 16

    def __init__(self, executor: Executor, max_inflight: int) -> None:
        self._executor = executor
        self._max_inflight = max(1, max_inflight)
        self._inflight = 0
        self._inflight_loop: asyncio.AbstractEventLoop | None = None  # the loop those groups report to
        self._pending: list[_Pending] = []
        self._last_group = 0  # jobs in the group started last: the load
        self._gather_until = 0.0  # loop time the gathering group starts at (0: none)
        self._gather_loop: asyncio.AbstractEventLoop | None = None  # whose timer that is
        self._preparing: list[Callable[[], None]] = []  # `at_tick` callbacks of this tick
        self._tick_loop: asyncio.AbstractEventLoop | None = None  # the loop whose tick is due
        self._holding = False  # collecting a tick's jobs or delivering a group's: start groups after
        self._lag_total = 0.0  # `note_lag` since the last `take_lag`
        self._lag_count = 0
        self._last_lag = 0.0

    @classmethod
    def for_executor(cls, executor: Executor) -> CpuMill:
        mill = cls._by_executor.get(executor)
        if mill is None:
            mill = cls._by_executor[executor] = cls(executor, getattr(executor, "_max_workers", 2))
        return mill

    def note_lag(self, seconds: float) -> None:
        """A delivered batch's lag (its oldest packet's arrival to its outcome on the loop)."""
        self._lag_total += seconds
        self._lag_count += 1

    def take_lag(self) -> float:
        """The mean lag of the batches delivered since the last call, in seconds. The admission
        watcher reads it every tick: a mean, so that one late batch (a session's first, a
        garbage collection) does not look like a late hearing. With none delivered it is the
        last mean while work is still in the pool (a hearing too late to deliver within a
        tick), 0 when there is none."""
        total, count = self._lag_total, self._lag_count
        self._lag_total, self._lag_count = 0.0, 0
        if count:
            self._last_lag = total / count
        elif not (self._inflight or self._pending):
            self._last_lag = 0.0
        return self._last_lag

    def run(self, job: Callable[[], T]) -> asyncio.Future[T]:
        """A job of its own: `job()` in the pool."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((None, job, future))
        self._start_groups()
        return future

    def run_batched(self, runner: BatchRunner[Any], job: Any) -> asyncio.Future[Any]:
        """A job that joins the other pending jobs of `runner` (and of runners equal to it):
        `runner.run_batch([..., job, ...])` in the pool."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((runner, job, future))
        self._start_groups()
        return future

    def submit(self, runner: BatchRunner[Any] | None, job: Any, sink: JobSink) -> None:
        """A job whose outcome goes to `sink.deliver(value, error)` on the loop: batched with
        `runner` (None: `job()` on its own). Called from an `at_tick` callback, it joins that
        tick's group."""
        self._pending.append((runner, job, sink))
        if not self._holding:
            self._start_groups()

    def at_tick(self, prepare: Callable[[], None]) -> None:
        """Call `prepare` once, at the end of this loop tick, with the other callbacks asked
        for in it, then start groups: one wake-up per tick for every session with work."""
        loop = asyncio.get_running_loop()
        if self._tick_loop is not loop:
            if self._tick_loop is not None:  # due on a loop that is gone (a mill outlives a test's loop)
                self._preparing = []
            self._tick_loop = loop
            loop.call_soon(self._tick)
        self._preparing.append(prepare)

    def _tick(self) -> None:
        preparing, self._preparing, self._tick_loop = self._preparing, [], None
        self._holding = True
        try:
            for prepare in preparing:
                try:
                    prepare()
                except Exception:  # one session's bug must not stall the others
                    log.exception("CPU job preparation failed")
        finally:
            self._holding = False
        self._start_groups()

    def _gathering(self) -> bool:
        """True while a group under load waits for more jobs (a timer starts it at the end)."""
        if not self.gather_s or self._last_group < self.busy_group or len(self._pending) >= self.full_group:
            self._gather_until = 0.0
            return False
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not self._gather_until or self._gather_loop is not loop:  # (a mill outlives a test's loop)
            self._gather_until, self._gather_loop = now + self.gather_s, loop
            loop.call_at(self._gather_until, self._start_groups)
        if now < self._gather_until:
            return True
        self._gather_until = 0.0
        return False

    def _start_groups(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._inflight_loop:  # groups in flight for a loop that is gone never report
            self._inflight, self._inflight_loop = 0, loop  # back (a mill outlives a test's loop)
        while self._pending and self._inflight < self._max_inflight:
            if self._gathering():
                return
            group: list[_Pending] = []
            for pending in self._pending:
                if not pending[2].done():  # its session stopped waiting (closed)
                    group.append(pending)
            self._pending = []
            if not group:
                return
            try:
                done = loop.run_in_executor(self._executor, _run_group, group)
            except RuntimeError as exc:  # the pool was shut down (process exit, tests)
                self._hand_over(group, [(None, exc)] * len(group))
                return
            self._inflight += 1
            self._last_group = len(group)
            done.add_done_callback(partial(self._finished, group=group))

    def _finished(self, done: asyncio.Future[list[Outcome]], *, group: list[_Pending]) -> None:
        self._inflight -= 1
        failed = done.cancelled() or done.exception() is not None
        outcomes: list[Outcome] = (
            [(None, RuntimeError("CPU job group failed"))] * len(group) if failed else done.result()
        )
        self._hand_over(group, outcomes)
        self._start_groups()

    def _hand_over(self, group: list[_Pending], outcomes: list[Outcome]) -> None:
        """Each job's outcome to its future or sink; jobs submitted meanwhile start after."""
        holding, self._holding = self._holding, True
        try:
            for (_runner, _job, sink), (value, error) in zip(group, outcomes, strict=True):
                if sink.done():
                    continue  # its session stopped waiting (closed)
                if isinstance(sink, asyncio.Future):
                    _settle(sink, value, error)
                else:
                    _deliver(sink, value, error)
        finally:
            self._holding = holding


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _deliver(sink: JobSink, value: Any, error: BaseException | None) -> None:
    try:
        sink.deliver(value, error)
    except Exception:  # one session's bug must not keep the group's others from their results
        log.exception("CPU job delivery failed")


def _run_group(group: list[_Pending]) -> list[Outcome]:
    """Run a group in a pool thread: plain jobs one by one, batched jobs one call per runner."""
    outcomes: list[Outcome] = [(None, None)] * len(group)
    batches: dict[BatchRunner[Any], list[int]] = {}
    for index, (runner, job, _future) in enumerate(group):
        if runner is None:
            outcomes[index] = _run_one(job)
        else:
            batches.setdefault(runner, []).append(index)
    for runner, indexes in batches.items():
        try:
            results = runner.run_batch([group[i][1] for i in indexes])
        except Exception as exc:  # a bug in the runner: every job of the batch fails with it
            results = [(None, exc)] * len(indexes)
        for index, outcome in zip(indexes, results, strict=True):
            outcomes[index] = outcome
    return outcomes


def _run_one(job: Callable[[], Any]) -> Outcome:
    try:
        return job(), None
    except Exception as exc:
        return None, exc
