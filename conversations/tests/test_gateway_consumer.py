"""GatewayConsumer end to end: Channels' WebsocketCommunicator through the project's routes,
and the real server (daphne subprocess) for the connection limit, frame limits and the
documented example client. The LLM is FakeOpenAI over real HTTP. Every client sends a
gateway API key (the root conftest's `gateway_key`; CLOUD_AUTH=required is the default)."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from conversations.gateway.consumer import PROCESS
from conversations.models import Conversation, Turn
from conversations.pipeline.fallback import ProviderChain, Slot
from conversations.providers.base import LLMDelta
from conversations.routing import websocket_urlpatterns
from testing.fake_openai import Call, FakeOpenAI, Reply

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "gateway_client.py"
BATTERY = {"name": "get_battery", "description": "获取设备当前电量百分比",
           "parameters": {"type": "object", "properties": {}}}

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gateway_settings(settings: Any, fake: FakeOpenAI) -> Any:
    fake.reset()
    settings.LLM_BASE_URL = fake.base_url
    settings.LLM_MODEL = "fake-model"
    settings.LLM_TIMEOUT = 5.0
    settings.TOOLS_CLIENT_TIMEOUT = 5.0
    return settings


class Socket:
    """A WebsocketCommunicator speaking JSON, through the project's own routes."""

    def __init__(self, communicator: WebsocketCommunicator) -> None:
        self.communicator = communicator

    async def send(self, **message: Any) -> None:
        await self.communicator.send_to(text_data=json.dumps(message, ensure_ascii=False))

    async def next(self, timeout: float = 5) -> dict[str, Any]:
        return json.loads(await self.communicator.receive_from(timeout))

    async def until(self, kind: str, status: str | None = None) -> list[dict[str, Any]]:
        got = [await self.next()]
        while got[-1]["type"] != kind or (status is not None and got[-1].get("status") != status):
            got.append(await self.next())
        return got

    async def close_code(self, timeout: float = 5) -> int:
        output = await self.communicator.receive_output(timeout)
        while output["type"] != "websocket.close":
            output = await self.communicator.receive_output(timeout)
        return int(output.get("code", 1000))


@pytest.fixture
async def open_socket(gateway_settings: Any, gateway_key: str) -> AsyncIterator[Callable[..., Awaitable[Socket]]]:
    opened: list[WebsocketCommunicator] = []

    async def open_(path: str = "/llm/v1/") -> Socket:
        headers = [(b"authorization", f"Bearer {gateway_key}".encode())]
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path, headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        opened.append(communicator)
        return Socket(communicator)

    yield open_
    for communicator in opened:
        await communicator.disconnect()


async def connected(socket: Socket) -> str:
    status = await socket.next()
    assert (status["type"], status["status"]) == ("status", "connected")
    return str(status["data"]["session_id"])


def kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [m["type"] if m["type"] != "status" else f"status:{m['status']}" for m in messages]


# -- every message type ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/llm/v1/", "/llm/v1"])
async def test_the_gateway_answers_on_the_root_path_and_on_llm_v1(open_socket: Any, path: str) -> None:
    socket = await open_socket(path)
    assert len(await connected(socket)) == 32
    await socket.send(type="ping")
    pong = await socket.next()
    assert pong["type"] == "pong" and pong["timestamp"].endswith("Z")


async def test_every_message_type_of_the_seed(open_socket: Any, fake: FakeOpenAI) -> None:
    socket = await open_socket("/")
    session_id = await connected(socket)
    await socket.send(type="configure", temperature=0.5, max_tokens=256, enable_context=True)
    await socket.send(type="register_tools", tools=[BATTERY])
    registered = await socket.next()
    assert (registered["type"], registered["count"]) == ("tools_registered", 1)

    fake.script(Reply(tool_calls=[Call("get_current_time", {}), Call("get_battery", {})]), Reply(text="电量85%。"))
    await socket.send(type="text_input", text="几点了，电量多少？", session_id=session_id)
    got = await socket.until("tool_callback")
    assert kinds(got) == ["status:processing", "tool_call", "status:waiting_for_tools", "tool_callback"]
    await socket.send(type="tool_result", call_id=got[-1]["call_id"], result={"level": 85}, success=True)
    done = await socket.until("status", "idle")
    assert kinds(done) == ["llm_response", "status:idle"] and done[0]["content"] == "电量85%。"
    assert (fake.chat_requests[0].temperature, fake.chat_requests[0].max_tokens) == (0.5, 256)

    await socket.send(type="start_session", session_id=session_id)
    assert (await socket.next())["data"] == {"session_id": session_id, "resumed": True}
    await socket.send(type="end_session")
    ended = await socket.next()
    assert ended["status"] == "idle" and ended["data"]["ended_session_id"] == session_id


# -- every error code ----------------------------------------------------------------------------------------


async def _invalid_message(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    await socket.communicator.send_to(text_data="{not json")
    return await socket.next()


async def _unknown_message_type(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    await socket.send(type="sing")
    return await socket.next()


async def _session_error(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    await socket.send(type="start_session", session_id="nobody")
    return await socket.next()


async def _tool_registration_failed(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    await socket.send(type="register_tools", tools=[BATTERY, BATTERY])
    return (await socket.until("error"))[-1]


async def _invalid_tool_parameters(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    await socket.send(type="register_tools", tools=[{**BATTERY, "parameters": {"type": "object", "required": 1}}])
    return await socket.next()


async def _turn_error(socket: Socket, text: str = "hi") -> dict[str, Any]:
    await socket.send(type="text_input", text=text)
    return (await socket.until("error"))[-1]


async def _llm_error(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    fake.script(Reply(status=500, error="model not loaded"))
    return await _turn_error(socket)


async def _timeout(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    fake.script(Reply(hang=True))
    return await _turn_error(socket)


async def _tool_not_found(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    fake.script(Reply(tool_calls=[Call("open_door", {})]), Reply(text="没有这个工具。"))
    return await _turn_error(socket)


async def _client_tool(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    await socket.send(type="register_tools", tools=[BATTERY])
    await socket.until("tools_registered")
    fake.script(Reply(tool_calls=[Call("get_battery", {})]), Reply(text="好的。"))
    await socket.send(type="text_input", text="电量")
    return (await socket.until("tool_callback"))[-1]


async def _tool_execution_failed(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    callback = await _client_tool(socket, fake)
    await socket.send(type="tool_result", call_id=callback["call_id"], success=False, error="设备连接超时")
    return (await socket.until("error"))[-1]


async def _tool_result_timeout(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    await _client_tool(socket, fake)
    return (await socket.until("error"))[-1]


async def _internal_error(socket: Socket, fake: FakeOpenAI) -> dict[str, Any]:
    return await _turn_error(socket)


class BrokenLLM:
    """A provider breaking its contract (raising something other than ProviderError): the
    only way to reach the safety net, since every real failure has a typed error."""

    name = "broken"

    async def stream(self, messages: list[dict], **options: Any) -> AsyncIterator[LLMDelta]:
        yield LLMDelta(text="half")
        raise RuntimeError("bug")


ERROR_CASES: dict[str, tuple[Callable[[Socket, FakeOpenAI], Awaitable[dict[str, Any]]], dict[str, Any]]] = {
    "INVALID_MESSAGE": (_invalid_message, {}),
    "UNKNOWN_MESSAGE_TYPE": (_unknown_message_type, {}),
    "LLM_ERROR": (_llm_error, {}),
    "SESSION_ERROR": (_session_error, {}),
    "TIMEOUT": (_timeout, {"LLM_TIMEOUT": 0.3}),
    "INTERNAL_ERROR": (_internal_error, {}),
    "TOOL_NOT_FOUND": (_tool_not_found, {}),
    "TOOL_EXECUTION_FAILED": (_tool_execution_failed, {}),
    "INVALID_TOOL_PARAMETERS": (_invalid_tool_parameters, {}),
    "TOOL_RESULT_TIMEOUT": (_tool_result_timeout, {"TOOLS_CLIENT_TIMEOUT": 0.3}),
    "TOOL_REGISTRATION_FAILED": (_tool_registration_failed, {}),
}


@pytest.mark.parametrize("code", list(ERROR_CASES))
async def test_every_error_code_of_the_seed_reaches_the_client(
    open_socket: Any, gateway_settings: Any, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    scenario, overrides = ERROR_CASES[code]
    for name, value in overrides.items():
        setattr(gateway_settings, name, value)
    if code == "INTERNAL_ERROR":
        monkeypatch.setattr(PROCESS, "llm_factory",
                            lambda specs: ProviderChain("llm", [Slot("broken", BrokenLLM(), 60.0)]))
    socket = await open_socket()
    await connected(socket)
    error = await scenario(socket, fake)
    assert error["type"] == "error" and error["code"] == code
    assert error["message"] and isinstance(error["details"], str) and error["timestamp"].endswith("Z")
    await socket.send(type="ping")
    assert (await socket.until("pong"))[-1]["type"] == "pong"  # the connection survives every error


# -- limits -------------------------------------------------------------------------------------------------


async def test_a_message_over_the_size_limit_gets_an_error_then_close_1009(open_socket: Any,
                                                                          gateway_settings: Any) -> None:
    gateway_settings.CLOUD_MAX_MESSAGE_BYTES = 2048
    socket = await open_socket()
    await connected(socket)
    await socket.send(type="text_input", text="x" * 4096)
    error = await socket.next()
    assert (error["code"], error["message"]) == ("INVALID_MESSAGE", "Message too large")
    assert await socket.close_code() == 1009


async def test_a_client_silent_past_the_ping_timeout_is_disconnected(open_socket: Any, gateway_settings: Any) -> None:
    gateway_settings.CLOUD_PING_TIMEOUT = 0.3
    gateway_settings.CLOUD_PING_INTERVAL = 0.05
    socket = await open_socket()
    await connected(socket)
    started = time.monotonic()
    assert await socket.close_code() == 1001
    assert 0.3 <= time.monotonic() - started < 2


async def test_connections_over_the_limit_are_closed_with_1013(open_socket: Any, gateway_settings: Any) -> None:
    gateway_settings.CLOUD_MAX_CONNECTIONS = 2
    first, second = await open_socket(), await open_socket()
    await connected(first)
    await connected(second)
    third = await open_socket()
    assert await third.close_code() == 1013
    await first.communicator.disconnect()
    fourth = await open_socket()
    await connected(fourth)  # a freed slot is reused


# -- history ---------------------------------------------------------------------------------------------------


async def test_exchanges_are_stored_as_gateway_conversations(open_socket: Any, fake: FakeOpenAI) -> None:
    socket = await open_socket()
    session_id = await connected(socket)
    fake.script(Reply(tool_calls=[Call("get_current_time", {})]), Reply(text="现在十点。"), Reply(text="不客气。"))
    for text in ("几点了？", "谢谢"):
        await socket.send(type="text_input", text=text)
        await socket.until("status", "idle")
    await socket.communicator.disconnect()

    socket = await open_socket()  # reconnect and resume: the same conversation goes on
    await connected(socket)
    await socket.send(type="start_session", session_id=session_id)
    await socket.next()
    fake.script(Reply(status=500, error="down"))
    await socket.send(type="text_input", text="还在吗？")
    await socket.until("status", "idle")
    await socket.send(type="end_session")
    await socket.next()
    await socket.communicator.disconnect()

    conversation = await Conversation.objects.aget(session_id=session_id)
    assert conversation.source == Conversation.SOURCE_GATEWAY and conversation.ended_at is not None
    turns = [t async for t in Turn.objects.filter(conversation=conversation).order_by("index")]
    assert [(t.index, t.user_text, t.reply_text) for t in turns] == [
        (0, "几点了？", "现在十点。"), (1, "谢谢", "不客气。"), (2, "还在吗？", "")]  # fmt: skip
    assert turns[0].tool_calls[0]["name"] == "get_current_time" and turns[2].error.startswith("LLM_ERROR")
    assert turns[0].providers == {"llm": "openai", "model": "fake-model"} and turns[0].timings["total_ms"] > 0


# -- the real server -------------------------------------------------------------------------------------------


async def _hello(url: str) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await connect(url, max_size=None, open_timeout=20)
    return ws, json.loads(await asyncio.wait_for(ws.recv(), 20))


async def _ask(ws: ClientConnection, text: str) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "text_input", "text": text}))
    while (message := json.loads(await ws.recv()))["type"] != "llm_response":
        pass
    return message


@pytest.mark.e2e
async def test_it_holds_100_clients_at_once_and_refuses_the_101st_with_1013(
    asgi_server_factory: Any, fake: FakeOpenAI, gateway_key: str
) -> None:
    fake.reset()
    server = asgi_server_factory(LLM_BASE_URL=fake.base_url, CLOUD_MAX_CONNECTIONS="100")
    url = f"{server.ws_url}/?token={gateway_key}"
    clients = await asyncio.gather(*(_hello(url) for _ in range(100)))
    assert all(first["status"] == "connected" for _, first in clients)
    assert len({first["data"]["session_id"] for _, first in clients}) == 100

    extra = await connect(url, open_timeout=20)
    with pytest.raises(ConnectionClosed) as refused:
        await asyncio.wait_for(extra.recv(), 10)
    assert refused.value.rcvd is not None and refused.value.rcvd.code == 1013

    replies = await asyncio.gather(*(_ask(ws, f"client {n}") for n, (ws, _) in enumerate(clients)))
    assert all(reply["content"] == "好的。" for reply in replies)
    await asyncio.gather(*(ws.close() for ws, _ in clients))
    await _until_admitted(url)


async def _until_admitted(url: str) -> None:
    """The server frees the slots as it processes the closes: a new client gets in soon."""
    deadline = time.monotonic() + 10
    while True:
        try:
            ws, first = await _hello(url)
            await ws.close()
            assert first["status"] == "connected"
            return
        except ConnectionClosed:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.e2e
async def test_the_documented_example_client_runs_against_the_server(
    asgi_server_factory: Any, fake: FakeOpenAI, gateway_key: str
) -> None:
    fake.reset()
    fake.on("电量", Reply(tool_calls=[Call("get_battery", {})]))
    fake.on("音量", Reply(tool_calls=[Call("set_volume", {"volume": 50})]))
    fake.on_tool_result(Reply(text="您的设备电量还剩85%。"), pattern="level")
    fake.on_tool_result(Reply(text="**已将音量**设置为50 🔊"), pattern="volume")
    server = asgi_server_factory(
        LLM_BASE_URL=fake.base_url, CLOUD_MAX_MESSAGE_BYTES="65536", CLOUD_PING_TIMEOUT="2", CLOUD_PING_INTERVAL="0.2"
    )
    url = f"{server.ws_url}/llm/v1/"
    run = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(EXAMPLE), "--url", url, "--key", gateway_key],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "Registered 2 tools" in run.stdout
    assert "Response: 您的设备电量还剩85%。" in run.stdout and "Response: 已将音量设置为50" in run.stdout
    session_id = run.stdout.split("Session ID: ")[1].split()[0]
    # The second question carries the first exchange: the example enables the context.
    assert fake.chat_requests[-1].messages[1:3] == [
        {"role": "user", "content": "我的电量还剩多少？"},
        {"role": "assistant", "content": "您的设备电量还剩85%。"},
    ]

    turns = await _stored_turns(session_id, 2)
    assert [t.user_text for t in turns] == ["我的电量还剩多少？", "把音量调到50"]
    assert [t.tool_calls[0]["name"] for t in turns] == ["get_battery", "set_volume"]

    ws, _ = await _hello(f"{url}?token={gateway_key}")  # over CLOUD_MAX_MESSAGE_BYTES: an error, then 1009
    await ws.send(json.dumps({"type": "text_input", "text": "x" * 70_000}))
    error = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert (error["code"], error["message"]) == ("INVALID_MESSAGE", "Message too large")
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

    silent, _ = await _hello(f"{url}?token={gateway_key}")  # nothing sent for CLOUD_PING_TIMEOUT: 1001
    with pytest.raises(ConnectionClosed) as idle:
        await asyncio.wait_for(silent.recv(), 10)
    assert idle.value.rcvd is not None and idle.value.rcvd.code == 1001


async def _stored_turns(session_id: str, count: int) -> list[Turn]:
    deadline = time.monotonic() + 10
    while True:
        turns = [t async for t in Turn.objects.filter(
            conversation__session_id=session_id, conversation__source="gateway").order_by("index")]  # fmt: skip
        if len(turns) >= count or time.monotonic() > deadline:
            return turns
        await asyncio.sleep(0.1)
