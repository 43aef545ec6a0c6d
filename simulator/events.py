"""The simulated device's event log: every message and incident, with a monotonic timestamp.

Tests read `events` directly or wait on it; waiters are woken on each new event and fail
fast (instead of timing out) once the connection is gone.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple


class DeviceError(Exception):
    """The simulated device could not do what was asked (network, handshake, protocol)."""


class DeviceTimeout(DeviceError, TimeoutError):
    """Waited too long for the server."""


class Event(NamedTuple):
    t: float  # time.monotonic()
    kind: str
    payload: Any


Match = str | Callable[[Event], bool] | None


class EventLog:
    """An append-only list of events plus listeners and waiting."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._listeners: list[Callable[[Event], None]] = []
        self._signal = asyncio.Event()
        self._log: Callable[[str], None] = lambda _line: None

    def __len__(self) -> int:
        return len(self.events)

    def add_listener(self, callback: Callable[[Event], None]) -> None:
        self._listeners.append(callback)

    def set_logger(self, log: Callable[[str], None]) -> None:
        self._log = log

    def record(self, kind: str, payload: Any) -> Event:
        event = Event(time.monotonic(), kind, payload)
        self.events.append(event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - a broken printer must not stop the device
                self._log(f"event listener failed: {exc}")
        # Wake every waiter, then arm a fresh signal for the next event.
        self._signal.set()
        self._signal = asyncio.Event()
        return event

    def finder(self, predicate: Callable[[Event], bool], since: int) -> Callable[[], Event | None]:
        """A check for `wait_until` that scans each event once, starting at index `since`."""
        position = since

        def find() -> Event | None:
            nonlocal position
            while position < len(self.events):
                event = self.events[position]
                position += 1
                if predicate(event):
                    return event
            return None

        return find

    async def wait_until(
        self, check: Callable[[], Any], timeout: float, what: str, is_open: Callable[[], bool],
    ) -> Any:
        """Return check()'s first non-None result; DeviceError once closed, DeviceTimeout at the end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = check()
            if result is not None:
                return result
            if not is_open():
                raise DeviceError(f"connection closed while waiting for {what}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeviceTimeout(f"timed out after {timeout:g} s waiting for {what}")
            signal = self._signal
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(signal.wait(), remaining)


def predicate(match: Match, state: str | None, kind: str | None) -> tuple[Callable[[Event], bool], str]:
    """(predicate, description) for wait_for: a JSON `type` (+ `state`), a callable, or a kind."""
    if callable(match):
        return match, getattr(match, "__name__", "a matching event")
    if isinstance(match, str):
        def is_message(event: Event) -> bool:
            return (event.kind == "json" and event.payload.get("type") == match
                    and (state is None or event.payload.get("state") == state))

        return is_message, match + (f" {state}" if state else "")
    if kind is not None:
        return (lambda event: event.kind == kind), f"a {kind!r} event"
    return (lambda _event: True), "any event"
