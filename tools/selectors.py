"""Read-side helpers: which remote MCP tools a session may use."""
from __future__ import annotations

from collections.abc import Iterable

from tools.mcp.client import McpToolSource
from tools.models import McpServer
from tools.registry import ToolSpec
from tools.services import remote_server_for


def mcp_tool_sources(*, server_names: Iterable[str] | None = None) -> list[McpToolSource]:
    """Sources for the enabled MCP servers (all of them, or only those named), built from the
    cached catalogue so a session start never waits on a remote server."""
    servers = McpServer.objects.filter(enabled=True).prefetch_related("tools")
    if server_names is not None:
        servers = servers.filter(name__in=list(server_names))
    return [McpToolSource(remote_server_for(server), _cached_specs(server)) for server in servers]


def _cached_specs(server: McpServer) -> list[ToolSpec]:
    return [
        ToolSpec(name=tool.name, description=tool.description, parameters=tool.input_schema,
                 source="mcp", origin=server.name)
        for tool in server.tools.all()
    ]
