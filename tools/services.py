"""Services for registered MCP servers: refresh the cached tool catalogue, record health."""
from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tools.errors import ToolError
from tools.mcp.client import RemoteMcpServer
from tools.models import McpServer, McpTool
from tools.registry import ToolSpec

log = logging.getLogger(__name__)


def remote_server_for(server: McpServer) -> RemoteMcpServer:
    return RemoteMcpServer(
        server.name, server.url, server.transport, headers=server.headers or {},
        timeout=settings.TOOLS_MCP_TIMEOUT,
    )


def mcp_server_refresh_tools(*, server: McpServer) -> int:
    """Ask the server for its catalogue and replace the cached tools. Returns the tool count;
    a failure is recorded on the server (unhealthy, last error) and returns -1."""
    try:
        specs = async_to_sync(remote_server_for(server).list_tools)()
    except ToolError as exc:
        log.warning("mcp server refresh failed", extra={"server": server.name})
        _record_failure(server, str(exc))
        return -1
    _store_catalogue(server, specs)
    return len(specs)


@transaction.atomic
def _store_catalogue(server: McpServer, specs: list[ToolSpec]) -> None:
    McpTool.objects.filter(server=server).delete()
    McpTool.objects.bulk_create(
        McpTool(server=server, name=spec.name, description=spec.description,
                input_schema=spec.parameters)
        for spec in specs
    )
    server.healthy = True
    server.last_error = ""
    server.last_refresh_at = timezone.now()
    server.save(update_fields=["healthy", "last_error", "last_refresh_at"])


def _record_failure(server: McpServer, error: str) -> None:
    server.healthy = False
    server.last_error = error[:500]
    server.last_refresh_at = timezone.now()
    server.save(update_fields=["healthy", "last_error", "last_refresh_at"])
