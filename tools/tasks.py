"""Celery interface of the tools app; the work lives in tools.services."""
from __future__ import annotations

from celery import shared_task


@shared_task
def mcp_server_refresh_tools(server_id: int) -> int:
    from tools.models import McpServer
    from tools.services import mcp_server_refresh_tools as refresh

    server = McpServer.objects.filter(pk=server_id, enabled=True).first()
    return refresh(server=server) if server else -1


@shared_task
def mcp_servers_refresh_all() -> int:
    from tools.models import McpServer

    ids = list(McpServer.objects.filter(enabled=True).values_list("pk", flat=True))
    for server_id in ids:
        mcp_server_refresh_tools.delay(server_id)
    return len(ids)
