"""Read-side helpers: which remote MCP tools a session may use."""
from __future__ import annotations

from collections.abc import Iterable

from tools.mcp.client import McpToolSource
from tools.models import McpServer
from tools.registry import ToolSpec
from tools.services import remote_server_for
from xiaozhi_site.expiring import Expiring

# The enabled servers as sessions start from them, by the names asked for (None: all). The
# rows are only read: every session gets its own source and server objects.
_Catalogue = list[tuple[McpServer, list[ToolSpec]]]
_catalogues: Expiring[frozenset[str] | None, _Catalogue] = Expiring()


def mcp_catalogue_clear(**_: object) -> None:
    """Forget the cached catalogues (conversations/selectors.py clears them with the persona
    configurations, on the same signals)."""
    _catalogues.clear()


def mcp_tool_sources(*, server_names: Iterable[str] | None = None, max_age: float = 0.0) -> list[McpToolSource]:
    """Sources for the enabled MCP servers (all of them, or only those named), built from the
    cached catalogue so a session start never waits on a remote server. With `max_age`, a
    catalogue read up to that many seconds ago is reused (devices connecting together)."""
    if max_age > 0:
        key = None if server_names is None else frozenset(server_names)
        catalogue = _catalogues.get(key, lambda: _catalogue(server_names), max_age)
    else:
        catalogue = _catalogue(server_names)
    return [McpToolSource(remote_server_for(server), specs) for server, specs in catalogue]


def _catalogue(server_names: Iterable[str] | None) -> _Catalogue:
    servers = McpServer.objects.filter(enabled=True).prefetch_related("tools")
    if server_names is not None:
        servers = servers.filter(name__in=list(server_names))
    return [(server, _cached_specs(server)) for server in servers]


def _cached_specs(server: McpServer) -> list[ToolSpec]:
    return [
        ToolSpec(name=tool.name, description=tool.description, parameters=tool.input_schema,
                 source="mcp", origin=server.name)
        for tool in server.tools.all()
    ]
