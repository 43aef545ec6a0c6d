"""The virtual-time loop: sleeps take no real time, timers fire in order, threads hold the clock."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from testing.virtual_time import VirtualTimeLoop

pytestmark = pytest.mark.virtual_time


async def test_the_marker_runs_the_test_on_the_virtual_loop() -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop) and loop.time() < 1.0


async def test_a_long_sleep_takes_no_real_time_and_moves_the_clock_exactly() -> None:
    loop = asyncio.get_running_loop()
    started, real = loop.time(), time.monotonic()
    await asyncio.sleep(3600)
    assert loop.time() - started == pytest.approx(3600)
    assert time.monotonic() - real < 1.0


async def test_timers_fire_in_the_order_they_are_due() -> None:
    fired: list[float] = []
    loop = asyncio.get_running_loop()

    async def at(delay: float) -> None:
        await asyncio.sleep(delay)
        fired.append(delay)

    await asyncio.gather(at(5.0), at(0.5), at(2.0))
    assert fired == [0.5, 2.0, 5.0] and loop.time() == pytest.approx(5.0)


async def test_a_timeout_fires_at_its_deadline() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(30):
            await asyncio.Event().wait()
    assert loop.time() - started == pytest.approx(30)


async def test_the_clock_stands_still_while_an_executor_job_runs() -> None:
    loop = asyncio.get_running_loop()
    release = threading.Event()
    job = loop.run_in_executor(None, release.wait, 5)
    timer = asyncio.ensure_future(asyncio.sleep(1.0))
    await asyncio.sleep(0)
    started = loop.time()
    threading.Timer(0.1, release.set).start()  # real time: the job takes ~0.1 s
    done, _ = await asyncio.wait({job, timer}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {job}  # the 1 s (virtual) timer did not overtake the thread
    assert loop.time() == started
    await timer
    assert loop.time() - started == pytest.approx(1.0)


def test_without_the_marker_the_loop_is_asyncio_s_own() -> None:
    async def kind() -> type:
        return type(asyncio.get_running_loop())

    assert asyncio.run(kind()) is not VirtualTimeLoop
