"""Registered MCP servers: catalogue refresh (service, Celery task, admin) and calls through
the registry, against a real MCP server written with the mcp SDK on loopback."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from tools.models import McpServer, McpTool
from tools.registry import Toolset
from tools.selectors import mcp_tool_sources
from tools.services import mcp_server_refresh_tools
from tools.tasks import mcp_server_refresh_tools as refresh_task
from tools.tests.test_remote_mcp import Served, demo_server, free_port, serve, stop

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def mcp_http() -> Iterator[Served]:
    served = serve(demo_server().streamable_http_app(), "/mcp")
    yield served
    stop(served)


@pytest.fixture
def registered(mcp_http: Served) -> McpServer:
    return McpServer.objects.create(name="demo", url=mcp_http.url, transport="streamable_http")


def test_a_refresh_caches_the_catalogue_and_marks_the_server_healthy(registered: McpServer) -> None:
    assert mcp_server_refresh_tools(server=registered) == 4
    registered.refresh_from_db()
    assert registered.healthy and registered.last_error == "" and registered.last_refresh_at
    names = set(McpTool.objects.filter(server=registered).values_list("name", flat=True))
    assert names == {"add", "math.divide", "greet", "slow"}


def test_the_celery_task_refreshes_a_server(registered: McpServer) -> None:
    assert refresh_task.apply(args=[registered.pk]).get() == 4
    assert McpTool.objects.filter(server=registered).count() == 4


def test_a_server_that_is_down_is_recorded_unhealthy() -> None:
    server = McpServer.objects.create(name="gone", url=f"http://127.0.0.1:{free_port()}/mcp", healthy=True)
    assert mcp_server_refresh_tools(server=server) == -1
    server.refresh_from_db()
    assert not server.healthy and server.last_error


@pytest.mark.django_db(transaction=True)
async def test_a_registered_tool_is_called_through_the_registry(registered: McpServer) -> None:
    await sync_to_async(mcp_server_refresh_tools)(server=registered)
    sources = await sync_to_async(mcp_tool_sources)(server_names=["demo"])
    toolset = Toolset(sources)
    await toolset.refresh()
    names = {tool["function"]["name"] for tool in toolset.llm_tools()}
    assert "add" in names and "math_divide" in names
    record = await toolset.call("add", '{"a": 2, "b": 3}')
    assert record.success and record.result == "5" and record.source == "mcp"


@pytest.mark.django_db(transaction=True)
async def test_a_call_to_a_server_gone_down_comes_back_as_a_failed_tool_result(mcp_http: Served) -> None:
    server = await McpServer.objects.acreate(name="flaky", url=mcp_http.url)
    await sync_to_async(mcp_server_refresh_tools)(server=server)
    server.url = f"http://127.0.0.1:{free_port()}/mcp"
    await server.asave()
    toolset = Toolset(await sync_to_async(mcp_tool_sources)(server_names=["flaky"]))
    await toolset.refresh()
    record = await toolset.call("add", {"a": 1, "b": 1})
    assert not record.success and record.result


def test_disabled_servers_offer_no_tools(registered: McpServer) -> None:
    mcp_server_refresh_tools(server=registered)
    registered.enabled = False
    registered.save()
    assert mcp_tool_sources() == []


def test_the_admin_lists_servers_with_health_and_tool_counts(client, registered: McpServer) -> None:  # noqa: ANN001
    mcp_server_refresh_tools(server=registered)
    McpServer.objects.create(name="broken", url="http://127.0.0.1:9/mcp", last_error="connection refused")
    admin = get_user_model().objects.create_superuser("root", "r@example.com", "pw")
    client.force_login(admin)
    page = client.get("/admin/tools/mcpserver/").content.decode()
    assert "demo" in page and "broken" in page and "connection refused" in page
    assert '<td class="field-tool_count">4</td>' in page


def test_the_admin_action_refreshes_on_demand(client, registered: McpServer) -> None:  # noqa: ANN001
    admin = get_user_model().objects.create_superuser("root", "r@example.com", "pw")
    client.force_login(admin)
    response = client.post("/admin/tools/mcpserver/",
                           {"action": "refresh_tools", "_selected_action": [registered.pk]}, follow=True)
    assert "demo: 4 tools" in [str(m) for m in response.context["messages"]]
    assert McpTool.objects.filter(server=registered).count() == 4
