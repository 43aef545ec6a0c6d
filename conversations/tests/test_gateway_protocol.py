"""The gateway wire format (seed 001 §3–5): table-driven, no server, no database."""
from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest

from conversations.gateway import protocol
from conversations.gateway.protocol import (
    CLIENT_MESSAGE_TYPES,
    Configure,
    EndSession,
    ErrorCode,
    GatewayError,
    Limits,
    Ping,
    RegisterTools,
    StartSession,
    TextInput,
    ToolDefinition,
    ToolResult,
)

ISO_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
SEED_SCHEMA = {
    "type": "object",
    "properties": {"info_type": {"type": "string", "enum": ["all", "battery", "system", "hardware"]}},
    "required": [],
}

VALID = [
    ({"type": "text_input", "text": "今天天气怎么样？"}, TextInput("今天天气怎么样？")),
    (
        {"type": "text_input", "text": "hi", "session_id": "abc", "timestamp": "2025-02-21T10:30:00.000Z"},
        TextInput("hi", "abc"),
    ),
    ({"type": "text_input", "text": "hi", "session_id": None}, TextInput("hi")),
    ({"type": "configure"}, Configure()),
    (
        {"type": "configure", "temperature": 0.7, "max_tokens": 2048, "enable_context": True},
        Configure(0.7, 2048, True),
    ),
    ({"type": "configure", "temperature": 0, "max_tokens": 1}, Configure(0.0, 1, None)),
    ({"type": "configure", "temperature": 1.0, "max_tokens": 512.0}, Configure(1.0, 512, None)),
    ({"type": "configure", "enable_context": False, "future_option": 3}, Configure(enable_context=False)),
    ({"type": "start_session"}, StartSession()),
    ({"type": "start_session", "session_id": "abc123"}, StartSession("abc123")),
    ({"type": "end_session"}, EndSession()),
    ({"type": "register_tools", "tools": []}, RegisterTools(())),
    ({"type": "register_tools", "tools": [{"name": "x"}]}, RegisterTools(({"name": "x"},))),
    (
        {"type": "tool_result", "call_id": "c1", "result": {"battery": 85}, "success": True, "error": None},
        ToolResult("c1", True, {"battery": 85}),
    ),
    (
        {"type": "tool_result", "call_id": "c1", "result": None, "success": False, "error": "设备连接超时"},
        ToolResult("c1", False, None, "设备连接超时"),
    ),
    ({"type": "tool_result", "call_id": "c1", "result": 3}, ToolResult("c1", True, 3)),
    ({"type": "tool_result", "call_id": "c1", "error": "boom"}, ToolResult("c1", False, None, "boom")),
    ({"type": "ping"}, Ping()),
]


def test_escaped_surrogate_pairs_are_ordinary_characters() -> None:
    text = '{"type": "text_input", "text": "\\ud83d\\ude00 hi"}'
    assert protocol.parse_client_message(text) == TextInput("\U0001f600 hi")


@pytest.mark.parametrize(("raw", "expected"), VALID, ids=[json.dumps(r)[:60] for r, _ in VALID])
def test_it_parses_every_valid_client_message(raw: dict[str, Any], expected: object) -> None:
    assert protocol.parse_client_message(json.dumps(raw, ensure_ascii=False)) == expected


def test_every_client_message_type_of_the_seed_is_known() -> None:
    seed = {"text_input", "configure", "start_session", "end_session", "register_tools", "tool_result", "ping"}
    assert set(CLIENT_MESSAGE_TYPES) == seed


INVALID = [
    ("{not json", ErrorCode.INVALID_MESSAGE, "Invalid JSON"),
    ("", ErrorCode.INVALID_MESSAGE, "Invalid JSON"),
    ("[1, 2]", ErrorCode.INVALID_MESSAGE, "Message must be a JSON object"),
    ('"text_input"', ErrorCode.INVALID_MESSAGE, "Message must be a JSON object"),
    ("{}", ErrorCode.INVALID_MESSAGE, "Missing required field: type"),
    ('{"type": 3}', ErrorCode.INVALID_MESSAGE, "Field 'type' must be a string"),
    ('{"type": "dance"}', ErrorCode.UNKNOWN_MESSAGE_TYPE, "Unknown message type"),
    ('{"type": "llm_response"}', ErrorCode.UNKNOWN_MESSAGE_TYPE, "Unknown message type"),
    ('{"type": "text_input"}', ErrorCode.INVALID_MESSAGE, "Missing required field: text"),
    ('{"type": "text_input", "text": ""}', ErrorCode.INVALID_MESSAGE, "Text cannot be empty"),
    ('{"type": "text_input", "text": "  \\n"}', ErrorCode.INVALID_MESSAGE, "Text cannot be empty"),
    ('{"type": "text_input", "text": 5}', ErrorCode.INVALID_MESSAGE, "Field 'text' must be a string"),
    ('{"type": "text_input", "text": "hi", "session_id": 5}', ErrorCode.INVALID_MESSAGE,
     "Field 'session_id' must be a string"),
    ('{"type": "configure", "temperature": 1.5}', ErrorCode.INVALID_MESSAGE, "Field 'temperature' is out of range"),
    ('{"type": "configure", "temperature": -0.1}', ErrorCode.INVALID_MESSAGE, "Field 'temperature' is out of range"),
    ('{"type": "configure", "temperature": "hot"}', ErrorCode.INVALID_MESSAGE, "Field 'temperature' must be a number"),
    ('{"type": "configure", "temperature": true}', ErrorCode.INVALID_MESSAGE, "Field 'temperature' must be a number"),
    ('{"type": "configure", "temperature": NaN}', ErrorCode.INVALID_MESSAGE, "Field 'temperature' must be a number"),
    ('{"type": "configure", "max_tokens": 0}', ErrorCode.INVALID_MESSAGE, "Field 'max_tokens' is out of range"),
    ('{"type": "configure", "max_tokens": 2049}', ErrorCode.INVALID_MESSAGE, "Field 'max_tokens' is out of range"),
    ('{"type": "configure", "max_tokens": 10.5}', ErrorCode.INVALID_MESSAGE, "Field 'max_tokens' must be an integer"),
    ('{"type": "configure", "max_tokens": "100"}', ErrorCode.INVALID_MESSAGE, "Field 'max_tokens' must be an integer"),
    ('{"type": "configure", "enable_context": "yes"}', ErrorCode.INVALID_MESSAGE,
     "Field 'enable_context' must be a boolean"),
    ('{"type": "start_session", "session_id": 12}', ErrorCode.INVALID_MESSAGE, "Field 'session_id' must be a string"),
    ('{"type": "register_tools"}', ErrorCode.INVALID_MESSAGE, "Missing required field: tools"),
    ('{"type": "register_tools", "tools": {}}', ErrorCode.INVALID_MESSAGE, "Field 'tools' must be an array"),
    ('{"type": "tool_result", "result": 1}', ErrorCode.INVALID_MESSAGE, "Missing required field: call_id"),
    ('{"type": "tool_result", "call_id": 7}', ErrorCode.INVALID_MESSAGE, "Field 'call_id' must be a string"),
    ('{"type": "tool_result", "call_id": "c", "success": "yes"}', ErrorCode.INVALID_MESSAGE,
     "Field 'success' must be a boolean"),
    ('{"type": "ping", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", ErrorCode.INVALID_MESSAGE, "Invalid JSON"),
    ('{"type": "text_input", "text": "a\\ud800b"}', ErrorCode.INVALID_MESSAGE, "Invalid JSON"),
    ('{"type": "tool_result", "call_id": "c", "result": {"k": "\\uDFFF"}}', ErrorCode.INVALID_MESSAGE, "Invalid JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "code", "message"), INVALID, ids=[t[:50] for t, _, _ in INVALID])
def test_it_refuses_invalid_client_messages_with_the_seed_code(text: str, code: ErrorCode, message: str) -> None:
    with pytest.raises(GatewayError) as caught:
        protocol.parse_client_message(text)
    assert (caught.value.code, caught.value.message) == (code, message)


def test_max_tokens_ceiling_follows_the_configured_limit() -> None:
    text = '{"type": "configure", "max_tokens": 4096}'
    assert protocol.parse_client_message(text, Limits(max_tokens=4096)) == Configure(max_tokens=4096)
    with pytest.raises(GatewayError):
        protocol.parse_client_message(text)


# -- tool definitions (seed §4.6) -------------------------------------------------------------------

GOOD_TOOLS = [
    {"name": "get_device_info", "description": "获取设备信息", "parameters": SEED_SCHEMA},
    {"name": "device.light.turn_on", "description": "", "parameters": {"type": "object", "properties": {}}},
    {"name": "_private", "description": "d", "parameters": {"type": "object"}},
    {"name": "sensor.temperature.read", "description": "d", "parameters": {"properties": {"x": {"type": "number"}}}},
    {"name": "a" * 64, "description": "d", "parameters": {"type": "object"}},
]


@pytest.mark.parametrize("raw", GOOD_TOOLS, ids=[t["name"][:30] for t in GOOD_TOOLS])
def test_it_accepts_tools_following_the_naming_rules(raw: dict[str, Any]) -> None:
    assert protocol.check_tool_definition(raw) == ToolDefinition(raw["name"], raw["description"], raw["parameters"])


BAD_TOOLS = [
    ({"name": "1tool", "description": "d", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "tool.", "description": "d", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "tool..name", "description": "d", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "a" * 65, "description": "d", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "", "description": "d", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "bad-dash", "description": "d", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "电量", "description": "d", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"description": "d", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "ok", "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "ok", "description": 3, "parameters": {}}, ErrorCode.TOOL_REGISTRATION_FAILED),
    ("get_battery", ErrorCode.TOOL_REGISTRATION_FAILED),
    ({"name": "ok", "description": "d"}, ErrorCode.INVALID_TOOL_PARAMETERS),
    ({"name": "ok", "description": "d", "parameters": []}, ErrorCode.INVALID_TOOL_PARAMETERS),
    ({"name": "ok", "description": "d", "parameters": {"type": "string"}}, ErrorCode.INVALID_TOOL_PARAMETERS),
    ({"name": "ok", "description": "d", "parameters": {"type": "object", "properties": []}},
     ErrorCode.INVALID_TOOL_PARAMETERS),
    ({"name": "ok", "description": "d", "parameters": {"type": "object", "required": "x"}},
     ErrorCode.INVALID_TOOL_PARAMETERS),
    ({"name": "ok", "description": "d", "parameters": {"type": "object", "properties": {"v": {"type": "integr"}}}},
     ErrorCode.INVALID_TOOL_PARAMETERS),
    ({"name": "ok", "description": "d",
      "parameters": json.loads('{"type": "object", "not": ' * 400 + "{}" + "}" * 400)},
     ErrorCode.INVALID_TOOL_PARAMETERS),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "code"), BAD_TOOLS, ids=[json.dumps(r, ensure_ascii=False)[:50] for r, _ in BAD_TOOLS])
def test_it_refuses_bad_tool_definitions(raw: object, code: ErrorCode) -> None:
    with pytest.raises(GatewayError) as caught:
        protocol.check_tool_definition(raw)
    assert caught.value.code == code


# -- server messages (seed §5) ----------------------------------------------------------------------


def test_timestamps_are_iso_8601_utc_with_milliseconds_and_z() -> None:
    moment = dt.datetime(2025, 2, 21, 18, 30, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=8)))
    assert protocol.timestamp(moment) == "2025-02-21T10:30:00.123Z"
    assert ISO_MS_Z.match(protocol.timestamp())


SERVER = [
    (protocol.status_connected("abc"), {"type": "status", "status": "connected", "data": {"session_id": "abc"}}),
    (
        protocol.status_connected("abc", resumed=True),
        {"type": "status", "status": "connected", "data": {"session_id": "abc", "resumed": True}},
    ),
    (
        protocol.status_processing(),
        {"type": "status", "status": "processing", "data": {"message": "正在处理您的请求..."}},
    ),
    (
        protocol.status_waiting_for_tools(2),
        {"type": "status", "status": "waiting_for_tools", "data": {"pending_tools": 2}},
    ),
    (protocol.status_idle("abc"), {"type": "status", "status": "idle", "data": {"session_id": "abc"}}),
    (
        protocol.llm_response("今天天气晴朗。", []),
        {"type": "llm_response", "content": "今天天气晴朗。", "tool_calls": [], "is_final": True},
    ),
    (
        protocol.tool_call("get_weather", {"city": "北京"}, {"temperature": 22}, success=True, duration_ms=125.54),
        {"type": "tool_call", "tool_name": "get_weather", "arguments": {"city": "北京"},
         "result": {"temperature": 22}, "success": True, "duration_ms": 125.5},
    ),
    (
        protocol.tool_callback("uuid", "get_device_info", {"info_type": "battery"}),
        {"type": "tool_callback", "call_id": "uuid", "tool_name": "get_device_info",
         "arguments": {"info_type": "battery"}},
    ),
    (
        protocol.tools_registered([
            {"name": "get_device_info", "status": "registered"},
            {"name": "control_device", "status": "failed", "error": "Tool name already exists"},
        ]),
        {"type": "tools_registered", "count": 1, "tools": [
            {"name": "get_device_info", "status": "registered"},
            {"name": "control_device", "status": "failed", "error": "Tool name already exists"},
        ]},
    ),
    (
        protocol.error(ErrorCode.LLM_ERROR, "Failed to process request", "Connection timeout"),
        {"type": "error", "code": "LLM_ERROR", "message": "Failed to process request", "details": "Connection timeout"},
    ),
    (protocol.pong(), {"type": "pong"}),
]  # fmt: skip


@pytest.mark.parametrize(("built", "expected"), SERVER, ids=[f"{b['type']}-{i}" for i, (b, _) in enumerate(SERVER)])
def test_server_messages_have_the_seed_shapes(built: dict[str, Any], expected: dict[str, Any]) -> None:
    stamp = built.pop("timestamp")
    assert ISO_MS_Z.match(stamp)
    assert built == expected


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_seed_error_code_builds_an_error_message(code: ErrorCode) -> None:
    message = json.loads(protocol.encode(protocol.error(code, "m", "d")))
    assert message["type"] == "error" and message["code"] == code.value


def test_the_error_table_is_exactly_the_seeds() -> None:
    assert {c.value for c in ErrorCode} == {
        "INVALID_MESSAGE", "UNKNOWN_MESSAGE_TYPE", "LLM_ERROR", "SESSION_ERROR", "TIMEOUT",
        "INTERNAL_ERROR", "TOOL_NOT_FOUND", "TOOL_EXECUTION_FAILED", "INVALID_TOOL_PARAMETERS",
        "TOOL_RESULT_TIMEOUT", "TOOL_REGISTRATION_FAILED",
    }  # fmt: skip


def test_encoding_is_compact_and_keeps_chinese_readable() -> None:
    assert protocol.encode({"type": "pong", "x": "好"}) == '{"type":"pong","x":"好"}'


def test_encoding_escapes_lone_surrogates_instead_of_failing_on_the_socket() -> None:
    text = protocol.encode({"content": "好\ud800"})
    text.encode("utf-8")
    assert json.loads(text) == {"content": "好\ud800"}


@pytest.mark.parametrize(("text", "value"), [('{"a": 1}', {"a": 1}), ("plain words", "plain words"), ("3", 3)])
def test_tool_results_are_shown_as_json_when_they_are_json(text: str, value: object) -> None:
    assert protocol.result_value(text) == value
