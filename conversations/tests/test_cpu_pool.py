"""The CPU mill: jobs of many sessions go to the pool in groups; batched jobs share one call."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from conversations.pipeline import cpu_pool
from conversations.pipeline.cpu_pool import CpuMill, Outcome, hearing_threads


async def test_the_cpu_mill_groups_pending_jobs_and_isolates_failures() -> None:
    pool = ThreadPoolExecutor(1)
    mill = CpuMill(pool, max_inflight=1)
    ran: list[int] = []

    def job(n: int) -> int:
        ran.append(n)
        if n == 3:
            raise ValueError("bad packet")
        return n * 10

    futures = [mill.run(lambda n=n: job(n)) for n in range(6)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert results[:3] == [0, 10, 20] and isinstance(results[3], ValueError) and results[4:] == [40, 50]
    assert ran == list(range(6))  # submission order, one thread
    pool.shutdown()
    with pytest.raises(RuntimeError):
        await mill.run(lambda: 1)


@dataclass(frozen=True)
class Doubler:
    """A batch runner that records the size of every call it gets."""

    calls: list[int] = field(default_factory=list, compare=False, hash=False)
    name: str = "double"

    def run_batch(self, jobs: list[int]) -> list[Outcome]:
        self.calls.append(len(jobs))
        return [(None, ValueError("odd")) if n == 7 else (n * 2, None) for n in jobs]


async def test_batched_jobs_pending_together_share_one_call_and_keep_their_own_results() -> None:
    pool = ThreadPoolExecutor(1)
    mill = CpuMill(pool, max_inflight=1)
    runner = Doubler()
    first = mill.run(lambda: "plain")  # occupies the only slot: the rest wait together
    batched = [mill.run_batched(runner, n) for n in (1, 7, 3)]
    same_kind = mill.run_batched(Doubler(runner.calls), 4)  # an equal runner joins the call
    results = await asyncio.gather(first, *batched, same_kind, return_exceptions=True)
    assert results[0] == "plain" and results[1] == 2 and isinstance(results[2], ValueError)
    assert results[3:] == [6, 8]
    assert runner.calls == [4]
    pool.shutdown()


async def test_a_runner_that_raises_fails_only_its_own_jobs() -> None:
    class Broken:
        def run_batch(self, jobs: list[int]) -> list[Outcome]:
            raise RuntimeError("bug")

    pool = ThreadPoolExecutor(1)
    mill = CpuMill(pool, max_inflight=1)
    blocker = mill.run(lambda: "first")
    broken = mill.run_batched(Broken(), 1)
    fine = mill.run(lambda: "fine")
    results = await asyncio.gather(blocker, broken, fine, return_exceptions=True)
    assert results[0] == "first" and isinstance(results[1], RuntimeError) and results[2] == "fine"
    pool.shutdown()


async def test_under_load_a_group_gathers_jobs_but_a_lone_job_starts_at_once() -> None:
    """Idle: a job starts at once. After a group of `busy_group` or more, the next waits up
    to `gather_s` for `full_group` jobs (larger model runs), or starts when that many wait."""
    pool = ThreadPoolExecutor(1)
    mill = CpuMill(pool, max_inflight=1)
    mill.gather_s, mill.busy_group, mill.full_group = 0.2, 2, 4
    runner = Doubler()
    assert await mill.run_batched(runner, 1) == 2  # idle: no wait
    first = mill.run(lambda: "plain")  # holds the slot: the next two go as one group
    assert await asyncio.gather(first, *(mill.run_batched(runner, n) for n in (1, 2))) == ["plain", 2, 4]
    assert runner.calls == [1, 2]  # a group of 2: busy from now on
    loop = asyncio.get_running_loop()
    started = loop.time()
    gathered = [mill.run_batched(runner, n) for n in (3, 4)]
    await asyncio.sleep(0.05)
    assert runner.calls == [1, 2]  # waiting for more
    assert await asyncio.gather(*gathered) == [6, 8]
    assert loop.time() - started >= 0.19 and runner.calls == [1, 2, 2]  # the timer started them together
    full = [mill.run_batched(runner, n) for n in range(4)]  # a full group does not wait
    assert await asyncio.wait_for(asyncio.gather(*full), 0.1) == [0, 2, 4, 6]
    assert runner.calls == [1, 2, 2, 4]
    pool.shutdown()


class Sink:
    """A `JobSink` that records what it is handed."""

    def __init__(self, closed: bool = False, broken: bool = False) -> None:
        self.got: list[tuple[object, BaseException | None]] = []
        self.closed, self.broken = closed, broken

    def done(self) -> bool:
        return self.closed

    def deliver(self, value: object, error: BaseException | None) -> None:
        self.got.append((value, error))
        if self.broken:
            raise RuntimeError("bug in a session")


async def test_jobs_asked_for_in_one_tick_go_as_one_group_and_come_back_by_a_call() -> None:
    pool = ThreadPoolExecutor(1)
    mill = CpuMill(pool, max_inflight=2)
    runner = Doubler()
    sinks = [Sink(broken=True), Sink(), Sink()]
    closed = Sink(closed=True)
    for n, sink in enumerate([*sinks, closed]):
        mill.at_tick(lambda n=n, sink=sink: mill.submit(runner, 7 if n == 1 else n, sink))
    assert runner.calls == []  # collected at the end of the tick, not one by one
    for _ in range(200):
        if all(sink.got for sink in sinks):
            break
        await asyncio.sleep(0.005)
    assert runner.calls == [3]  # one call for the tick; the closed session's job is skipped
    assert sinks[0].got == [(0, None)] and sinks[2].got == [(4, None)]
    assert isinstance(sinks[1].got[0][1], ValueError)  # its own failure, after a sink that raised
    assert closed.got == []
    pool.shutdown()


def test_each_web_worker_takes_its_share_of_the_cores_for_hearing() -> None:
    assert hearing_threads({}, cores=2) == 2  # one process: as before
    assert hearing_threads({"XIAOZHI_WORKERS": "1"}, cores=16) == 4
    assert hearing_threads({"XIAOZHI_WORKERS": "2"}, cores=2) == 1
    assert hearing_threads({"XIAOZHI_WORKERS": "2"}, cores=8) == 4
    assert hearing_threads({"XIAOZHI_WORKERS": "4"}, cores=2) == 1
    assert hearing_threads({"XIAOZHI_WORKERS": "many"}, cores=2) == 2


async def test_a_shut_down_pool_fails_a_sinks_job_too() -> None:
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    sink = Sink()
    CpuMill(pool, max_inflight=1).submit(Doubler(), 1, sink)
    assert len(sink.got) == 1 and isinstance(sink.got[0][1], RuntimeError)


def test_groups_left_in_flight_by_a_closed_loop_do_not_block_the_next_loops() -> None:
    pool = ThreadPoolExecutor(2)
    mill = CpuMill(pool, max_inflight=2)
    release, finished = threading.Event(), threading.Semaphore(0)

    def slow_job() -> None:
        release.wait()
        finished.release()

    async def leave_groups_running() -> None:  # a test that ends while its jobs still run
        mill.run(slow_job)
        mill.run(slow_job)

    async def next_job() -> int:  # a guard only: the job runs at once unless the mill waits
        return await asyncio.wait_for(mill.run(lambda: 42), 10)

    asyncio.run(leave_groups_running())
    release.set()  # both groups end in their threads; their outcomes cannot reach the closed loop
    assert finished.acquire(timeout=10) and finished.acquire(timeout=10)
    assert asyncio.run(next_job()) == 42
    pool.shutdown()


def test_a_process_making_its_pools_keeps_numpys_blas_to_one_thread() -> None:
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(limits=2, user_api="blas")  # as a process with BLAS's own default
    try:
        pool = cpu_pool._pool("test-blas")
    finally:
        cpu_pool._pools.pop("test-blas", None)
    pool.shutdown()
    blas = [lib for lib in threadpool_info() if lib["user_api"] == "blas"]
    assert blas and all(lib["num_threads"] == 1 for lib in blas)


async def test_the_hearing_lag_the_admission_reads_is_a_mean_kept_while_work_is_still_in_the_pool() -> None:
    pool = ThreadPoolExecutor(1)
    mill = CpuMill(pool, max_inflight=1)
    assert mill.take_lag() == 0.0  # nothing delivered, nothing in the pool
    for seconds in (0.004, 0.006, 0.110):
        mill.note_lag(seconds)
    assert mill.take_lag() == pytest.approx(0.040)  # one late batch moves the mean, not to 110 ms
    release = threading.Event()
    stuck = mill.run(release.wait)  # a group too slow to deliver within the next tick
    assert mill.take_lag() == pytest.approx(0.040)  # late still, not 0
    release.set()
    await stuck
    assert mill.take_lag() == 0.0  # delivered nothing more and idle: on time
    pool.shutdown()
