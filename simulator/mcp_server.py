"""A firmware-faithful device MCP server (the device side of docs/protocol-reference.md §5).

Mirrors main/mcp_server.cc / mcp_server.h of xiaozhi-esp32 2.4.2 byte for byte where it
matters to a backend: replies are built by string concatenation like the C++ code (error
texts are pasted in unescaped), `tools/list` pages are cut with the firmware's arithmetic
(`len(json) + len(tool_json) + 30 > 8000`), the cursor is a tool name and the next page starts
*at* it, string ids get no reply at all, errors carry no `code`, and every tool result is a
string (JSON results arrive double-encoded).

Tool handlers are plain Python callables (sync or async) so tests can script results:
return bool/int/str/dict/list/ImageResult, or raise to make the device answer with an error.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator import firmware_tools
from simulator.mcp_tools import (
    NO_DEFAULT,
    ImageResult,
    Property,
    Tool,
    ToolFailure,
    ToolHandler,
    ToolResult,
    compact_json,
    valueint,
)

__all__ = [
    "NO_DEFAULT", "DeviceMcpServer", "ImageResult", "Property", "Tool", "ToolFailure", "ToolHandler",
    "ToolResult", "compact_json",
]

MAX_PAGE_BYTES = 8000
# GetToolsList keeps this much head-room for `],"nextCursor":"…"}` when it checks a page.
PAGE_SLACK_BYTES = 30
MCP_PROTOCOL_VERSION = "2024-11-05"


@dataclass
class DeviceMcpServer:
    """The device's MCP server. `handle(payload)` returns the raw JSON-RPC reply text or None.

    `board_name`/`firmware_version` feed the initialize reply's serverInfo. `vision_url` and
    `vision_token` are stored from `initialize` like the camera does. `calls` records every
    executed tools/call as (name, arguments) for assertions.
    """

    board_name: str = "bread-compact-wifi"
    firmware_version: str = "2.4.2"
    tools: list[Tool] = field(default_factory=list)
    vision_url: str = ""
    vision_token: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Mutable device state the built-in tools read and write (volume, brightness, ...).
    state: dict[str, Any] = field(default_factory=dict)
    # Set by SimulatedDevice; used by self.reboot, self.get_system_info and the camera upload.
    on_reboot: Callable[[], object] | None = None  # its result is ignored
    device_id: str = ""
    client_id: str = ""
    system_info_json: str = "{}"
    camera_jpeg: bytes = b""  # what self.camera.take_photo "captures"

    # -- building the tool list -------------------------------------------------------------

    @classmethod
    def default(
        cls, *, board_name: str = "bread-compact-wifi", firmware_version: str = "2.4.2"
    ) -> DeviceMcpServer:
        """A server with the firmware's common tools, a board lamp and the user-only tools."""
        server = cls(board_name=board_name, firmware_version=firmware_version)
        firmware_tools.install(server)
        return server

    def add_tool(self, tool: Tool) -> Tool:
        """Append a tool; AI-visible tools go before the user-only block, like board tools."""
        if self.get_tool(tool.name) is not None:
            # McpServer::AddTool ignores duplicates (logs "Tool %s already added").
            return self.get_tool(tool.name)  # type: ignore[return-value]
        if tool.user_only:
            self.tools.append(tool)
        else:
            index = next((i for i, t in enumerate(self.tools) if t.user_only), len(self.tools))
            self.tools.insert(index, tool)
        return tool

    def get_tool(self, name: str) -> Tool | None:
        return next((tool for tool in self.tools if tool.name == name), None)

    def remove_tool(self, name: str) -> None:
        self.tools = [tool for tool in self.tools if tool.name != name]

    def set_handler(self, name: str, handler: ToolHandler) -> None:
        """Script a tool's result: `handler(arguments)` may return a value or raise."""
        tool = self.get_tool(name)
        if tool is None:
            raise KeyError(f"no tool named {name!r}")
        tool.handler = handler

    def set_result(self, name: str, result: ToolResult) -> None:
        """Shortcut: the tool always returns `result`."""
        self.set_handler(name, lambda _arguments: result)

    def set_error(self, name: str, message: str) -> None:
        """Shortcut: the tool always fails with `message` (a JSON-RPC error reply)."""

        def fail(_arguments: dict[str, Any]) -> ToolResult:
            raise ToolFailure(message)

        self.set_handler(name, fail)

    def with_extra_tools(self, count: int, description_bytes: int = 1500) -> DeviceMcpServer:
        """Add `count` board tools with long descriptions so tools/list spans several pages."""
        existing = sum(1 for tool in self.tools if tool.name.startswith("self.extra."))
        for tool in firmware_tools.extra_tools(count, description_bytes, start=existing + 1):
            self.add_tool(tool)
        return self

    # -- JSON-RPC dispatch (McpServer::ParseMessage) ----------------------------------------

    async def handle(self, payload: Any) -> str | None:
        """Process one request; return the reply payload text, or None where the device is silent."""
        if not isinstance(payload, dict):
            return None
        self.requests.append(payload)
        version = _get(payload, "jsonrpc")
        method = _get(payload, "method")
        if version != "2.0" or not isinstance(method, str):
            return None
        if method.startswith("notifications"):
            return None
        params = _get(payload, "params", _ABSENT)
        if params is not _ABSENT and not isinstance(params, dict):
            return None  # includes "params": null, which cJSON keeps as a non-object item
        raw_id = _get(payload, "id")
        if isinstance(raw_id, bool) or not isinstance(raw_id, int | float):
            return None  # string ids: logged, no reply at all
        request_id = valueint(raw_id)
        return await self._dispatch(request_id, method, params if isinstance(params, dict) else None)

    async def _dispatch(self, request_id: int, method: str, params: dict | None) -> str:
        if method == "initialize":
            return self._initialize(request_id, params)
        if method == "tools/list":
            cursor = _get(params or {}, "cursor")
            with_user = _get(params or {}, "withUserTools")
            return self.tools_list(
                request_id,
                cursor if isinstance(cursor, str) else "",
                with_user is True,
            )
        if method == "tools/call":
            return await self._tools_call(request_id, params)
        return reply_error(request_id, f"Method not implemented: {method}")

    def _initialize(self, request_id: int, params: dict | None) -> str:
        capabilities = _get(params or {}, "capabilities")
        vision = _get(capabilities, "vision") if isinstance(capabilities, dict) else None
        if isinstance(vision, dict) and isinstance(_get(vision, "url"), str):
            token = _get(vision, "token")
            self.vision_url = _get(vision, "url")
            self.vision_token = token if isinstance(token, str) else ""
        result = (
            '{"protocolVersion":"' + MCP_PROTOCOL_VERSION + '","capabilities":{"tools":{}},'
            '"serverInfo":{"name":"' + self.board_name + '","version":"'
            + self.firmware_version + '"}}'
        )
        return reply_result(request_id, result)

    def tools_list(self, request_id: int, cursor: str, with_user_tools: bool) -> str:
        """McpServer::GetToolsList, including its quirks (unknown cursor ⇒ size-limit error)."""
        page = '{"tools":['
        found_cursor = cursor == ""
        next_cursor = ""
        for tool in self.tools:
            if not found_cursor:
                if tool.name != cursor:
                    continue
                found_cursor = True
            if tool.user_only and not with_user_tools:
                continue
            tool_json = tool.to_json() + ","
            if _nbytes(page) + _nbytes(tool_json) + PAGE_SLACK_BYTES > MAX_PAGE_BYTES:
                next_cursor = tool.name
                break
            page += tool_json
        page = page.removesuffix(",")
        if page.endswith("[") and self.tools:
            return reply_error(
                request_id, f"Failed to add tool {next_cursor} because of payload size limit"
            )
        if next_cursor:
            return reply_result(request_id, page + '],"nextCursor":"' + next_cursor + '"}')
        return reply_result(request_id, page + "]}")

    async def _tools_call(self, request_id: int, params: dict | None) -> str:
        if not isinstance(params, dict):
            return reply_error(request_id, "Missing params")
        name = _get(params, "name")
        if not isinstance(name, str):
            return reply_error(request_id, "Missing name")
        arguments = _get(params, "arguments", _ABSENT)
        if arguments is not _ABSENT and not isinstance(arguments, dict):
            return reply_error(request_id, "Invalid arguments")
        tool = self.get_tool(name)
        if tool is None:
            return reply_error(request_id, f"Unknown tool: {name}")
        try:
            values = check_arguments(tool, arguments if isinstance(arguments, dict) else None)
        except ToolFailure as exc:
            return reply_error(request_id, str(exc))
        self.calls.append((name, values))
        return await self._run(request_id, tool, values)

    async def _run(self, request_id: int, tool: Tool, values: dict[str, Any]) -> str:
        """Execute the handler; any exception becomes an error reply (like the C++ catch)."""
        try:
            result = tool.handler(values) if tool.handler is not None else True
            if inspect.isawaitable(result):
                result = await result
            return reply_result(request_id, call_result(result))
        except Exception as exc:  # noqa: BLE001 - the firmware turns every exception into an error
            return reply_error(request_id, str(exc))


# -- helpers shared with tests ----------------------------------------------------------------


def check_arguments(tool: Tool, arguments: dict | None) -> dict[str, Any]:
    """DoToolCall's loop: type must match, ranges enforced, missing required ⇒ error."""
    values: dict[str, Any] = {}
    for prop in tool.properties:
        found, value = False, None
        if isinstance(arguments, dict) and _has(arguments, prop.name):
            found, value = prop.accept(_get(arguments, prop.name))
        if found:
            values[prop.name] = value
        elif prop.has_default:
            values[prop.name] = prop.default
        else:
            raise ToolFailure(f"Missing valid argument: {prop.name}")
    return values


def call_result(result: Any) -> str:
    """McpTool::Call: everything becomes one text (or image) content item, isError false."""
    if isinstance(result, ImageResult):
        content: dict[str, Any] = {"type": "image", "image": result.to_json()}
    else:
        content = {"type": "text", "text": result_text(result)}
    return compact_json({"content": [content], "isError": False})


def result_text(result: Any) -> str:
    if isinstance(result, bool):
        return "true" if result else "false"
    if isinstance(result, int):
        return str(result)
    if isinstance(result, str):
        return result
    if isinstance(result, dict | list):
        return compact_json(result)  # cJSON_PrintUnformatted: JSON results arrive double-encoded
    raise TypeError(f"unsupported tool result type {type(result).__name__}")


def reply_result(request_id: int, result_json: str) -> str:
    return '{"jsonrpc":"2.0","id":' + str(request_id) + ',"result":' + result_json + "}"


def reply_error(request_id: int, message: str) -> str:
    # Concatenated unescaped, exactly like McpServer::ReplyError: a quote in the text breaks JSON.
    return '{"jsonrpc":"2.0","id":' + str(request_id) + ',"error":{"message":"' + message + '"}}'


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


_ABSENT: Any = object()  # a key that is not there, as opposed to a JSON null


def _get(obj: dict, key: str, default: Any = None) -> Any:
    """cJSON_GetObjectItem is case-insensitive; the first matching key wins."""
    lowered = key.lower()
    return next((value for k, value in obj.items() if k.lower() == lowered), default)


def _has(obj: dict, key: str) -> bool:
    lowered = key.lower()
    return any(k.lower() == lowered for k in obj)
