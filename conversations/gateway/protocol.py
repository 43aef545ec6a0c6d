"""The LLM Gateway wire protocol (seed 001): client messages in, server messages out.

Pure and total: `parse_client_message` turns any text into one typed message or raises
`GatewayError(code, message, details)`, which the session sends back as an `error` message.
The builders return the exact dict shapes of seed §5, each with an ISO 8601 UTC timestamp
with milliseconds and "Z" ("2025-02-21T10:30:00.000Z"). No Django, no I/O.
"""
from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from enum import StrEnum
from collections.abc import Callable
from typing import Any

from tools import limits as tool_limits
from tools.errors import SchemaRefused
from tools.limits import ToolLimits
from tools.naming import validate_client_tool_name
from tools.registry import llm_parameters
from tools.schemas import compile_schema


class ErrorCode(StrEnum):
    """Every error code of seed §5.4, with its HTTP equivalent in the comment."""

    INVALID_MESSAGE = "INVALID_MESSAGE"  # 400
    UNKNOWN_MESSAGE_TYPE = "UNKNOWN_MESSAGE_TYPE"  # 400
    LLM_ERROR = "LLM_ERROR"  # 500
    SESSION_ERROR = "SESSION_ERROR"  # 500
    TIMEOUT = "TIMEOUT"  # 504
    INTERNAL_ERROR = "INTERNAL_ERROR"  # 500
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"  # 404
    TOOL_EXECUTION_FAILED = "TOOL_EXECUTION_FAILED"  # 500
    INVALID_TOOL_PARAMETERS = "INVALID_TOOL_PARAMETERS"  # 400
    TOOL_RESULT_TIMEOUT = "TOOL_RESULT_TIMEOUT"  # 504
    TOOL_REGISTRATION_FAILED = "TOOL_REGISTRATION_FAILED"  # 400


class GatewayError(Exception):
    """A problem the client must hear about, as an `error` message."""

    def __init__(self, code: ErrorCode, message: str, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


@dataclass(frozen=True)
class Limits:
    """Bounds of `configure` (seed §4.2, §12.3); max_tokens' ceiling is LLM_MAX_TOKENS."""

    min_temperature: float = 0.0
    max_temperature: float = 1.0
    max_tokens: int = 2048


# -- client messages ------------------------------------------------------------------------


@dataclass(frozen=True)
class TextInput:
    text: str
    session_id: str | None = None


@dataclass(frozen=True)
class Configure:
    """Only the fields the client sent are set; None means "leave as is"."""

    temperature: float | None = None
    max_tokens: int | None = None
    enable_context: bool | None = None


@dataclass(frozen=True)
class StartSession:
    session_id: str | None = None


@dataclass(frozen=True)
class EndSession:
    pass


@dataclass(frozen=True)
class RegisterTools:
    tools: tuple[Any, ...]  # raw definitions; checked one by one with `check_tool_definition`


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    success: bool
    result: Any = None
    error: str | None = None


@dataclass(frozen=True)
class Ping:
    pass


ClientMessage = TextInput | Configure | StartSession | EndSession | RegisterTools | ToolResult | Ping


def parse_client_message(text: str, limits: Limits | None = None) -> ClientMessage:
    """Decode one client frame; raises GatewayError (and only that) for anything wrong."""
    data = _decode_object(text)
    kind = data.get("type")
    if kind is None:
        raise _invalid("Missing required field: type")
    if not isinstance(kind, str):
        raise _invalid("Field 'type' must be a string")
    parser = _PARSERS.get(kind)
    if parser is None:
        raise GatewayError(
            ErrorCode.UNKNOWN_MESSAGE_TYPE, "Unknown message type", f"type '{kind[:64]}' is not supported"
        )
    return parser(data, limits or Limits())


def _decode_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _invalid("Invalid JSON", str(exc)) from None
    except RecursionError:
        raise _invalid("Invalid JSON", "nested too deeply") from None
    if not isinstance(data, dict):
        raise _invalid("Message must be a JSON object")
    if ("\\ud" in text or "\\uD" in text) and not _encodable(data):
        # A lone surrogate escape ("\\ud800") decodes to a str that cannot be UTF-8
        # encoded; it would crash the LLM request far from here.
        raise _invalid("Invalid JSON", "lone surrogate in a string")
    return data


def _encodable(data: object) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _invalid(message: str, details: str = "") -> GatewayError:
    return GatewayError(ErrorCode.INVALID_MESSAGE, message, details)


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _invalid(f"Field '{key}' must be a string")
    return value


def _text_input(data: dict[str, Any], limits: Limits) -> TextInput:
    text = data.get("text")
    if text is None:
        raise _invalid("Missing required field: text")
    if not isinstance(text, str):
        raise _invalid("Field 'text' must be a string")
    if not text.strip():
        raise _invalid("Text cannot be empty")
    return TextInput(text=text, session_id=_optional_str(data, "session_id"))


def _configure(data: dict[str, Any], limits: Limits) -> Configure:
    # Unknown keys are ignored so that newer clients keep working against this server.
    return Configure(
        temperature=_temperature(data.get("temperature"), limits),
        max_tokens=_max_tokens(data.get("max_tokens"), limits),
        enable_context=_enable_context(data.get("enable_context")),
    )


def _temperature(value: object, limits: Limits) -> float | None:
    if value is None:
        return None
    # bool is an int subclass; `true` is not a temperature.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _invalid("Field 'temperature' must be a number")
    if not limits.min_temperature <= value <= limits.max_temperature:
        raise _invalid(
            "Field 'temperature' is out of range",
            f"temperature must be between {limits.min_temperature:g} and {limits.max_temperature:g}",
        )
    return float(value)


def _max_tokens(value: object, limits: Limits) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 2048.0 from a JavaScript client
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid("Field 'max_tokens' must be an integer")
    if not 1 <= value <= limits.max_tokens:
        raise _invalid(
            "Field 'max_tokens' is out of range", f"max_tokens must be between 1 and {limits.max_tokens}"
        )
    return value


def _enable_context(value: object) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _invalid("Field 'enable_context' must be a boolean")
    return value


def _start_session(data: dict[str, Any], limits: Limits) -> StartSession:
    return StartSession(session_id=_optional_str(data, "session_id"))


def _end_session(data: dict[str, Any], limits: Limits) -> EndSession:
    return EndSession()


def _register_tools(data: dict[str, Any], limits: Limits) -> RegisterTools:
    tools = data.get("tools")
    if tools is None:
        raise _invalid("Missing required field: tools")
    if not isinstance(tools, list):
        raise _invalid("Field 'tools' must be an array")
    return RegisterTools(tools=tuple(tools))


def _tool_result(data: dict[str, Any], limits: Limits) -> ToolResult:
    call_id = data.get("call_id")
    if call_id is None or call_id == "":
        raise _invalid("Missing required field: call_id")
    if not isinstance(call_id, str):
        raise _invalid("Field 'call_id' must be a string")
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        error = json.dumps(error, ensure_ascii=False)
    success = data.get("success")
    if success is None:
        # Seed §4.7 makes `success` required, but §3.1 lists only call_id and result: accept
        # its absence and read it from whether an error was reported.
        success = error is None
    if not isinstance(success, bool):
        raise _invalid("Field 'success' must be a boolean")
    return ToolResult(call_id=call_id, success=success, result=data.get("result"), error=error)


def _ping(data: dict[str, Any], limits: Limits) -> Ping:
    return Ping()


_PARSERS: dict[str, Callable[[dict[str, Any], Limits], ClientMessage]] = {
    "text_input": _text_input,
    "configure": _configure,
    "start_session": _start_session,
    "end_session": _end_session,
    "register_tools": _register_tools,
    "tool_result": _tool_result,
    "ping": _ping,
}
CLIENT_MESSAGE_TYPES = tuple(_PARSERS)


# -- client tool definitions (seed §4.6) -----------------------------------------------------


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    description: str
    parameters: dict[str, Any]


def tool_name_of(raw: object) -> str:
    """The name to report back for a definition, even a broken one."""
    name = raw.get("name") if isinstance(raw, dict) else None
    return name if isinstance(name, str) else ""


def check_tool_definition(raw: object, limits: ToolLimits | None = None) -> ToolDefinition:
    """Validate one client tool; GatewayError with TOOL_REGISTRATION_FAILED (name, shape)
    or INVALID_TOOL_PARAMETERS (the parameters are not an object JSON Schema we accept).
    Blocking for a big schema: the session calls it in the schema thread."""
    if not isinstance(raw, dict):
        raise _registration("Tool definition must be an object")
    name = raw.get("name")
    problem = validate_client_tool_name(name)
    if problem is not None:
        raise _registration(f"Invalid tool name: {problem}")
    assert isinstance(name, str)  # validate_client_tool_name checked it
    description = raw.get("description")
    if not isinstance(description, str):
        raise _registration("Tool description is required and must be a string")
    return ToolDefinition(name, description, check_parameters(raw.get("parameters"), limits))


def check_parameters(schema: object, limits: ToolLimits | None = None) -> dict[str, Any]:
    """tools.schemas decides (local references only, RE2 patterns, size and depth caps)."""
    if not isinstance(schema, dict):
        raise GatewayError(ErrorCode.INVALID_TOOL_PARAMETERS, "Tool parameters must be a JSON Schema object")
    if schema.get("type", "object") != "object":
        raise GatewayError(ErrorCode.INVALID_TOOL_PARAMETERS, "Tool parameters must have type 'object'")
    limits = limits or tool_limits.current()
    try:
        # As the Toolset will offer it, so its compiled validator is reused from the cache.
        compile_schema(llm_parameters(schema), max_bytes=limits.schema_max_bytes, max_depth=limits.schema_max_depth)
    except SchemaRefused as exc:
        raise GatewayError(ErrorCode.INVALID_TOOL_PARAMETERS, exc.message, exc.details) from None
    return schema


def _registration(message: str) -> GatewayError:
    return GatewayError(ErrorCode.TOOL_REGISTRATION_FAILED, message)


# -- close codes ----------------------------------------------------------------------------

CLOSE_IDLE = 1001  # no client message for CLOUD_PING_TIMEOUT seconds
CLOSE_TOO_BIG = 1009  # RFC 6455 "message too big", after an INVALID_MESSAGE error
CLOSE_TAKEN_OVER = 4000  # another connection resumed this connection's session


# -- server messages ----------------------------------------------------------------------------


def timestamp(now: dt.datetime | None = None) -> str:
    """ISO 8601 UTC with milliseconds and "Z", as in every seed example."""
    moment = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _message(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields, "timestamp": timestamp()}


def status(state: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    return _message("status", status=state, data=data or {})


def status_connected(session_id: str, *, resumed: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {"session_id": session_id}
    if resumed:
        data["resumed"] = True
    return status("connected", data)


def status_processing() -> dict[str, Any]:
    return status("processing", {"message": "正在处理您的请求..."})


def status_waiting_for_tools(pending_tools: int) -> dict[str, Any]:
    return status("waiting_for_tools", {"pending_tools": pending_tools})


def status_idle(session_id: str, **extra: Any) -> dict[str, Any]:
    return status("idle", {"session_id": session_id, **extra})


def llm_response(content: str, tool_calls: list[dict[str, Any]], *, is_final: bool = True) -> dict[str, Any]:
    return _message("llm_response", content=content, tool_calls=tool_calls, is_final=is_final)


def tool_call(
    tool_name: str, arguments: dict[str, Any], result: Any, *, success: bool, duration_ms: float
) -> dict[str, Any]:
    return _message(
        "tool_call",
        tool_name=tool_name,
        arguments=arguments,
        result=result,
        success=success,
        duration_ms=round(duration_ms, 1),
    )


def tool_callback(call_id: str, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return _message("tool_callback", call_id=call_id, tool_name=tool_name, arguments=arguments)


def tools_registered(results: list[dict[str, Any]]) -> dict[str, Any]:
    """`results`: [{"name", "status": "registered"|"failed", "error"?, "code"?}]."""
    count = sum(1 for r in results if r.get("status") == "registered")
    return _message("tools_registered", count=count, tools=results)


def error(code: ErrorCode, message: str, details: str = "") -> dict[str, Any]:
    return _message("error", code=str(code), message=message, details=details)


def error_from(exc: GatewayError) -> dict[str, Any]:
    return error(exc.code, exc.message, exc.details)


def pong() -> dict[str, Any]:
    return _message("pong")


def encode(message: dict[str, Any]) -> str:
    """Compact JSON; Chinese stays readable (the seed's clients print it).

    Falls back to ASCII escapes when a string (say, from a model) holds a lone surrogate,
    which the socket could not send as UTF-8.
    """
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=str)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":"), default=str)
    return text


def result_value(text: str) -> Any:
    """A tool's text result as JSON data when it is JSON (for `tool_call.result`)."""
    try:
        return json.loads(text)
    except ValueError:
        return text
