"""Early replies: the LLM asked on a pause's transcript before the turn is certain.

With smart turn detection the speculative ASR (started a few Silero windows into a pause) is
often done before the end-of-turn model's verdict, and then the turn waited for the model and
only after it for the LLM's first token. An early reply asks the LLM as soon as the pause's
transcript is there, so its first words are on their way while the model decides (livekit's
"preemptive generation"). Nothing reaches the device or the tools before the turn is certain:
the text waits in the reply's buffer and a tool call waits for `join`; the context window is
only updated by the turn that uses it. If speech resumes, the engine cancels the reply with its
speculation, so a pause that was not the end costs one cancelled LLM request (its prompt
tokens; the persona's `early_reply` turns this off).
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from conversations.turns.tool_loop import OnText, Thought, WaitWatcher

# (thought, on_text, watcher, before_tools) -> the thinking, e.g. Thinker.think bound to a chain and text
Think = Callable[[Thought, OnText, WaitWatcher, Callable[[], Awaitable[object]]], Coroutine[Any, Any, None]]
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class _HeldWatcher:
    """Passes the tool loop's wait signals on to the turn's watcher (the filler) once the turn
    has taken the reply over: the user's wait starts at the end of the turn, not at the pause."""

    def __init__(self) -> None:
        self._target: WaitWatcher | None = None
        self._waiting = False

    def waiting(self) -> None:
        self._waiting = True
        if self._target is not None:
            self._target.waiting()

    def answered(self) -> None:
        self._waiting = False
        if self._target is not None:
            self._target.answered()

    def attach(self, target: WaitWatcher) -> None:
        self._target = target
        if self._waiting:
            target.waiting()


class EarlyReply:
    """The LLM's answer to `text`, running in a task of the session's (`spawn`) from now on."""

    def __init__(self, text: str, think: Think, spawn: Spawn) -> None:
        self.text = text
        self.thought = Thought()
        self._held: deque[str] = deque()  # text before the turn took over (bounded by the LLM's max_tokens)
        self._target: OnText | None = None
        self._committed = asyncio.Event()
        self._watcher = _HeldWatcher()
        self._error: Exception | None = None
        self._task = spawn(self._run(think(self.thought, self._on_text, self._watcher, self._committed.wait)))

    async def join(self, on_text: OnText, watcher: WaitWatcher) -> None:
        """The turn is certain: the text so far goes to `on_text`, then the rest as it streams,
        and tool calls may run. Returns when the thinking has ended and raises what it raised
        (ProviderError: no LLM answered). Cancelling the caller cancels the thinking."""
        self._watcher.attach(watcher)
        while self._held:  # new text may arrive while the held text is passed on
            await on_text(self._held.popleft())
        self._target = on_text
        self._committed.set()
        await self._task
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        """The pause was not the end of the turn (or the turn did not use this reply)."""
        self._task.cancel()

    async def _run(self, thinking: Coroutine[Any, Any, None]) -> None:
        try:
            await thinking
        except Exception as exc:  # the turn that joins raises it (the session's task set would log it)
            self._error = exc

    async def _on_text(self, delta: str) -> None:
        if self._target is None:
            self._held.append(delta)
        else:
            await self._target(delta)
