"""Text PostgreSQL refuses, through the real server (issue 11, item 4).

PostgreSQL stores no NUL character, neither in text nor in jsonb: a gateway turn holding one
failed the whole batch insert, losing the other clients' turns with it, and a NUL in a device
tool name lost that device's tool list. Text is cleaned before it reaches the database, and a
batch that fails anyway is written again row by row.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from websockets.asyncio.client import connect

from conversations.models import Conversation, Turn
from conversations.tests.e2e import session_recorded_closed
from devices.models import Device
from devices.tests.factories import BoundDeviceFactory
from simulator.device import SimulatedDevice
from simulator.mcp_server import DeviceMcpServer, Tool
from testing.fake_openai import FakeOpenAI, Reply
from testing.server import AsgiServer

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CLIENTS = 6


async def _ask_at_once(url: str, texts: list[str]) -> list[str]:
    """Each text from its own client, all sent at the same moment; returns the session ids."""
    sockets = [await connect(url, open_timeout=20) for _ in texts]
    session_ids = [json.loads(await ws.recv())["data"]["session_id"] for ws in sockets]
    questions = [json.dumps({"type": "text_input", "text": text}) for text in texts]
    await asyncio.gather(*(ws.send(q) for ws, q in zip(sockets, questions, strict=True)))
    for ws in sockets:
        while json.loads(await ws.recv())["type"] != "llm_response":
            pass
    for ws in sockets:
        await ws.close()
    return session_ids


async def _turns_of(session_ids: list[str], count: int) -> list[Turn]:
    """The stored turns once there are `count` (database_sync_to_async closes its connection:
    the test database is dropped at the end)."""
    query = Turn.objects.filter(conversation__session_id__in=session_ids).order_by("user_text")
    for _ in range(200):
        turns = await database_sync_to_async(lambda: list(query.all()))()
        if len(turns) >= count:
            break
        await asyncio.sleep(0.05)
    return turns


async def test_a_nul_in_one_gateway_turn_loses_no_turn(asgi_server_factory: Any, fake: FakeOpenAI) -> None:
    fake.reset()
    server = asgi_server_factory(LLM_BASE_URL=fake.base_url, LLM_MODEL="fake-model", CLOUD_AUTH="open")
    fake.script(*(Reply(text=f"reply\u0000{n}") for n in range(CLIENTS)))
    texts = [f"question {n}" for n in range(CLIENTS - 1)] + ["a\u0000b"]
    session_ids = await _ask_at_once(f"{server.ws_url}/llm/v1/", texts)
    turns = await _turns_of(session_ids, CLIENTS)
    assert sorted(t.user_text for t in turns) == sorted([*texts[:-1], "ab"])
    assert all("\u0000" not in t.reply_text and t.reply_text.startswith("reply") for t in turns)
    conversations = Conversation.objects.filter(session_id__in=session_ids)
    assert await database_sync_to_async(conversations.count)() == CLIENTS


async def test_a_nul_in_a_device_tool_name_keeps_the_tool_list(asgi_server: AsgiServer) -> None:
    device = await database_sync_to_async(BoundDeviceFactory)()
    mcp = DeviceMcpServer.default()
    mcp.add_tool(Tool("self.bad\u0000name", "A tool whose name holds a NUL.\u0000"))
    sim = SimulatedDevice(asgi_server.http_url, mac=device.mac, client_id=device.client_id, mcp=mcp)
    token = await database_sync_to_async(_token)(device)
    await sim.connect(url=f"{asgi_server.ws_url}/xiaozhi/v1/", token=token)
    await sim.hello()
    stored: list[dict[str, Any]] = []
    for _ in range(200):
        stored = await database_sync_to_async(lambda: Device.objects.get(pk=device.pk).mcp_tools)()
        if stored:
            break
        await asyncio.sleep(0.05)
    session_id = sim.session_id
    await sim.close()
    await session_recorded_closed(session_id)
    names = {tool["name"] for tool in stored}
    assert len(stored) == len(mcp.tools) and "self.badname" in names
    assert "self.get_device_status" in names


def _token(device: Device) -> str:
    from devices.services import device_token_issue

    return device_token_issue(device=device)
