"""Read-side helpers: which remote MCP tools a session may use."""
from __future__ import annotations

import time
from collections.abc import Iterable

from django.conf import settings

from tools.mcp.client import McpToolSource, RemoteMcpServer
from tools.models import McpServer
from tools.registry import ToolSpec
from tools.services import remote_server_for

# The enabled servers' catalogue as sessions start from it, by the names asked for (None: all):
# (expiry, [(server name, url, transport, headers), specs]). Plain data only: every session
# gets its own source objects.
_Catalogue = list[tuple[tuple[str, str, str, dict[str, str]], list[ToolSpec]]]
_catalogues: dict[frozenset[str] | None, tuple[float, _Catalogue]] = {}


def mcp_catalogue_clear(**_: object) -> None:
    """Forget the cached catalogues (conversations/selectors.py clears them with the persona
    configurations, on the same signals)."""
    _catalogues.clear()


def mcp_tool_sources(*, server_names: Iterable[str] | None = None, max_age: float = 0.0) -> list[McpToolSource]:
    """Sources for the enabled MCP servers (all of them, or only those named), built from the
    cached catalogue so a session start never waits on a remote server. With `max_age`, a
    catalogue read up to that many seconds ago is reused (devices connecting together)."""
    key = None if server_names is None else frozenset(server_names)
    now = time.monotonic()
    cached = _catalogues.get(key) if max_age > 0 else None
    if cached is not None and cached[0] > now:
        catalogue = cached[1]
    else:
        catalogue = _catalogue(server_names)
        if max_age > 0:
            if len(_catalogues) > 256:  # one entry per persona's server names: never many
                _catalogues.clear()
            _catalogues[key] = (now + max_age, catalogue)
    timeout = settings.TOOLS_MCP_TIMEOUT
    return [
        McpToolSource(RemoteMcpServer(name, url, transport, headers=dict(headers), timeout=timeout), specs)
        for (name, url, transport, headers), specs in catalogue
    ]


def _catalogue(server_names: Iterable[str] | None) -> _Catalogue:
    servers = McpServer.objects.filter(enabled=True).prefetch_related("tools")
    if server_names is not None:
        servers = servers.filter(name__in=list(server_names))
    catalogue: _Catalogue = []
    for server in servers:
        remote = remote_server_for(server)
        catalogue.append(((remote.name, remote.url, remote.transport, remote.headers), _cached_specs(server)))
    return catalogue


def _cached_specs(server: McpServer) -> list[ToolSpec]:
    return [
        ToolSpec(name=tool.name, description=tool.description, parameters=tool.input_schema,
                 source="mcp", origin=server.name)
        for tool in server.tools.all()
    ]
