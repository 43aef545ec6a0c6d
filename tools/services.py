"""Services for registered MCP servers: refresh the cached tool catalogue, record health."""
from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tools import limits as tool_limits
from tools.errors import ToolError
from tools.mcp.client import RemoteMcpServer
from tools.models import McpServer, McpTool
from tools.registry import ToolSpec, prepare_tools

log = logging.getLogger(__name__)


def remote_server_for(server: McpServer) -> RemoteMcpServer:
    return RemoteMcpServer(
        server.name, server.url, server.transport, headers=dict(server.headers or {}),  # its own copy
        timeout=settings.TOOLS_MCP_TIMEOUT,
    )


def mcp_server_refresh_tools(*, server: McpServer) -> int:
    """Ask the server for its catalogue and replace the cached tools. Returns the tool count;
    a failure is recorded on the server (unhealthy, last error) and returns -1.

    Tools whose schemas tools.schemas refuses are not cached; the reasons go to the server's
    last error, so the admin sees why a tool is missing.
    """
    try:
        specs = async_to_sync(remote_server_for(server).list_tools)()
    except ToolError as exc:
        log.warning("mcp server refresh failed", extra={"server": server.name})
        _record_failure(server, str(exc))
        return -1
    tools, refused = prepare_tools(specs, "mcp", tool_limits.current())
    if refused:
        log.warning("mcp server tools refused", extra={"server": server.name, "refused": refused[:10]})
    _store_catalogue(server, [tool.spec for tool in tools], refused)
    return len(tools)


@transaction.atomic
def _store_catalogue(server: McpServer, specs: list[ToolSpec], refused: list[tuple[str, str]]) -> None:
    McpTool.objects.filter(server=server).delete()
    McpTool.objects.bulk_create(
        McpTool(server=server, name=spec.name, description=spec.description,
                input_schema=spec.parameters)
        for spec in specs
    )
    server.healthy = True
    server.last_error = _refusals(refused)
    server.last_refresh_at = timezone.now()
    server.save(update_fields=["healthy", "last_error", "last_refresh_at"])


def _refusals(refused: list[tuple[str, str]]) -> str:
    if not refused:
        return ""
    return ("Not offered: " + "; ".join(f"{name}: {reason}" for name, reason in refused))[:500]


def _record_failure(server: McpServer, error: str) -> None:
    server.healthy = False
    server.last_error = error[:500]
    server.last_refresh_at = timezone.now()
    server.save(update_fields=["healthy", "last_error", "last_refresh_at"])
