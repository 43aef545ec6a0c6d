"""JSON-RPC client for the MCP server that runs inside the device.

The device speaks MCP over the same WebSocket as audio, wrapped in `{"type":"mcp",
"payload":...}` (the session does the wrapping; this module sees bare JSON-RPC payloads).
Firmware facts this client is built around (protocol-reference §5, gotchas 18–21):

- ids must be JSON numbers: a string id gets no reply at all. One increasing integer
  counter serves every request, so initialize, list and call ids never collide.
- `tools/list` must wait for the initialize *result*; pages are cut at 8000 bytes and
  `nextCursor` is the name of the first tool of the next page (inclusive).
  `withUserTools` must be identical on every page or the pages do not line up.
- errors are `{"message": ...}` without a code; results are strings, JSON results arrive
  as JSON text (sometimes encoded twice), images as a JSON string under `image`.
- the device never sends requests or notifications; anything like that is ignored.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tools import limits as tool_limits
from tools.errors import ToolError
from tools.limits import ToolLimits
from tools.mcp.content import decoded_size
from tools.registry import ToolSpec, empty_schema

logger = logging.getLogger(__name__)

SendFn = Callable[[dict], Awaitable[None]]

PROTOCOL_VERSION = "2024-11-05"
CLIENT_INFO = {"name": "xiaozhi-django", "version": "1.0"}
DISCONNECTED = "device disconnected"


class DeviceMcpClient:
    """Talks MCP to one connected device; futures keyed by request id, each with a timeout.

    `send(payload)` delivers a JSON-RPC payload to the device; the session feeds every
    incoming MCP payload to `feed()` and calls `close()` when the socket goes away.
    """

    def __init__(self, send: SendFn, *, request_timeout: float = 10.0, limits: ToolLimits | None = None) -> None:
        self._send = send
        self._request_timeout = request_timeout
        self._limits = limits or tool_limits.current()
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[dict]] = {}
        self._init_done = asyncio.Event()
        self._init_error: str | None = None
        self._init_started = False
        self._closed = False
        self.server_info: dict[str, Any] = {}
        self.tools: list[ToolSpec] | None = None  # last complete listing

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def initialized(self) -> bool:
        return self._init_done.is_set() and self._init_error is None

    # -- requests --------------------------------------------------------------------------

    async def initialize(self, vision_url: str, vision_token: str) -> dict:
        """Send `initialize` (which also tells the camera where to upload photos)."""
        self._init_started = True
        self._init_error = None
        self._init_done.clear()
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"vision": {"url": vision_url, "token": vision_token}},
            "clientInfo": dict(CLIENT_INFO),
        }
        try:
            result = await self._request("initialize", params, self._request_timeout)
        except BaseException as exc:
            # Also on cancellation: a waiting list_tools must fail, not list too early.
            interrupted = "the device MCP initialization was interrupted"
            self._init_error = str(exc) if isinstance(exc, ToolError) else interrupted
            raise
        finally:
            self._init_done.set()
        info = result.get("serverInfo")
        self.server_info = info if isinstance(info, dict) else {}
        return result

    async def list_tools(self, *, with_user_tools: bool = True) -> list[ToolSpec]:
        """All tools, page after page; waits for initialize first (PY PR #2852).

        Stops at TOOLS_DEVICE_MAX_PAGES pages or TOOLS_DEVICE_MAX_COUNT tools, whichever
        comes first: a device with a broken cursor, or one listing thousands of tools, gets
        a truncated catalogue, not our event loop.
        """
        await self._wait_initialized()
        max_pages, max_tools = self._limits.device_max_pages, self._limits.device_max_tools
        found: dict[str, ToolSpec] = {}
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(max_pages):
            params = _list_params(cursor, with_user_tools)
            result = await self._request("tools/list", params, self._request_timeout)
            for spec in parse_tools(result.get("tools")):
                found.setdefault(spec.name, spec)
            cursor = _next_cursor(result, seen)
            if cursor is None or len(found) >= max_tools:
                break
            seen.add(cursor)
        else:
            logger.warning("device tools/list page cap reached", extra={"pages": max_pages})
        if len(found) > max_tools:
            logger.warning("device tool cap reached", extra={"tools": len(found), "limit": max_tools})
        self.tools = list(found.values())[:max_tools]
        return list(self.tools)

    async def call_tool(self, name: str, arguments: dict, timeout: float = 30.0) -> str:
        """Call a device tool and return its text; ToolError on any failure."""
        params = {"name": name, "arguments": arguments}
        result = await self._request("tools/call", params, timeout)
        return result_text(result)

    async def _wait_initialized(self) -> None:
        if not self._init_started:
            raise ToolError("the device MCP session is not initialized")
        try:
            async with asyncio.timeout(self._request_timeout):
                await self._init_done.wait()
        except TimeoutError:
            raise ToolError("the device did not finish MCP initialization") from None
        if self._init_error is not None:
            raise ToolError(self._init_error)

    async def _request(self, method: str, params: dict, timeout: float) -> dict:
        if self._closed:
            raise ToolError(DISCONNECTED)
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        payload = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            async with asyncio.timeout(timeout):
                await self._deliver(payload)
                reply = await future
        except TimeoutError:
            raise ToolError(f"the device did not answer within {timeout:g} seconds") from None
        finally:
            # Whatever happened (timeout, cancel, reply), a late reply must find nothing.
            self._pending.pop(request_id, None)
        return unwrap_reply(reply)

    async def _deliver(self, payload: dict) -> None:
        try:
            await self._send(payload)
        except Exception:
            logger.warning(
                "device MCP send failed", exc_info=True, extra={"mcp_method": payload["method"]}
            )
            raise ToolError("could not reach the device") from None

    # -- replies ---------------------------------------------------------------------------

    def feed(self, payload: object) -> None:
        """Handle one MCP payload from the device. Never raises: bad input is logged."""
        if not isinstance(payload, dict):
            logger.warning("device MCP payload is not an object, dropped")
            return
        if "method" in payload:
            # The firmware sends no requests or notifications today; if a future one
            # does, answering is not our job.
            logger.debug(
                "device MCP request or notification ignored",
                extra={"mcp_method": payload.get("method")},
            )
            return
        request_id = payload.get("id")
        if type(request_id) is not int:  # bool is an int subclass, and not an id
            logger.warning(
                "device MCP reply without an integer id, dropped",
                extra={"mcp_id": repr(request_id)},
            )
            return
        future = self._pending.get(request_id)
        if future is None or future.done():
            logger.warning(
                "device MCP reply for an unknown id, dropped", extra={"mcp_id": request_id}
            )
            return
        future.set_result(payload)

    def close(self) -> None:
        """Fail every pending request: the socket is gone and no reply will come."""
        self._closed = True
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ToolError(DISCONNECTED))
        if not self._init_done.is_set() and self._init_started:
            self._init_error = DISCONNECTED
            self._init_done.set()


class DeviceToolSource:
    """The device's tools as a ToolSource for the Toolset (kind "device")."""

    kind = "device"
    origin = ""

    def __init__(self, client: DeviceMcpClient, timeout: float = 30.0) -> None:
        self.client = client
        self.timeout = timeout

    async def list_tools(self) -> list[ToolSpec]:
        # The session lists once after initialize; re-asking the device on every
        # Toolset refresh would cost a round of 8 KB pages for nothing.
        if self.client.tools is not None:
            return list(self.client.tools)
        return await self.client.list_tools()

    async def call(self, name: str, arguments: dict) -> str:
        return await self.client.call_tool(name, arguments, timeout=self.timeout)


# -- payload helpers (pure) -------------------------------------------------------------------


def _list_params(cursor: str | None, with_user_tools: bool) -> dict:
    params: dict[str, Any] = {"withUserTools": with_user_tools}
    if cursor is not None:
        params["cursor"] = cursor
    return params


def _next_cursor(result: dict, seen: set[str]) -> str | None:
    cursor = result.get("nextCursor")
    if cursor is None or cursor == "":
        return None
    if not isinstance(cursor, str):
        logger.warning("device tools/list cursor is not a string, listing stopped")
        return None
    if cursor in seen:
        logger.warning(
            "device tools/list repeated a cursor, listing stopped", extra={"cursor": cursor}
        )
        return None
    return cursor


def unwrap_reply(reply: dict) -> dict:
    """The `result` of a JSON-RPC reply; ToolError for an error reply or a malformed one."""
    if "error" in reply:
        error = reply["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise ToolError(str(message) if message else "the device reported an error")
    result = reply.get("result")
    if not isinstance(result, dict):
        raise ToolError("the device sent a malformed reply")
    return result


def parse_tools(raw: object) -> list[ToolSpec]:
    """Tool specs from a `tools` array; entries without a usable name are skipped."""
    if not isinstance(raw, list):
        logger.warning("device tools/list result without a tools array")
        return []
    specs = [spec for item in raw if (spec := parse_tool(item)) is not None]
    if len(specs) != len(raw):
        logger.warning("device tool entries skipped", extra={"skipped": len(raw) - len(specs)})
    return specs


def parse_tool(raw: object) -> ToolSpec | None:
    if not isinstance(raw, dict):
        return None
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        return None
    description = raw.get("description")
    schema = raw.get("inputSchema")
    annotations = raw.get("annotations")
    audience = annotations.get("audience") if isinstance(annotations, dict) else None
    return ToolSpec(
        name=name,
        description=description if isinstance(description, str) else "",
        parameters=schema if isinstance(schema, dict) else empty_schema(),
        source="device",
        user_only=audience == ["user"],
    )


def result_text(result: dict) -> str:
    """The text of a tools/call result; `isError: true` becomes a ToolError."""
    text = content_text(result.get("content"))
    if result.get("isError") is True:
        raise ToolError(text or "the device reported an error")
    return text


def content_text(content: object) -> str:
    if not isinstance(content, list):
        return ""
    parts = [_item_text(item) for item in content if isinstance(item, dict)]
    return "\n".join(part for part in parts if part)


def _item_text(item: dict) -> str:
    kind = item.get("type")
    if kind == "text":
        text = item.get("text")
        return compact_json_text(text if isinstance(text, str) else "")
    if kind == "image":
        return image_summary(item)
    return f"[{kind} content]"


def compact_json_text(text: str) -> str:
    """Compact JSON text for JSON object/array results, even when encoded twice."""
    try:
        value = json.loads(text)
        if isinstance(value, str):
            value = json.loads(value)
    except ValueError:
        return text
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text


def image_summary(item: dict) -> str:
    """A short stand-in for an image result; the LLM cannot use base64 text."""
    inner: object = item.get("image", item)
    if isinstance(inner, str):
        try:
            inner = json.loads(inner)
        except ValueError:
            inner = {}
    if not isinstance(inner, dict):
        inner = {}
    mime = inner.get("mimeType") or "unknown"
    data = inner.get("data")
    return f"[image {mime}, {decoded_size(data if isinstance(data, str) else '')} bytes]"

