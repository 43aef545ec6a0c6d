"""One timer per session for the idle farewell, the hard close and the presence touch.

Activity is what tells a live conversation from an abandoned one: the user's voice (the
engine's VAD calls `activity()`), a wake word, and every downlink audio frame — a long
answer must not trip the no-voice timer (protocol-reference gotcha 28).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

# Checked at least this often; lower timeouts (tests) tick faster.
MAX_TICK = 1.0


class Watchdog:
    """Calls `on_idle` once after `idle_timeout` without activity (when `idle_allowed()`),
    awaits `on_hard` after `hard_timeout` without activity, and `on_touch` every
    `touch_interval`. `run()` returns after `on_hard`; cancel it to stop earlier."""

    def __init__(
        self,
        *,
        idle_timeout: float,
        hard_timeout: float,
        touch_interval: float,
        clock: Callable[[], float],
        idle_allowed: Callable[[], bool],
        on_idle: Callable[[], None],
        on_hard: Callable[[], Awaitable[None]],
        on_touch: Callable[[], None],
    ) -> None:
        self.idle_timeout = idle_timeout
        self.hard_timeout = hard_timeout
        self.touch_interval = touch_interval
        self._clock = clock
        self._idle_allowed = idle_allowed
        self._on_idle = on_idle
        self._on_hard = on_hard
        self._on_touch = on_touch
        self._last_activity = self._last_touch = clock()
        self._idle_fired = False

    def activity(self) -> None:
        self._last_activity = self._clock()

    def restart(self) -> None:
        """Start counting from now (at hello: the time before it does not count)."""
        self._last_activity = self._last_touch = self._clock()

    @property
    def tick(self) -> float:
        return max(0.01, min(MAX_TICK, self.idle_timeout / 10, self.hard_timeout / 10,
                             self.touch_interval / 10))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            if await self.check():
                return

    async def check(self) -> bool:
        """One tick's decisions; True once the hard close happened."""
        now = self._clock()
        quiet = now - self._last_activity
        if quiet >= self.hard_timeout:
            await self._on_hard()
            return True
        if quiet >= self.idle_timeout and not self._idle_fired and self._idle_allowed():
            self._idle_fired = True
            self._on_idle()
        if now - self._last_touch >= self.touch_interval:
            self._last_touch = now
            self._on_touch()
        return False
