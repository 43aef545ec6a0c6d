"""The LLM ↔ tools loop of one turn, shared by the device's voice turns and the gateway's.

Each round streams a completion from the first LLM of a fallback chain that answers
(pipeline/fallback.py); if the model asks for tools, they run (through the Toolset, which
never raises: a failing tool becomes text the model can apologise about) and the results go
back to the model for another round. At most `max_rounds` rounds offer tools; the round after
them offers none, so a model stuck calling tools has to answer.

The text of every round is handed to `on_text` as it streams (the device speaks it at once;
the gateway collects it). Callers differ only in how a round's tool calls run (`run_calls`:
one after another for the device, server-then-client tools with notices for the gateway) and
in an optional per-round deadline (the gateway's LLM_TIMEOUT). Both bound the LLM's waits the
same way: its first delta within `first_token_timeout` (else the next provider), every later
one within `inter_token_timeout` (else the turn fails: ProviderStalled). A `WaitWatcher` hears
when the user starts waiting (a round or a tool call begins) and when the model's words
arrive, so the device can say a filler when the wait gets long. Cancelling the caller cancels
the LLM request and any running tool.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from conversations.capture import AttemptLog
from conversations.pipeline import fallback
from conversations.pipeline.fallback import ProviderChain
from conversations.providers.base import ToolCall
from tools.registry import ToolCallRecord, Toolset

log = logging.getLogger(__name__)

MAX_TOOL_ROUNDS = 5

OnText = Callable[[str], Awaitable[None]]
CallRunner = Callable[[list[ToolCall]], Awaitable[list[ToolCallRecord]]]


@dataclass
class Thought:
    """What one turn's thinking produced, for the turn record; filled in as it happens, so
    it also tells what a failed or interrupted turn got to."""

    rounds: list[str] = field(default_factory=list)  # the model's raw text, per round
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)  # LLM kinds that served, in order
    first_token_at: float | None = None  # on the loop's clock
    llm_seconds: float = 0.0  # spent in LLM rounds (perf counter)
    attempts: AttemptLog = field(default_factory=AttemptLog)  # every LLM call, failures included

    @property
    def reply_text(self) -> str:
        """Everything the model said, as one stream (what a voice turn spoke)."""
        return "".join(self.rounds)

    @property
    def answer_text(self) -> str:
        """The non-blank rounds, one per line (what a gateway turn answers)."""
        return "\n".join(text for text in self.rounds if text.strip())

    def tool_call_dicts(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(record) for record in self.tool_calls]


def tool_message(call: ToolCall, record: ToolCallRecord) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": record.result}


def assistant_tool_message(text: str, calls: list[ToolCall]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }


class WaitWatcher(Protocol):
    """Told when the user starts waiting on the loop and when the model's words arrive."""

    def waiting(self) -> None: ...  # a round was requested, or tool calls run

    def answered(self) -> None: ...  # the round's first text arrived


@dataclass(frozen=True)
class LLMOptions:
    model: str
    temperature: float
    max_tokens: int


class ToolLoop:
    """One turn's loop. `run()` raises ProviderError when no LLM answers or one breaks
    mid-stream, TimeoutError when a round outlives `round_timeout`."""

    def __init__(
        self,
        *,
        toolset: Toolset,
        options: LLMOptions,
        max_rounds: int = MAX_TOOL_ROUNDS,
        round_timeout: float | None = None,
        run_calls: CallRunner | None = None,
        clock: Callable[[], float] = time.monotonic,
        first_token_timeout: float | None = None,
        inter_token_timeout: float | None = None,
        watcher: WaitWatcher | None = None,
        before_tools: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._toolset = toolset
        self._before_tools = before_tools  # awaited before tool calls run (an early reply's commit)
        self._options = options
        self._max_rounds = max_rounds
        self._round_timeout = round_timeout
        self._run_calls = run_calls or self._one_after_another
        self._clock = clock
        self._first_wait = first_token_timeout
        self._gap = inter_token_timeout
        self._watcher = watcher

    async def run(
        self, chain: ProviderChain, messages: list[dict[str, Any]], thought: Thought, on_text: OnText | None = None
    ) -> None:
        """Run the loop over `messages` (appended to as tools are called)."""
        tools = self._toolset.llm_tools()
        for round_no in range(self._max_rounds + 1):
            offered = tools if tools and round_no < self._max_rounds else None
            calls = await self._round(chain, messages, offered, thought, on_text)
            if not calls:
                return
            if offered is None:
                log.warning("tool-call depth limit reached", extra={"rounds": self._max_rounds})
                return
            messages.append(assistant_tool_message(thought.rounds[-1], calls))
            if self._before_tools is not None:
                await self._before_tools()
            if self._watcher is not None:
                self._watcher.waiting()
            records = await self._run_calls(calls)
            thought.tool_calls.extend(records)
            messages.extend(tool_message(call, record) for call, record in zip(calls, records, strict=True))

    async def _round(
        self,
        chain: ProviderChain,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        thought: Thought,
        on_text: OnText | None,
    ) -> list[ToolCall]:
        thought.rounds.append("")
        calls: list[ToolCall] = []
        started = time.perf_counter()
        watcher = self._watcher
        if watcher is not None:
            watcher.waiting()
        kind: str | None = None
        try:
            async with asyncio.timeout(self._round_timeout):
                kind, deltas = await fallback.stream_llm(
                    chain, messages, attempts=thought.attempts, first_wait=self._first_wait, gap=self._gap,
                    tools=tools, model=self._options.model,
                    temperature=self._options.temperature, max_tokens=self._options.max_tokens,
                )
                if kind not in thought.providers:
                    thought.providers.append(kind)
                async with aclosing(deltas):  # type: ignore[type-var]
                    async for delta in deltas:
                        if thought.first_token_at is None and (delta.text or delta.tool_calls):
                            thought.first_token_at = self._clock()
                        if delta.tool_calls:
                            calls.extend(delta.tool_calls)
                        if delta.text:
                            if watcher is not None and not thought.rounds[-1]:
                                watcher.answered()
                            thought.rounds[-1] += delta.text
                            if on_text is not None:
                                await on_text(delta.text)
        except TimeoutError:
            if kind is None and chain.slots:
                # The round's deadline cut a model that never answered: the chain could not
                # log that attempt, the turn's record should (the stuck one is tried first).
                elapsed_ms = (time.perf_counter() - started) * 1000
                stuck = chain.order()[0]
                thought.attempts.failed("llm", stuck.kind, "TimeoutError", elapsed_ms, config=stuck.name)
            raise
        finally:
            thought.llm_seconds += time.perf_counter() - started
        return calls

    async def _one_after_another(self, calls: list[ToolCall]) -> list[ToolCallRecord]:
        return [await self._toolset.call(call.name, call.arguments) for call in calls]
