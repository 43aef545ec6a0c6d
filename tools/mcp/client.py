"""Remote MCP servers (registered by an admin), reached with the official `mcp` SDK.

Every operation opens its own short-lived MCP session (connect, handshake, one request,
close). That costs one handshake per call (a few ms on a LAN) and buys robustness: no
long-lived connection to babysit, to reconnect after a server restart, or to leak when a
voice session dies; a server that went away is simply reported on the next call. Sessions
are cheap enough that the Celery catalogue refresh and live calls can share this code.

Transports: "streamable_http" (the current MCP transport; the SDK probes the protocol era
with `server/discover` and falls back to the `initialize` handshake) and "sse" (the
deprecated HTTP+SSE transport, which only speaks the `initialize` handshake).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx2
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tools import limits as tool_limits
from tools.errors import ToolError
from tools.mcp.content import decoded_size
from tools.registry import ToolSpec, empty_schema

logger = logging.getLogger(__name__)

TRANSPORTS = ("streamable_http", "sse")
MAX_PAGES = 50  # a server whose cursor never ends must not hang a refresh

_T = TypeVar("_T")


class RemoteMcpServer:
    """One remote MCP server. Failures of any kind surface as ToolError with a clear text."""

    def __init__(
        self,
        name: str,
        url: str,
        transport: str = "streamable_http",
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown MCP transport {transport!r}; expected one of {TRANSPORTS}")
        self.name = name
        self.url = url
        self.transport = transport
        self.headers = dict(headers or {})
        self.timeout = timeout

    async def list_tools(self) -> list[ToolSpec]:
        """Every tool the server offers, following `nextCursor` page after page."""
        return await self._run("tools/list", self._list_all)

    async def call(self, name: str, arguments: dict) -> str:
        """Call one tool and return its content as text; `isError` becomes a ToolError."""

        async def call_one(client: Client) -> Any:
            return await client.call_tool(name, arguments)

        # Converted after the session is closed: an exception raised inside it would come
        # out wrapped in the SDK's task-group ExceptionGroup.
        return call_result_text(await self._run("tools/call", call_one))

    async def _list_all(self, client: Client) -> list[ToolSpec]:
        max_tools = tool_limits.current().mcp_max_tools  # TOOLS_MCP_MAX_COUNT
        found: dict[str, ToolSpec] = {}
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                found.setdefault(tool.name, self._spec(tool))
            cursor = page.next_cursor
            if not cursor or cursor in seen or len(found) >= max_tools:
                break
            seen.add(cursor)
        if len(found) > max_tools:
            logger.warning("mcp tool cap reached",
                           extra={"mcp_server": self.name, "tools": len(found), "limit": max_tools})
        return list(found.values())[:max_tools]

    def _spec(self, tool: Any) -> ToolSpec:
        schema = tool.input_schema
        return ToolSpec(
            name=tool.name,
            description=tool.description or "",
            parameters=dict(schema) if isinstance(schema, dict) else empty_schema(),
            source="mcp",
            origin=self.name,
        )

    async def _run(self, operation: str, work: Callable[[Client], Awaitable[_T]]) -> _T:
        """Open a session, run `work`, close it; map every failure to a ToolError."""
        try:
            async with asyncio.timeout(self.timeout):
                async with self._session() as client:
                    return await work(client)
        except Exception as exc:
            raise self._tool_error(operation, exc) from None

    def _tool_error(self, operation: str, exc: Exception) -> ToolError:
        # The SDK runs its transports in anyio task groups, so the real failure usually
        # arrives wrapped in one or more ExceptionGroups.
        cause = _innermost(exc)
        if isinstance(cause, ToolError):
            return cause
        if isinstance(cause, TimeoutError):
            text = f"the MCP server '{self.name}' did not answer within {self.timeout:g} seconds"
            return ToolError(text)
        if isinstance(cause, MCPError):
            return ToolError(f"the MCP server '{self.name}' refused the request: {cause.message}")
        # Connection refused, DNS, TLS, HTTP 5xx, a garbled reply: to the LLM they all mean
        # the same thing; the log keeps the detail for the admin.
        detail = f"{type(cause).__name__}: {cause}"[:200]
        logger.warning(
            "remote MCP operation failed",
            extra={"mcp_server": self.name, "mcp_operation": operation, "error": detail},
        )
        return ToolError(f"the MCP server '{self.name}' is unreachable or failed ({type(cause).__name__})")

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[Client]:
        if self.transport == "sse":
            transport = sse_client(
                self.url, headers=self.headers, timeout=self.timeout, sse_read_timeout=self.timeout
            )
            async with Client(transport, mode="legacy", cache=None) as client:
                yield client
            return
        http = httpx2.AsyncClient(headers=self.headers, timeout=httpx2.Timeout(self.timeout))
        async with http:
            transport = streamable_http_client(self.url, http_client=http)
            async with Client(transport, mode="auto", cache=None) as client:
                yield client


class McpToolSource:
    """A remote MCP server as a ToolSource (kind "mcp", origin = server name).

    `specs` is the catalogue cached in the database by the periodic refresh; when given,
    listing costs nothing at session start. Without it the server is asked live.
    """

    kind = "mcp"

    def __init__(self, server: RemoteMcpServer, specs: list[ToolSpec] | None = None) -> None:
        self.server = server
        self.origin = server.name
        self.timeout = server.timeout
        self._specs = list(specs) if specs is not None else None

    async def list_tools(self) -> list[ToolSpec]:
        if self._specs is not None:
            return list(self._specs)
        return await self.server.list_tools()

    async def call(self, name: str, arguments: dict) -> str:
        return await self.server.call(name, arguments)


def _innermost(exc: BaseException) -> BaseException:
    """The first leaf exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


# -- result conversion (pure) -----------------------------------------------------------------


def call_result_text(result: Any) -> str:
    """Text content joined by newlines; other content summarised; isError → ToolError."""
    parts = [text for item in (result.content or []) if (text := content_item_text(item))]
    text = "\n".join(parts)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"))
    if result.is_error:
        raise ToolError(text or "the tool reported an error")
    return text


def content_item_text(item: Any) -> str:
    kind = getattr(item, "type", "")
    if kind == "text":
        return item.text
    if kind in ("image", "audio"):
        return f"[{kind} {item.mime_type}, {decoded_size(item.data)} bytes]"
    if kind == "resource":
        text = getattr(item.resource, "text", None)
        return text if isinstance(text, str) else f"[resource {item.resource.uri}]"
    if kind == "resource_link":
        return f"[resource link {item.uri}]"
    return f"[{kind} content]"

