"""Remote MCP servers: real servers written with the mcp SDK, served by uvicorn on loopback."""
from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import pytest
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer

from tools.errors import ToolError
from tools.mcp.client import McpToolSource, RemoteMcpServer, call_result_text
from testing.server import free_port
from tools.registry import ToolSpec, Toolset

PNG = b"\x89PNG\r\n\x1a\n" + bytes(100)


# -- the servers ----------------------------------------------------------------------------


def demo_server() -> MCPServer:
    server = MCPServer("demo")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool(name="math.divide")
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b

    @server.tool()
    def greet(name: str) -> str:
        """Greet someone."""
        return f"你好, {name}!"

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "done"

    return server


async def _list_paged(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    # Three pages of two tools; the cursor is an opaque page number.
    page = int(params.cursor) if params and params.cursor else 0
    tools = [
        types.Tool(name=f"paged_{page}_{i}", description=f"tool {i} of page {page}",
                   input_schema={"type": "object", "properties": {}})
        for i in range(2)
    ]
    return types.ListToolsResult(tools=tools, next_cursor=str(page + 1) if page < 2 else None)


async def _call_content(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name == "paged_0_0":
        return types.CallToolResult(content=[
            types.TextContent(type="text", text="first line"),
            types.ImageContent(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png"),
            types.TextContent(type="text", text="last line"),
        ])
    if params.name == "paged_0_1":
        return types.CallToolResult(content=[], structured_content={"temperature": 21.5})
    refusal = types.TextContent(type="text", text="quota exceeded")
    return types.CallToolResult(content=[refusal], is_error=True)


def paged_server() -> Server:
    return Server("paged", on_list_tools=_list_paged, on_call_tool=_call_content)


# -- serving them ---------------------------------------------------------------------------


class RecordHeaders:
    """ASGI wrapper that remembers the headers of every HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[dict[str, str]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


@dataclass
class Served:
    url: str
    recorder: RecordHeaders
    server: uvicorn.Server
    thread: threading.Thread = field(repr=False)


def serve(app: Any, path: str) -> Served:
    port = free_port()
    recorder = RecordHeaders(app)
    server = uvicorn.Server(uvicorn.Config(recorder, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "MCP test server did not start"
        time.sleep(0.01)
    return Served(f"http://127.0.0.1:{port}{path}", recorder, server, thread)


def stop(served: Served) -> None:
    served.server.should_exit = True
    served.thread.join(timeout=5)


@pytest.fixture(scope="module")
def http_server() -> Iterator[Served]:
    served = serve(demo_server().streamable_http_app(), "/mcp")
    yield served
    stop(served)


@pytest.fixture(scope="module")
def sse_server() -> Iterator[Served]:
    served = serve(demo_server().sse_app(), "/sse")
    yield served
    stop(served)


@pytest.fixture(scope="module")
def paged_http_server() -> Iterator[Served]:
    served = serve(paged_server().streamable_http_app(), "/mcp")
    yield served
    stop(served)


# -- streamable HTTP ------------------------------------------------------------------------


async def test_it_lists_tools_over_streamable_http(http_server: Served) -> None:
    server = RemoteMcpServer("demo", http_server.url, "streamable_http", timeout=5)
    specs = {s.name: s for s in await server.list_tools()}
    assert set(specs) == {"add", "math.divide", "greet", "slow"}
    add = specs["add"]
    assert add.description == "Add two integers."
    assert add.source == "mcp" and add.origin == "demo" and not add.user_only
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert add.parameters["required"] == ["a", "b"]


async def test_it_sends_the_configured_headers(http_server: Served) -> None:
    server = RemoteMcpServer("demo", http_server.url, headers={"Authorization": "Bearer s3cret"}, timeout=5)
    http_server.recorder.seen.clear()
    await server.list_tools()
    assert http_server.recorder.seen
    assert all(h.get("authorization") == "Bearer s3cret" for h in http_server.recorder.seen)


async def test_it_calls_a_tool_over_streamable_http(http_server: Served) -> None:
    server = RemoteMcpServer("demo", http_server.url, timeout=5)
    assert await server.call("add", {"a": 2, "b": 3}) == "5"
    assert await server.call("greet", {"name": "小智"}) == "你好, 小智!"


async def test_a_failing_remote_tool_is_a_tool_error(http_server: Served) -> None:
    server = RemoteMcpServer("demo", http_server.url, timeout=5)
    with pytest.raises(ToolError, match="math.divide"):
        await server.call("math.divide", {"a": 1, "b": 0})


async def test_remote_tools_work_through_a_toolset(http_server: Served) -> None:
    source = McpToolSource(RemoteMcpServer("demo", http_server.url, timeout=5))
    toolset = Toolset([source])
    await toolset.refresh()
    names = [t["function"]["name"] for t in toolset.llm_tools()]
    assert names == ["add", "greet", "math_divide", "slow"]

    record = await toolset.call("add", '{"a": 20, "b": 22}')
    assert record.success and record.result == "42"
    assert (record.name, record.source) == ("add", "mcp")

    divided = await toolset.call("math_divide", '{"a": 1, "b": 4}')
    assert divided.success and divided.name == "math.divide" and divided.result == "0.25"

    failed = await toolset.call("math_divide", '{"a": 1, "b": 0}')
    assert not failed.success and failed.error == "tool_error"

    invalid = await toolset.call("add", '{"a": "x", "b": 1}')
    assert invalid.error == "invalid_arguments"


async def test_a_cached_catalogue_is_used_without_asking_the_server(http_server: Served) -> None:
    cached = [ToolSpec("add", "Add.", {"type": "object", "properties": {}}, "mcp", origin="demo")]
    http_server.recorder.seen.clear()
    source = McpToolSource(RemoteMcpServer("demo", http_server.url, timeout=5), cached)
    toolset = Toolset([source])
    await toolset.refresh()
    assert http_server.recorder.seen == []
    assert (await toolset.call("add", '{"a": 1, "b": 1}')).result == "2"


async def test_a_tool_the_server_no_longer_has_is_a_failed_record(http_server: Served) -> None:
    schema = {"type": "object", "properties": {}}
    cached = [ToolSpec("gone", "Removed tool.", schema, "mcp", origin="demo")]
    toolset = Toolset([McpToolSource(RemoteMcpServer("demo", http_server.url, timeout=5), cached)])
    await toolset.refresh()
    record = await toolset.call("gone", "{}")
    assert not record.success and record.error == "tool_error"
    assert "gone" in record.result or "demo" in record.result


async def test_a_slow_remote_tool_times_out(http_server: Served) -> None:
    server = RemoteMcpServer("demo", http_server.url, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ToolError, match="did not answer within 0.3 seconds"):
        await server.call("slow", {"seconds": 1})
    assert time.monotonic() - started < 1


async def test_cancelling_a_remote_call_propagates(http_server: Served) -> None:
    toolset = Toolset([McpToolSource(RemoteMcpServer("demo", http_server.url, timeout=5))])
    await toolset.refresh()
    task = asyncio.create_task(toolset.call("slow", '{"seconds": 1}'))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_it_follows_pagination_and_summarises_content(paged_http_server: Served) -> None:
    server = RemoteMcpServer("paged", paged_http_server.url, timeout=5)
    names = [s.name for s in await server.list_tools()]
    assert names == ["paged_0_0", "paged_0_1", "paged_1_0", "paged_1_1", "paged_2_0", "paged_2_1"]
    text = await server.call("paged_0_0", {})
    assert text == f"first line\n[image image/png, {len(PNG)} bytes]\nlast line"
    assert await server.call("paged_0_1", {}) == '{"temperature":21.5}'
    with pytest.raises(ToolError, match="^quota exceeded$"):
        await server.call("paged_1_0", {})


# -- SSE ------------------------------------------------------------------------------------


async def test_it_lists_and_calls_over_sse(sse_server: Served) -> None:
    server = RemoteMcpServer("demo-sse", sse_server.url, "sse", headers={"X-Api-Key": "k"}, timeout=5)
    sse_server.recorder.seen.clear()
    specs = await server.list_tools()
    assert {s.name for s in specs} == {"add", "math.divide", "greet", "slow"}
    assert all(s.origin == "demo-sse" for s in specs)
    assert await server.call("add", {"a": 1, "b": 2}) == "3"
    assert all(h.get("x-api-key") == "k" for h in sse_server.recorder.seen)


async def test_sse_tools_work_through_a_toolset(sse_server: Served) -> None:
    toolset = Toolset([McpToolSource(RemoteMcpServer("demo", sse_server.url, "sse", timeout=5))])
    await toolset.refresh()
    record = await toolset.call("greet", '{"name": "Ada"}')
    assert record.success and record.result == "你好, Ada!"


# -- servers that are not there -------------------------------------------------------------


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_a_server_that_is_down_is_a_tool_error(transport: str) -> None:
    server = RemoteMcpServer("down", f"http://127.0.0.1:{free_port()}/mcp", transport, timeout=3)
    with pytest.raises(ToolError, match="'down' is unreachable"):
        await server.list_tools()
    with pytest.raises(ToolError, match="'down' is unreachable"):
        await server.call("add", {"a": 1, "b": 2})


async def test_a_server_that_is_down_gives_a_failed_record_and_no_tools() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    cached = [ToolSpec("add", "Add.", {"type": "object", "properties": {}}, "mcp", origin="down")]
    listed = McpToolSource(RemoteMcpServer("down", url, timeout=3))
    toolset = Toolset([listed, McpToolSource(RemoteMcpServer("down2", url, timeout=3), cached)])
    await toolset.refresh()
    assert [t["function"]["name"] for t in toolset.llm_tools()] == ["add"]
    record = await toolset.call("add", '{"a": 1, "b": 2}')
    assert not record.success and record.error == "tool_error"
    assert record.result.startswith("Error: the MCP server 'down2' is unreachable or failed (")


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_a_server_that_accepts_but_never_answers_times_out(transport: str) -> None:
    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # read until the client gives up and closes
        writer.close()

    listener = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server = RemoteMcpServer("mute", f"http://127.0.0.1:{port}/mcp", transport, timeout=0.2)
    try:
        with pytest.raises(ToolError, match="'mute' did not answer within 0.2 seconds"):
            await server.list_tools()
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_url_that_is_not_an_mcp_server_is_a_tool_error(http_server: Served) -> None:
    server = RemoteMcpServer("wrong", http_server.url.replace("/mcp", "/nothing-here"), timeout=3)
    with pytest.raises(ToolError, match="'wrong'"):
        await server.list_tools()


def test_an_unknown_transport_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown MCP transport"):
        RemoteMcpServer("x", "http://127.0.0.1/", "websocket")


def test_content_conversion_handles_every_content_type() -> None:
    result = types.CallToolResult(content=[
        types.TextContent(type="text", text="hello"),
        types.AudioContent(type="audio", data=base64.b64encode(b"abcd").decode(), mime_type="audio/wav"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="file:///a.txt", text="inside")),
        types.ResourceLink(type="resource_link", name="b", uri="file:///b.bin"),
    ])
    assert call_result_text(result) == (
        "hello\n[audio audio/wav, 4 bytes]\ninside\n[resource link file:///b.bin]"
    )
    assert call_result_text(types.CallToolResult(content=[], is_error=False)) == ""
    with pytest.raises(ToolError, match="the tool reported an error"):
        call_result_text(types.CallToolResult(content=[], is_error=True))
