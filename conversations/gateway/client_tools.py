"""Tools a gateway client registered (seed §4.6, §4.7, §5.4): a ToolSource that calls back.

`ClientToolSource.call` sends `tool_callback` with a fresh call_id and waits for the
matching `tool_result`; the Toolset around it enforces CLIENT_TOOL_TIMEOUT. Because
`Toolset.call` never raises, the session learns *why* a client call failed from the
ToolCallRecord's error code ("timeout" vs "tool_error") and which call_id it was from a
`CallTrace` the session puts in a context variable for the duration of the call: each call
runs in its own task, so concurrent calls never see each other's trace.
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from conversations.gateway import protocol
from conversations.gateway.protocol import ErrorCode, GatewayError, ToolDefinition, ToolResult
from tools import limits as tool_limits
from tools.errors import ToolError
from tools.limits import ToolLimits
from tools.registry import ToolSpec
from tools.schemas import in_schema_thread

log = logging.getLogger(__name__)

_REMEMBERED = 256  # finished call ids kept to tell "expired" from "unknown"

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class CallTrace:
    """Filled in by ClientToolSource.call for the session that set it."""

    call_id: str = ""


CALL_TRACE: ContextVar[CallTrace | None] = ContextVar("gateway_call_trace", default=None)


@dataclass(frozen=True)
class Registration:
    """The `tools` entries of `tools_registered`, and one error per failed tool."""

    results: list[dict[str, Any]]
    errors: list[GatewayError]


class ClientToolSource:
    """One connection's client tools; dropped with the connection (seed §7.3)."""

    kind = "client"
    origin = ""

    def __init__(
        self, send: Send, *, timeout: float, max_tools: int, enabled: bool = True, limits: ToolLimits | None = None
    ) -> None:
        self.timeout = timeout
        self.max_tools = max_tools
        self.enabled = enabled
        self._limits = limits or tool_limits.current()
        self._send = send
        self._tools: dict[str, ToolDefinition] = {}
        self._pending: dict[str, asyncio.Future[ToolResult]] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()  # call_id -> "answered" | "expired"

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- registration -------------------------------------------------------------------------

    async def register(self, raw_tools: tuple[Any, ...]) -> Registration:
        """Check and add a `register_tools` message's tools, in order.

        A message listing more tools than a connection may hold is refused whole, before any
        schema is looked at (one client must not keep the server compiling thousands of
        schemas); the others' definitions are checked in the schema thread, off the loop.
        """
        if len(raw_tools) > self.max_tools:
            details = f"{len(raw_tools)} tools; at most {self.max_tools} per connection"
            return Registration([], [GatewayError(ErrorCode.TOOL_REGISTRATION_FAILED, "Too many tools", details)])
        checked = await in_schema_thread(_check_all, raw_tools, self._limits) if self.enabled else raw_tools
        results: list[dict[str, Any]] = []
        errors: list[GatewayError] = []
        for raw, outcome in zip(raw_tools, checked, strict=True):
            name = protocol.tool_name_of(raw)
            try:
                definition = self._accept(outcome)
            except GatewayError as exc:
                results.append({"name": name, "status": "failed", "error": exc.message, "code": str(exc.code)})
                errors.append(GatewayError(exc.code, exc.message, _details(name, exc.details)))
                continue
            self._tools[definition.name] = definition
            results.append({"name": definition.name, "status": "registered"})
        return Registration(results, errors)

    def _accept(self, checked: object) -> ToolDefinition:
        if not self.enabled:
            raise GatewayError(ErrorCode.TOOL_REGISTRATION_FAILED, "Client tools are disabled")
        if isinstance(checked, GatewayError):
            raise checked
        assert isinstance(checked, ToolDefinition)
        if checked.name in self._tools:
            raise GatewayError(ErrorCode.TOOL_REGISTRATION_FAILED, "Tool name already exists")
        if len(self._tools) >= self.max_tools:
            raise GatewayError(
                ErrorCode.TOOL_REGISTRATION_FAILED, f"Too many tools (at most {self.max_tools} per connection)"
            )
        return checked

    # -- ToolSource -----------------------------------------------------------------------------

    async def list_tools(self) -> list[ToolSpec]:
        return [ToolSpec(t.name, t.description, t.parameters, "client") for t in self._tools.values()]

    async def call(self, name: str, arguments: dict) -> str:
        call_id = uuid.uuid4().hex
        trace = CALL_TRACE.get()
        if trace is not None:
            trace.call_id = call_id
        future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            await self._send(protocol.tool_callback(call_id, name, arguments))
            result = await future
        finally:
            # Timeout, cancelled turn or answer: either way this call_id is finished now.
            self._pending.pop(call_id, None)
            self._remember(call_id, "answered" if future.done() and not future.cancelled() else "expired")
        if not result.success:
            raise ToolError(result.error or f"the client tool '{name}' failed")
        if isinstance(result.result, str):
            return result.result
        return json.dumps(result.result, ensure_ascii=False, default=str)

    def resolve(self, result: ToolResult) -> None:
        """Hand a `tool_result` to its waiting call; GatewayError(INVALID_MESSAGE) otherwise."""
        future = self._pending.get(result.call_id)
        if future is None or future.done():
            raise self._no_such_call(result.call_id)
        future.set_result(result)

    def _no_such_call(self, call_id: str) -> GatewayError:
        state = self._finished.get(call_id)
        if state == "expired":
            message = "call_id has expired"
        elif state == "answered":
            message = "call_id was already answered"
        else:
            message = "Unknown call_id"
        return GatewayError(ErrorCode.INVALID_MESSAGE, message, f"call_id {call_id[:64]}")

    def _remember(self, call_id: str, state: str) -> None:
        self._finished[call_id] = state
        while len(self._finished) > _REMEMBERED:
            self._finished.popitem(last=False)

    def close(self) -> None:
        """The connection closed: forget the tools and fail whatever still waits."""
        self._tools.clear()
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()


def _check_all(raw_tools: tuple[Any, ...], limits: ToolLimits) -> list[ToolDefinition | GatewayError]:
    """Every definition checked (blocking: schemas are compiled), in the schema thread."""
    return [_check_one(raw, limits) for raw in raw_tools]


def _check_one(raw: object, limits: ToolLimits) -> ToolDefinition | GatewayError:
    try:
        definition = protocol.check_tool_definition(raw, limits)
    except GatewayError as exc:
        return exc
    if len(definition.description) > limits.description_max_chars:
        details = f"{len(definition.description)} characters; the limit is {limits.description_max_chars}"
        return GatewayError(ErrorCode.TOOL_REGISTRATION_FAILED, "Tool description is too long", details)
    return definition


def _details(name: str, details: str) -> str:
    label = f"tool '{name[:64]}'" if name else "tool"
    return f"{label}: {details}" if details else label
