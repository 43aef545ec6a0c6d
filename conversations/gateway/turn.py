"""One gateway turn (seed §7.4–7.7) on the shared LLM ↔ tools loop (conversations/turns/).

What is the gateway's own: how a round's tool calls run and what the client hears of them.
Server tools run first (a `tool_call` notice each, seed §7.6), then client tools together
(`waiting_for_tools`, then one `tool_callback` each); every result goes back to the model. A
failed tool call is reported as an `error` *notice* (TOOL_NOT_FOUND, INVALID_TOOL_PARAMETERS,
TOOL_RESULT_TIMEOUT, TOOL_EXECUTION_FAILED) while the model still gets a result text, so the
turn goes on and ends with `llm_response`. Only the LLM failing ends a turn early
(GatewayError LLM_ERROR, or TIMEOUT after LLM_TIMEOUT per round or LLM_INTER_TOKEN_TIMEOUT of
silence between two tokens); an LLM provider that breaks its contract is a bug of ours and
surfaces as such (INTERNAL_ERROR).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from conversations.gateway import protocol
from conversations.gateway.client_tools import CALL_TRACE, CallTrace
from conversations.gateway.protocol import ErrorCode, GatewayError
from conversations.gateway.store import ChatOptions
from conversations.pipeline.fallback import AllProvidersFailed, ProviderBroke, ProviderChain, ProviderStalled
from conversations.providers.base import ProviderError, ToolCall
from conversations.turns.tool_loop import LLMOptions, Thought, ToolLoop
from tools.registry import ToolCallRecord, Toolset

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class TurnSettings:
    model: str
    llm_timeout: float
    max_tool_rounds: int
    client_tool_timeout: float
    llm_inter_token_timeout: float | None = None


class TurnRunner:
    """Runs the loop for one user message; `run` raises GatewayError only for LLM failures.
    `thought` tells what happened so far (tool calls, LLM time), also after a failure."""

    def __init__(
        self, *, llm: ProviderChain, toolset: Toolset, send: Send, settings: TurnSettings, options: ChatOptions
    ) -> None:
        self._llm = llm
        self._toolset = toolset
        self._send = send
        self._settings = settings
        self.thought = Thought()
        self._loop = ToolLoop(
            toolset=toolset,
            options=LLMOptions(settings.model, options.temperature, options.max_tokens),
            max_rounds=settings.max_tool_rounds,
            round_timeout=settings.llm_timeout,
            run_calls=self._run_calls,
            inter_token_timeout=settings.llm_inter_token_timeout,
        )
        # llm_tools() and specs() list the same entries in the same order.
        pairs = zip(toolset.llm_tools(), toolset.specs(), strict=True)
        self._kinds = {tool["function"]["name"]: spec.source for tool, spec in pairs}

    async def run(self, messages: list[dict[str, Any]]) -> Thought:
        try:
            await self._loop.run(self._llm, messages, self.thought)
        except TimeoutError:
            raise _llm_timeout(self._settings.llm_timeout) from None
        except ProviderStalled as exc:
            raise GatewayError(ErrorCode.TIMEOUT, "Request timed out", str(exc)[:300]) from None
        except ProviderError as exc:
            raise _llm_failure(exc, self._settings.llm_timeout) from None
        return self.thought

    # -- tools ----------------------------------------------------------------------------------

    async def _run_calls(self, calls: list[ToolCall]) -> list[ToolCallRecord]:
        """Server (and unknown) tools first, then client tools; results in the model's order."""
        server = [i for i, call in enumerate(calls) if self._kinds.get(call.name) != "client"]
        client = [i for i, call in enumerate(calls) if self._kinds.get(call.name) == "client"]
        records: dict[int, ToolCallRecord] = {}
        if server:
            done = await asyncio.gather(*(self._server_call(calls[i]) for i in server))
            records.update(zip(server, done, strict=True))
        if client:
            await self._send(protocol.status_waiting_for_tools(len(client)))
            done = await asyncio.gather(*(self._client_call(calls[i]) for i in client))
            records.update(zip(client, done, strict=True))
        return [records[i] for i in range(len(calls))]

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


def _llm_failure(exc: ProviderError, timeout: float) -> BaseException:
    """What the client hears when the chain gave up: LLM_ERROR with the last provider's
    reason, TIMEOUT when that reason was a timeout, and a provider's own bug re-raised as it
    was (the session answers INTERNAL_ERROR)."""
    reason: BaseException = exc.last if isinstance(exc, AllProvidersFailed) and exc.last is not None else exc
    if isinstance(reason, ProviderBroke) and reason.__cause__ is not None:
        return reason.__cause__
    if not isinstance(reason, ProviderError | TimeoutError):
        return reason
    if isinstance(reason, TimeoutError) or _caused_by_timeout(reason):
        return _llm_timeout(timeout)
    return GatewayError(ErrorCode.LLM_ERROR, "Failed to process request", str(reason)[:300])


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
