"""An asyncio event loop on virtual time, for tests of timing-sensitive pipeline code.

`loop.time()` starts at 0 and moves only when the loop has nothing else to do: then it
jumps straight to the next timer, so `await asyncio.sleep(30)` or a 5 s paced reply takes
no real time, and the order of events is the same on a busy machine as on a quiet one. A
"nothing happened within 0.3 s" assertion is therefore exact: every timer due in those
0.3 s has fired, every task that could run has run.

Real work in threads (`run_in_executor`: Opus, VAD, espeak) takes no virtual time: while any
executor job is in flight the clock stands still and the loop waits for the job for real,
so a result is never "late" because of the machine. The loop must not wait on real I/O
(sockets) for its timing: such waits see virtual time jump. (Modelled on the idea of
livekit-agents' tests/virtual_time.py; written anew.)

Mark a test (or a module: `pytestmark = pytest.mark.virtual_time`) and the root conftest's
`pytest_asyncio_loop_factories` runs it, and its async fixtures, on this loop. Give code under
test the loop's clock (`asyncio.get_running_loop().time`), not `time.monotonic`.
"""
from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# While threads work, the loop polls its selector this often (real seconds) for their results.
THREAD_POLL_S = 0.005
# With nothing scheduled at all, the loop still looks around this often (real seconds).
IDLE_POLL_S = 0.05


class _VirtualSelector(selectors.BaseSelector):
    """The loop's selector, with `select(timeout)` turned into "jump the clock by timeout"
    when nothing is ready and no executor job is pending."""

    def __init__(self, loop: VirtualTimeLoop, real: selectors.BaseSelector) -> None:
        self._loop = loop
        self._real = real

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._loop.threads_busy:
            return self._real.select(THREAD_POLL_S if timeout is None else min(timeout, THREAD_POLL_S))
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return self._real.select(IDLE_POLL_S)  # nothing scheduled: only a thread or I/O can wake us
        self._loop.advance(timeout)
        return []

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 0.0
        self._threads_busy = 0
        super().__init__(_VirtualSelector(self, selectors.DefaultSelector()))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the loop does it itself when idle)."""
        if seconds > 0:
            self._virtual_now += seconds

    @property
    def threads_busy(self) -> int:
        """Executor jobs started through this loop and not yet handed back to it."""
        return self._threads_busy

    def run_in_executor(self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._threads_busy += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _future: asyncio.Future[Any]) -> None:
        self._threads_busy -= 1
