"""One gateway turn: the LLM ↔ tools loop (seed §7.4–7.7).

Each round streams a completion; if the model asks for tools, server tools run first
(`tool_call` notice each, seed §7.6), then client tools together (`waiting_for_tools`, then
one `tool_callback` each), and every result goes back to the model. A failed tool call is
reported to the client as an `error` *notice* (TOOL_NOT_FOUND, INVALID_TOOL_PARAMETERS,
TOOL_RESULT_TIMEOUT, TOOL_EXECUTION_FAILED) while the model still gets a result text, so the
turn goes on and ends with `llm_response`. Only the LLM itself failing ends a turn early
(GatewayError LLM_ERROR or TIMEOUT).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from conversations.gateway import protocol
from conversations.gateway.client_tools import CALL_TRACE, CallTrace
from conversations.gateway.protocol import ErrorCode, GatewayError
from conversations.gateway.store import ChatOptions
from conversations.pipeline.think import assistant_tool_message, tool_message
from conversations.providers.base import LLM, ProviderError, ToolCall
from tools.registry import ToolCallRecord, Toolset

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class TurnSettings:
    model: str
    llm_timeout: float
    max_tool_rounds: int
    client_tool_timeout: float


@dataclass
class TurnOutcome:
    text: str = ""  # the model's words over all rounds, raw
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    llm_ms: float = 0.0
    rounds: int = 0


class TurnRunner:
    """Runs the loop for one user message; `run` raises GatewayError only for LLM failures."""

    def __init__(
        self, *, llm: LLM, toolset: Toolset, send: Send, settings: TurnSettings, options: ChatOptions
    ) -> None:
        self._llm = llm
        self._toolset = toolset
        self._send = send
        self._settings = settings
        self._options = options
        self._outcome = TurnOutcome()

    @property
    def outcome(self) -> TurnOutcome:
        """What happened so far (tool calls, LLM time), also after a failure."""
        return self._outcome

    async def run(self, messages: list[dict[str, Any]]) -> TurnOutcome:
        tools = self._toolset.llm_tools()
        # llm_tools() and specs() list the same entries in the same order.
        kinds = {t["function"]["name"]: s.source for t, s in zip(tools, self._toolset.specs())}
        texts: list[str] = []
        for round_no in range(self._settings.max_tool_rounds + 1):
            # The last round offers no tools, so a model stuck calling them must answer.
            offered = tools if tools and round_no < self._settings.max_tool_rounds else None
            text, calls = await self._complete(messages, offered)
            if text.strip():
                texts.append(text)
            if not calls or offered is None:
                break
            messages.append(assistant_tool_message(text, calls))
            records = await self._run_calls(calls, kinds)
            messages.extend(tool_message(call, record) for call, record in zip(calls, records))
        self._outcome.text = "\n".join(texts)
        return self._outcome

    # -- the model ----------------------------------------------------------------------------

    async def _complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[ToolCall]]:
        parts: list[str] = []
        calls: list[ToolCall] = []
        started = time.perf_counter()
        timeout = self._settings.llm_timeout
        stream = self._llm.stream(
            messages,
            tools=tools,
            model=self._settings.model,
            temperature=self._options.temperature,
            max_tokens=self._options.max_tokens,
        )
        try:
            async with asyncio.timeout(timeout), aclosing(stream):  # type: ignore[type-var]
                async for delta in stream:
                    if delta.text:
                        parts.append(delta.text)
                    if delta.tool_calls:
                        calls.extend(delta.tool_calls)
        except TimeoutError:
            raise _llm_timeout(timeout) from None
        except ProviderError as exc:
            if _caused_by_timeout(exc):
                raise _llm_timeout(timeout) from None
            raise GatewayError(ErrorCode.LLM_ERROR, "Failed to process request", str(exc)[:300]) from None
        finally:
            self._outcome.llm_ms += (time.perf_counter() - started) * 1000
            self._outcome.rounds += 1
        return "".join(parts), calls

    # -- tools ----------------------------------------------------------------------------------

    async def _run_calls(self, calls: list[ToolCall], kinds: dict[str, str]) -> list[ToolCallRecord]:
        """Server (and unknown) tools first, then client tools; results in the model's order."""
        server = [i for i, call in enumerate(calls) if kinds.get(call.name) != "client"]
        client = [i for i, call in enumerate(calls) if kinds.get(call.name) == "client"]
        records: dict[int, ToolCallRecord] = {}
        if server:
            done = await asyncio.gather(*(self._server_call(calls[i]) for i in server))
            records.update(zip(server, done))
        if client:
            await self._send(protocol.status_waiting_for_tools(len(client)))
            done = await asyncio.gather(*(self._client_call(calls[i]) for i in client))
            records.update(zip(client, done))
        ordered = [records[i] for i in range(len(calls))]
        self._outcome.tool_calls.extend(ordered)
        return ordered

    async def _server_call(self, call: ToolCall) -> ToolCallRecord:
        record = await self._toolset.call(call.name, call.arguments)
        if record.error != "unknown_tool":
            result = protocol.result_value(record.result) if record.success else record.result
            notice = protocol.tool_call(
                record.name, record.arguments, result, success=record.success, duration_ms=record.duration_ms
            )
            await self._send(notice)
        await self._report_failure(record, "")
        return record

    async def _client_call(self, call: ToolCall) -> ToolCallRecord:
        # Runs in its own task (gather), so this trace is private to this call.
        trace = CallTrace()
        CALL_TRACE.set(trace)
        record = await self._toolset.call(call.name, call.arguments)
        await self._report_failure(record, trace.call_id)
        return record

    async def _report_failure(self, record: ToolCallRecord, call_id: str) -> None:
        failure = tool_failure(record, call_id, self._settings.client_tool_timeout)
        if failure is not None:
            await self._send(protocol.error_from(failure))


def tool_failure(record: ToolCallRecord, call_id: str, client_timeout: float) -> GatewayError | None:
    """The error a failed tool call is reported with (seed §7.7, §11.5)."""
    if record.success:
        return None
    where = f"tool '{record.name}'" + (f", call_id {call_id}" if call_id else "")
    if record.error == "unknown_tool":
        return GatewayError(ErrorCode.TOOL_NOT_FOUND, "Tool not found", f"tool '{record.llm_name}'")
    if record.error in ("invalid_json", "invalid_arguments"):
        return GatewayError(ErrorCode.INVALID_TOOL_PARAMETERS, "Invalid tool arguments", f"{where}: {record.result}")
    if record.source == "client" and record.error == "timeout":
        return GatewayError(
            ErrorCode.TOOL_RESULT_TIMEOUT,
            "Tool execution timeout",
            f"{where}: no tool_result within {client_timeout:g} s",
        )
    return GatewayError(ErrorCode.TOOL_EXECUTION_FAILED, "Tool execution failed", f"{where}: {record.result}")


def tool_summary(record: ToolCallRecord) -> dict[str, Any]:
    """One entry of `llm_response.tool_calls`."""
    return {
        "tool_name": record.name,
        "source": record.source,
        "arguments": record.arguments,
        "success": record.success,
        "duration_ms": record.duration_ms,
    }


def _llm_timeout(timeout: float) -> GatewayError:
    return GatewayError(ErrorCode.TIMEOUT, "Request timed out", f"the LLM did not answer within {timeout:g} s")


def _caused_by_timeout(exc: BaseException) -> bool:
    """The provider wraps the SDK's timeout (openai.APITimeoutError, httpx.ReadTimeout)."""
    seen: BaseException | None = exc.__cause__ or exc.__context__
    for _ in range(8):  # chains can loop; a timeout is never buried deep
        if seen is None:
            return False
        if isinstance(seen, TimeoutError) or type(seen).__name__.endswith(("Timeout", "TimeoutError")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
