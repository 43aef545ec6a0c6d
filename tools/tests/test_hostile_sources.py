"""Hostile tool catalogues from a device and from a remote MCP server, through the Toolset.

Each source offers the whole hostile-schema corpus (tools/tests/hostile.py) with references
aimed at a recording HTTP server: refused tools are not offered, accepted ones validate the
LLM's arguments, and the recording server is never asked for anything. Oversized catalogues
are cut at their caps without paging on.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import mcp_types as types
import pytest
from mcp.server.lowlevel import Server

from tools.limits import ToolLimits
from tools.mcp.client import McpToolSource, RemoteMcpServer
from tools.mcp.device import DeviceToolSource
from tools.models import McpServer, McpTool
from tools.registry import Toolset
from tools.services import mcp_server_refresh_tools
from tools.tests.hostile import ARGUMENTS, Hostile, RecordingServer, hostile_schemas, recording_server
from tools.tests.test_device_mcp import FakeFirmware, started, tool
from tools.tests.test_remote_mcp import Served, serve, stop


@pytest.fixture
def recorder() -> Iterator[RecordingServer]:
    with recording_server() as server:
        yield server


def llm_names(toolset: Toolset) -> set[str]:
    return {t["function"]["name"] for t in toolset.llm_tools()}


async def assert_arguments_are_checked(toolset: Toolset, accepted: list[Hostile], prefix: str) -> None:
    for case in accepted:
        if case.name not in ARGUMENTS:
            continue
        valid, invalid = ARGUMENTS[case.name]
        assert (await toolset.call(f"{prefix}{case.name}", valid)).success, case.name
        assert (await toolset.call(f"{prefix}{case.name}", invalid)).error == "invalid_arguments", case.name


# -- the device -------------------------------------------------------------------------------------------


def device_corpus(base: str) -> list[Hostile]:
    # A tool over 8000 bytes cannot be listed by the firmware at all; the size cap is covered
    # by the gateway and MCP tests.
    return [h for h in hostile_schemas(base) if h.name != "huge"]


async def test_device_tools_with_hostile_schemas_are_refused_and_nothing_is_fetched(recorder: RecordingServer) -> None:
    corpus = device_corpus(recorder.url)
    firmware = FakeFirmware([{"name": f"self.{h.name}", "description": h.name, "inputSchema": h.schema}
                             for h in corpus])  # fmt: skip
    toolset = Toolset([])
    await toolset.add_source(DeviceToolSource(await started(firmware)))
    # A schema that is not an object (here `true`) is replaced by "no parameters", as before.
    accepted = [h for h in corpus if h.refusal is None or h.name == "boolean_schema"]
    assert llm_names(toolset) == {f"self_{h.name}" for h in accepted}
    await assert_arguments_are_checked(toolset, accepted, "self_")
    assert recorder.requests == []


async def test_a_device_listing_thousands_of_tools_is_cut_at_the_cap_without_paging_on() -> None:
    firmware = FakeFirmware([])
    pages = iter(range(50))

    def endless(params: dict) -> dict:
        page = next(pages)
        return {"tools": [tool(f"self.p{page}.t{i}") for i in range(400)], "nextCursor": f"self.p{page + 1}.t0"}

    firmware.list_override = endless
    client = await started(firmware, limits=ToolLimits(device_max_tools=64, device_max_pages=10))
    toolset = Toolset([])
    await toolset.add_source(DeviceToolSource(client))
    assert len(firmware.requests("tools/list")) == 1  # 400 tools on the first page already
    assert len(toolset.specs()) == 64


async def test_a_toolset_caps_any_device_source_even_one_that_ignores_its_own_limits() -> None:
    class Flood:
        kind, origin, timeout = "device", "", 5.0

        async def list_tools(self) -> list:
            from tools.registry import ToolSpec

            return [ToolSpec(f"t{i}", "", {"type": "object"}, "device") for i in range(3000)]

        async def call(self, name: str, arguments: dict) -> str:
            return "ok"

    toolset = Toolset([Flood()], limits=ToolLimits(device_max_tools=64))
    await toolset.refresh()
    assert len(toolset.specs()) == 64


# -- a remote MCP server --------------------------------------------------------------------------------


def hostile_mcp_server(corpus: list[Hostile], extra: int = 0) -> Server:
    """A low-level MCP server listing the corpus (object schemas only: the MCP types demand
    one) plus `extra` plain tools, 100 per page."""
    tools = [types.Tool(name=h.name, description=h.name, input_schema=h.schema)
             for h in corpus if isinstance(h.schema, dict)]  # fmt: skip
    tools += [types.Tool(name=f"plain_{i}", input_schema={"type": "object"}) for i in range(extra)]
    listed: list[int] = []

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        page = int(params.cursor) if params and params.cursor else 0
        listed.append(page)
        more = (page + 1) * 100 < len(tools)
        return types.ListToolsResult(tools=tools[page * 100:(page + 1) * 100],
                                     next_cursor=str(page + 1) if more else None)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(params.arguments))])

    server = Server("hostile", on_list_tools=list_tools, on_call_tool=call_tool)
    server.listed_pages = listed  # type: ignore[attr-defined]
    return server


@pytest.fixture
def hostile_mcp(recorder: RecordingServer) -> Iterator[tuple[Served, list[Hostile]]]:
    # The MCP types themselves refuse a schema that is not an object or a non-string $schema.
    corpus = [h for h in hostile_schemas(recorder.url)
              if isinstance(h.schema, dict) and h.name != "schema_keyword_not_a_string"]  # fmt: skip
    served = serve(hostile_mcp_server(corpus).streamable_http_app(), "/mcp")
    yield served, corpus
    stop(served)


async def test_remote_mcp_tools_with_hostile_schemas_are_refused_and_nothing_is_fetched(
    hostile_mcp: tuple[Served, list[Hostile]], recorder: RecordingServer
) -> None:
    served, corpus = hostile_mcp
    toolset = Toolset([McpToolSource(RemoteMcpServer("hostile", served.url, timeout=10))])
    await toolset.refresh()
    accepted = [h for h in corpus if h.refusal is None]
    assert llm_names(toolset) == {h.name for h in accepted}
    await assert_arguments_are_checked(toolset, accepted, "")
    assert recorder.requests == []


@pytest.mark.django_db
def test_a_catalogue_refresh_caches_only_accepted_tools_and_tells_the_admin_why(
    hostile_mcp: tuple[Served, list[Hostile]], recorder: RecordingServer
) -> None:
    served, corpus = hostile_mcp
    server = McpServer.objects.create(name="hostile", url=served.url)
    accepted = {h.name for h in corpus if h.refusal is None}
    assert mcp_server_refresh_tools(server=server) == len(accepted)
    assert set(McpTool.objects.filter(server=server).values_list("name", flat=True)) == accepted
    server.refresh_from_db()
    assert server.healthy
    assert server.last_error.startswith("Not offered: remote_ref: Tool parameters may only refer to their own")
    assert recorder.requests == []


async def test_a_remote_mcp_catalogue_is_cut_at_the_cap_without_paging_on() -> None:
    server = hostile_mcp_server([], extra=1000)
    served = serve(server.streamable_http_app(), "/mcp")
    try:
        toolset = Toolset([McpToolSource(RemoteMcpServer("big", served.url, timeout=10))],
                          limits=ToolLimits(mcp_max_tools=128))  # fmt: skip
        await toolset.refresh()
    finally:
        stop(served)
    assert len(toolset.specs()) == 128
    assert server.listed_pages == [0, 1]  # type: ignore[attr-defined]  # 200 tools: enough
