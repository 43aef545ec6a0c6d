"""A device session offers the LLM the remote MCP tools of its persona's servers, from the
cached catalogue, and calls them through the registry."""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from conversations.models import Persona
from conversations.pipeline.toolset import build_toolset
from conversations.selectors import session_config_for
from devices.auth import DeviceAuthResult
from devices.models import Device
from tools.models import McpServer
from tools.services import mcp_server_refresh_tools
from tools.tests.test_services import mcp_http  # noqa: F401  (module-scoped MCP server fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _config_for_persona_with(servers: list[McpServer]):  # noqa: ANN202
    persona = Persona.objects.create(name="Helper")
    persona.mcp_servers.set(servers)
    device = Device.objects.create(mac="aa:bb:cc:dd:ee:01", persona=persona)
    auth = DeviceAuthResult(ok=True, close_code=None, reason="", device=device, bound=True, activation_code=None)
    return session_config_for(device, auth)


async def test_the_personas_mcp_tools_are_offered_and_called(mcp_http) -> None:  # noqa: ANN001, F811
    mine = await McpServer.objects.acreate(name="demo", url=mcp_http.url)
    other = await McpServer.objects.acreate(name="other", url=mcp_http.url)
    for server in (mine, other):
        await sync_to_async(mcp_server_refresh_tools)(server=server)
    config = await sync_to_async(_config_for_persona_with)([mine])
    toolset, _ = build_toolset(config)
    await toolset.refresh()
    mcp_specs = [spec for spec in toolset.specs() if spec.source == "mcp"]
    assert {spec.origin for spec in mcp_specs} == {"demo"}
    record = await toolset.call(toolset.llm_name("mcp", "add"), {"a": 20, "b": 22})
    assert record.success and record.result == "42"

