"""GatewaySession in plain asyncio against the scripted LLM (FakeOpenAI over real HTTP).

No Django, no socket to the client: the session's transport records what it sends.
"""
from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest

from conversations.gateway.protocol import CLOSE_IDLE, CLOSE_TAKEN_OVER, CLOSE_TOO_BIG, ErrorCode, GatewayError
from conversations.gateway.session import GatewaySession
from conversations.gateway.session_config import SERVER_TOOLS, GatewayConfig
from conversations.gateway.store import ChatOptions, SessionStore
from conversations.pipeline.fallback import ProviderChain, Slot
from conversations.providers.base import LLM, LLMDelta
from conversations.providers.llm.openai_compat import OpenAILLM
from conversations.turns.history import ConversationKey, HistoryWriter, PendingTurn
from conversations.turns.record import TurnRecord
from testing.fake_openai import Call, FakeOpenAI, Reply
from tools.builtin import SessionToolState

BATTERY = {"name": "get_battery", "description": "获取设备当前电量百分比",
           "parameters": {"type": "object", "properties": {}}}
VOLUME = {
    "name": "set_volume",
    "description": "设置设备音量",
    "parameters": {
        "type": "object",
        "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["volume"],
    },
}
CONFIG = GatewayConfig(model="fake-model", llm_timeout=5.0, client_tool_timeout=5.0, server_tool_timeout=5.0)


class Client:
    """The session's transport: records messages and closes, like the consumer would."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.closed: int | None = None
        self.closed_event = asyncio.Event()

    async def send_text(self, text: str) -> None:
        await self.inbox.put(json.loads(text))

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        self.closed = code
        self.closed_event.set()

    async def next(self, timeout: float = 5.0) -> dict[str, Any]:
        return await asyncio.wait_for(self.inbox.get(), timeout)

    async def until_idle(self) -> list[dict[str, Any]]:
        """Everything up to and including the `idle` that ends a turn."""
        got: list[dict[str, Any]] = []
        while not got or got[-1] != {**got[-1], "type": "status", "status": "idle"}:
            got.append(await self.next())
        return got

    def pending(self) -> list[dict[str, Any]]:
        got = []
        while not self.inbox.empty():
            got.append(self.inbox.get_nowait())
        return got


class Hooks:
    def __init__(self) -> None:
        self.turns: list[TurnRecord] = []
        self.ended: list[str] = []

    def turn_finished(self, turn: TurnRecord) -> None:
        self.turns.append(turn)

    def session_ended(self, session_id: str) -> None:
        self.ended.append(session_id)


class Gateway:
    """A store, an LLM and the sessions opened on them in one test."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.store = SessionStore(timeout=60, cleanup_interval=60)
        self.sessions: list[GatewaySession] = []

    async def open(self, **config: Any) -> tuple[GatewaySession, Client, Hooks]:
        client, hooks = Client(), Hooks()
        chain = ProviderChain("llm", [Slot("openai", self.llm, timeout=60.0)])  # as gateway_llm_chain() builds it
        session = GatewaySession(client, replace(CONFIG, **config), self.store, chain, hooks)
        self.sessions.append(session)
        await session.start()
        connected = await client.next()
        assert connected["status"] == "connected" and connected["data"]["session_id"] == session.session_id
        return session, client, hooks


@pytest.fixture
async def gateway(fake: FakeOpenAI) -> AsyncIterator[Gateway]:
    fake.reset()
    llm = OpenAILLM(fake.base_url, timeout=10)
    gw = Gateway(llm)
    yield gw
    for session in gw.sessions:
        await session.aclose()


async def send(session: GatewaySession, **message: Any) -> None:
    await session.feed(json.dumps(message, ensure_ascii=False))


def types(messages: list[dict[str, Any]]) -> list[str]:
    return [m["type"] if m["type"] != "status" else f"status:{m['status']}" for m in messages]


def errors(messages: list[dict[str, Any]]) -> list[str]:
    return [m["code"] for m in messages if m["type"] == "error"]


# -- plain turns -------------------------------------------------------------------------------------


async def test_a_turn_sends_processing_a_cleaned_llm_response_and_idle(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open()
    fake.script(Reply(text="😊 **今天**天气晴朗★，温度约22度。"))
    await send(session, type="text_input", text="今天天气怎么样？", session_id=session.session_id)
    got = await client.until_idle()
    assert types(got) == ["status:processing", "llm_response", "status:idle"]
    assert got[1]["content"] == "今天天气晴朗，温度约22度。"
    assert got[1]["is_final"] is True and got[1]["tool_calls"] == []
    [request] = fake.chat_requests
    assert (request.model, request.temperature, request.max_tokens) == ("fake-model", 0.7, 2048)
    offered = {t["function"]["name"] for t in request.tools or []}
    assert offered == SERVER_TOOLS


async def test_configure_changes_the_llm_options_without_a_reply(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    await send(session, type="configure", temperature=0.2, max_tokens=64)
    await send(session, type="text_input", text="hi")
    await client.until_idle()
    assert (fake.chat_requests[0].temperature, fake.chat_requests[0].max_tokens) == (0.2, 64)


async def test_an_invalid_configure_is_refused_and_changes_nothing(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    await send(session, type="configure", temperature=0.1, max_tokens=5000)
    error = await client.next()
    assert (error["code"], error["message"]) == ("INVALID_MESSAGE", "Field 'max_tokens' is out of range")
    await send(session, type="text_input", text="hi")
    await client.until_idle()
    assert fake.chat_requests[0].temperature == 0.7


async def test_ping_gets_pong_at_once_even_during_a_turn(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    fake.script(Reply(text="slow", first_token_delay=0.3))
    await send(session, type="text_input", text="hi")
    assert (await client.next())["status"] == "processing"
    await send(session, type="ping")
    assert (await client.next())["type"] == "pong"
    assert types(await client.until_idle()) == ["llm_response", "status:idle"]


async def test_a_second_text_input_waits_for_the_first_turn(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    fake.script(Reply(text="第一。", first_token_delay=0.2), Reply(text="第二。"))
    await send(session, type="text_input", text="one")
    await send(session, type="text_input", text="two")
    first, second = await client.until_idle(), await client.until_idle()
    assert [first[1]["content"], second[1]["content"]] == ["第一。", "第二。"]


async def test_too_many_waiting_requests_are_refused(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open(max_queued_requests=2)
    fake.script(Reply(text="slow", first_token_delay=0.3))
    for n in range(4):  # one runs, two wait, the fourth is one too many
        await send(session, type="text_input", text=f"t{n}")
        await asyncio.sleep(0.02)
    got = [await client.next() for _ in range(2)]
    assert errors(got) == ["INVALID_MESSAGE"] and got[1]["message"] == "Too many pending requests"


# -- failures of the LLM -------------------------------------------------------------------------------


async def test_an_llm_failure_is_llm_error(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open()
    fake.script(Reply(status=500, error="model not loaded"))
    await send(session, type="text_input", text="hi")
    got = await client.until_idle()
    assert types(got) == ["status:processing", "error", "status:idle"]
    assert got[1]["code"] == "LLM_ERROR" and "model not loaded" in got[1]["details"]
    await session.aclose()
    assert hooks.turns[0].error.startswith("LLM_ERROR")


async def test_an_llm_that_does_not_answer_in_time_is_timeout(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open(llm_timeout=0.3)
    fake.script(Reply(hang=True))
    await send(session, type="text_input", text="hi")
    got = await client.until_idle()
    assert errors(got) == ["TIMEOUT"]


async def test_a_provider_breaking_its_contract_is_internal_error(gateway: Gateway) -> None:
    class BrokenLLM:
        """FakeOpenAI cannot make our own code fail: this provider raises a non-ProviderError."""

        name = "broken"

        async def stream(self, messages: list[dict], **options: Any) -> AsyncIterator[LLMDelta]:
            yield LLMDelta(text="half")
            raise RuntimeError("bug")

    gateway.llm = BrokenLLM()  # type: ignore[assignment]
    session, client, _ = await gateway.open()
    await send(session, type="text_input", text="hi")
    got = await client.until_idle()
    assert types(got) == ["status:processing", "error", "status:idle"] and errors(got) == ["INTERNAL_ERROR"]
    await send(session, type="ping")
    assert (await client.next())["type"] == "pong"  # the connection lives on


# -- server tools --------------------------------------------------------------------------------------


async def test_a_server_tool_call_is_announced_with_its_result_and_duration(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open()
    fake.script(Reply(tool_calls=[Call("set_response_language", {"language": "en"})]), Reply(text="OK, English."))
    await send(session, type="text_input", text="speak English")
    got = await client.until_idle()
    assert types(got) == ["status:processing", "tool_call", "llm_response", "status:idle"]
    notice = got[1]
    assert notice["tool_name"] == "set_response_language" and notice["arguments"] == {"language": "en"}
    assert notice["result"] == {"language": "en", "name": "English"} and notice["success"] is True
    assert isinstance(notice["duration_ms"], float)
    assert got[2]["tool_calls"] == [{"tool_name": "set_response_language", "source": "server",
                                     "arguments": {"language": "en"}, "success": True,
                                     "duration_ms": got[2]["tool_calls"][0]["duration_ms"]}]  # fmt: skip
    second = fake.chat_requests[1].messages
    assert second[-1]["role"] == "tool" and json.loads(second[-1]["content"])["language"] == "en"
    await send(session, type="text_input", text="again")
    await client.until_idle()
    assert fake.chat_requests[2].messages[0]["content"].endswith("Reply in English.")


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A port that accepts connections and never answers: a weather service that hangs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1/search"


async def test_a_server_tool_over_its_timeout_is_tool_execution_failed(
    gateway: Gateway, fake: FakeOpenAI, black_hole: str
) -> None:
    session, client, _ = await gateway.open(server_tool_timeout=0.3, geocoding_url=black_hole)
    fake.script(Reply(tool_calls=[Call("get_weather", {"city": "北京"})]), Reply(text="查不到天气。"))
    await send(session, type="text_input", text="北京天气")
    got = await client.until_idle()
    assert types(got) == ["status:processing", "tool_call", "error", "llm_response", "status:idle"]
    assert got[1]["success"] is False and errors(got) == ["TOOL_EXECUTION_FAILED"]
    assert "0.3 seconds" in fake.chat_requests[1].messages[-1]["content"]


async def test_an_unknown_tool_is_tool_not_found_and_the_model_is_told(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    fake.script(Reply(tool_calls=[Call("play_music", {})]), Reply(text="我不会放音乐。"))
    await send(session, type="text_input", text="放音乐")
    got = await client.until_idle()
    assert types(got) == ["status:processing", "error", "llm_response", "status:idle"]
    assert got[1]["code"] == "TOOL_NOT_FOUND" and "play_music" in got[1]["details"]
    assert "no tool named 'play_music'" in fake.chat_requests[1].messages[-1]["content"]


async def test_arguments_against_the_schema_are_invalid_tool_parameters(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    await send(session, type="register_tools", tools=[VOLUME])
    await client.next()
    fake.script(Reply(tool_calls=[Call("set_volume", {"volume": 500})]), Reply(text="音量范围是0到100。"))
    await send(session, type="text_input", text="音量500")
    got = await client.until_idle()
    assert errors(got) == ["INVALID_TOOL_PARAMETERS"] and "tool_callback" not in types(got)


# -- client tools -----------------------------------------------------------------------------------------


async def register(session: GatewaySession, client: Client, *tools: dict[str, Any]) -> dict[str, Any]:
    await send(session, type="register_tools", tools=list(tools))
    return await client.next()


async def test_tools_registered_lists_each_tool(gateway: Gateway) -> None:
    session, client, _ = await gateway.open()
    reply = await register(session, client, BATTERY, VOLUME)
    assert reply["type"] == "tools_registered" and reply["count"] == 2
    assert reply["tools"] == [{"name": "get_battery", "status": "registered"},
                              {"name": "set_volume", "status": "registered"}]  # fmt: skip


async def test_failed_registrations_come_with_their_error_codes(gateway: Gateway) -> None:
    session, client, _ = await gateway.open(client_tools_max=3)
    await register(session, client, BATTERY)
    bad_schema = {**VOLUME, "name": "bad_schema", "parameters": {"type": "object", "properties": 5}}
    await send(session, type="register_tools", tools=[BATTERY, {**BATTERY, "name": "1tool"}, bad_schema])
    got = [await client.next() for _ in range(4)]
    assert errors(got) == ["TOOL_REGISTRATION_FAILED", "TOOL_REGISTRATION_FAILED", "INVALID_TOOL_PARAMETERS"]
    assert got[-1]["type"] == "tools_registered" and got[-1]["count"] == 0
    assert [(t["name"], t["status"], t.get("error")) for t in got[-1]["tools"]] == [
        ("get_battery", "failed", "Tool name already exists"),
        ("1tool", "failed", "Invalid tool name: tool name must start with a letter or an underscore"),
        ("bad_schema", "failed", "Tool parameters are not a valid JSON Schema"),
    ]
    await send(session, type="register_tools",
               tools=[VOLUME, {**BATTERY, "name": "third"}, {**BATTERY, "name": "fourth"}])
    got = [await client.next() for _ in range(2)]
    assert errors(got) == ["TOOL_REGISTRATION_FAILED"] and got[-1]["count"] == 2
    assert [(t["name"], t["status"], t.get("error")) for t in got[-1]["tools"]] == [
        ("set_volume", "registered", None),
        ("third", "registered", None),
        ("fourth", "failed", "Too many tools (at most 3 per connection)"),
    ]


async def test_client_tools_can_be_disabled(gateway: Gateway) -> None:
    session, client, _ = await gateway.open(client_tools_enabled=False)
    await send(session, type="register_tools", tools=[BATTERY])
    got = [await client.next(), await client.next()]
    assert errors(got) == ["TOOL_REGISTRATION_FAILED"] and got[1]["count"] == 0


async def test_a_client_tool_is_called_back_and_its_result_reaches_the_model(gateway: Gateway,
                                                                            fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open()
    await register(session, client, BATTERY)
    fake.script(Reply(tool_calls=[Call("get_battery", {})]), Reply(text="您的设备电量还剩85%"))
    await send(session, type="text_input", text="我的电量还剩多少？")
    assert types([await client.next(), await client.next()]) == ["status:processing", "status:waiting_for_tools"]
    callback = await client.next()
    assert callback["type"] == "tool_callback" and callback["tool_name"] == "get_battery"
    assert callback["arguments"] == {}
    await send(session, type="tool_result", call_id=callback["call_id"], result={"level": 85, "charging": False},
               success=True)  # fmt: skip
    got = await client.until_idle()
    assert types(got) == ["llm_response", "status:idle"] and got[0]["content"] == "您的设备电量还剩85%"
    assert json.loads(fake.chat_requests[1].messages[-1]["content"]) == {"level": 85, "charging": False}
    await send(session, type="tool_result", call_id=callback["call_id"], result=1, success=True)
    late = await client.next()
    assert (late["code"], late["message"]) == ("INVALID_MESSAGE", "call_id was already answered")


async def test_a_mixed_turn_runs_server_tools_then_waits_for_all_client_tools(gateway: Gateway,
                                                                              fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    await register(session, client, BATTERY, VOLUME)
    calls = [Call("set_volume", {"volume": 50}), Call("get_current_time", {}), Call("get_battery", {})]
    fake.script(Reply(tool_calls=calls), Reply(text="已将音量设置为50。"))
    await send(session, type="text_input", text="设置音量50并告诉我时间和电量")
    got = [await client.next() for _ in range(5)]
    assert types(got) == ["status:processing", "tool_call", "status:waiting_for_tools", "tool_callback",
                          "tool_callback"]
    assert got[1]["tool_name"] == "get_current_time" and got[2]["data"]["pending_tools"] == 2
    by_name = {m["tool_name"]: m for m in got[3:]}
    # Answer in the other order: results still reach the model in its own call order.
    await send(session, type="tool_result", call_id=by_name["get_battery"]["call_id"], result={"level": 85})
    await send(session, type="tool_result", call_id=by_name["set_volume"]["call_id"], result={"volume": 50})
    done = await client.until_idle()
    assert types(done) == ["llm_response", "status:idle"]
    assert [t["tool_name"] for t in done[0]["tool_calls"]] == ["set_volume", "get_current_time", "get_battery"]
    tool_messages = [m for m in fake.chat_requests[1].messages if m["role"] == "tool"]
    assert [json.loads(m["content"]) for m in (tool_messages[0], tool_messages[2])] == [{"volume": 50}, {"level": 85}]


async def test_a_client_tool_without_an_answer_is_tool_result_timeout(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open(client_tool_timeout=0.2)
    await register(session, client, BATTERY)
    fake.script(Reply(tool_calls=[Call("get_battery", {})]), Reply(text="设备没有响应。"))
    await send(session, type="text_input", text="电量")
    got = await client.until_idle()
    assert types(got) == ["status:processing", "status:waiting_for_tools", "tool_callback", "error", "llm_response",
                          "status:idle"]  # fmt: skip
    call_id = got[2]["call_id"]
    assert (got[3]["code"], got[3]["message"]) == ("TOOL_RESULT_TIMEOUT", "Tool execution timeout")
    assert call_id in got[3]["details"]
    assert "did not answer within 0.2 seconds" in fake.chat_requests[1].messages[-1]["content"]
    await send(session, type="tool_result", call_id=call_id, result={"level": 85}, success=True)
    late = await client.next()
    assert (late["code"], late["message"]) == ("INVALID_MESSAGE", "call_id has expired")


async def test_a_client_reporting_failure_is_tool_execution_failed(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    await register(session, client, BATTERY)
    fake.script(Reply(tool_calls=[Call("get_battery", {})]), Reply(text="设备连接超时了。"))
    await send(session, type="text_input", text="电量")
    callback = [m for m in [await client.next() for _ in range(3)] if m["type"] == "tool_callback"][0]
    await send(session, type="tool_result", call_id=callback["call_id"], result=None, success=False,
               error="设备连接超时")
    got = await client.until_idle()
    assert types(got) == ["error", "llm_response", "status:idle"]
    assert got[0]["code"] == "TOOL_EXECUTION_FAILED" and "设备连接超时" in got[0]["details"]
    assert fake.chat_requests[1].messages[-1]["content"] == "Error: 设备连接超时"


async def test_an_unknown_call_id_is_invalid_message(gateway: Gateway) -> None:
    session, client, _ = await gateway.open()
    await send(session, type="tool_result", call_id="nope", result={}, success=True)
    error = await client.next()
    assert (error["code"], error["message"]) == ("INVALID_MESSAGE", "Unknown call_id")


async def test_closing_drops_the_client_tools_and_stops_a_waiting_turn(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open()
    await register(session, client, BATTERY)
    fake.script(Reply(tool_calls=[Call("get_battery", {})]))
    await send(session, type="text_input", text="电量")
    while (await client.next())["type"] != "tool_callback":
        pass
    await session.aclose()
    assert session.client_tools.names == [] and session.client_tools.pending == 0
    assert hooks.turns[0].interrupted is True and hooks.turns[0].user_text == "电量"
    assert session.session_id in gateway.store  # kept for a resume


# -- sessions and context (seed §6) ----------------------------------------------------------------------


async def test_enable_context_false_sends_only_the_new_message(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    fake.script(Reply(text="你是小明"), Reply(text="我不知道。"))
    await send(session, type="text_input", text="我叫什么名字？")
    await client.until_idle()
    await send(session, type="text_input", text="我刚才问什么？")
    await client.until_idle()
    system, *rest = fake.chat_requests[1].messages
    assert system["role"] == "system" and "听语AI" in system["content"]
    assert rest == [{"role": "user", "content": "我刚才问什么？"}]  # seed §6.3, disabled (the default)


async def test_enable_context_true_sends_the_history_first(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    await send(session, type="configure", enable_context=True)
    fake.script(Reply(text="你是小明"), Reply(text="你问我你叫什么名字。"))
    await send(session, type="text_input", text="我叫什么名字？")
    await client.until_idle()
    await send(session, type="text_input", text="我刚才问什么？")
    await client.until_idle()
    assert fake.chat_requests[1].messages[1:] == [  # seed §6.3, enabled
        {"role": "user", "content": "我叫什么名字？"},
        {"role": "assistant", "content": "你是小明"},
        {"role": "user", "content": "我刚才问什么？"},
    ]


async def test_history_keeps_at_most_ten_messages(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open(enable_context=True)
    for n in range(7):
        fake.script(Reply(text=f"答{n}"))
        await send(session, type="text_input", text=f"问{n}")
        await client.until_idle()
    last = fake.chat_requests[-1].messages[1:]
    assert len(last) == 11 and last[0] == {"role": "user", "content": "问1"}
    assert last[-1] == {"role": "user", "content": "问6"}


async def test_a_session_is_resumed_by_id_after_a_reconnect(gateway: Gateway, fake: FakeOpenAI) -> None:
    first, client, _ = await gateway.open()
    session_id = first.session_id
    await send(first, type="configure", enable_context=True)
    fake.script(Reply(text="你好，小明。"), Reply(text="你叫小明。"))
    await send(first, type="text_input", text="我叫小明")
    await client.until_idle()
    await first.aclose()
    second, client2, _ = await gateway.open()
    await send(second, type="start_session", session_id=session_id)
    assert (await client2.next())["data"] == {"session_id": session_id, "resumed": True}
    await send(second, type="text_input", text="我刚才叫什么名字？", session_id=session_id)
    got = await client2.until_idle()
    assert got[1]["content"] == "你叫小明。"
    assert fake.chat_requests[1].messages[1:3] == [{"role": "user", "content": "我叫小明"},
                                                   {"role": "assistant", "content": "你好，小明。"}]  # fmt: skip


async def test_text_input_with_another_session_id_resumes_that_session(gateway: Gateway, fake: FakeOpenAI) -> None:
    first, client, _ = await gateway.open()
    old_id = first.session_id
    await first.aclose()
    second, client2, _ = await gateway.open()
    await send(second, type="text_input", text="hi", session_id=old_id)
    got = await client2.until_idle()
    assert types(got) == ["status:connected", "status:processing", "llm_response", "status:idle"]
    assert second.session_id == old_id


async def test_unknown_and_expired_sessions_are_session_error(gateway: Gateway) -> None:
    session, client, _ = await gateway.open()
    await send(session, type="start_session", session_id="no-such-session")
    error = await client.next()
    assert (error["code"], error["message"]) == ("SESSION_ERROR", "Session not found")
    other, _, _ = await gateway.open()
    expired_id = other.session_id
    await other.aclose()
    gateway.store.timeout = 0.05
    await asyncio.sleep(0.1)
    assert await gateway.store.sweep() == [expired_id]
    await send(session, type="text_input", text="hi", session_id=expired_id)
    got = await client.until_idle()
    assert types(got) == ["error", "status:idle"]
    assert (got[0]["code"], got[0]["message"]) == ("SESSION_ERROR", "Session expired")


async def test_start_session_without_id_starts_afresh_keeping_the_options(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, _ = await gateway.open()
    old_id = session.session_id
    await send(session, type="configure", enable_context=True, temperature=0.3)
    await send(session, type="text_input", text="one")
    await client.until_idle()
    await send(session, type="start_session")
    connected = await client.next()
    assert connected["status"] == "connected" and connected["data"]["session_id"] not in ("", old_id)
    await send(session, type="text_input", text="two")
    await client.until_idle()
    assert fake.chat_requests[1].messages[1:] == [{"role": "user", "content": "two"}]
    assert fake.chat_requests[1].temperature == 0.3


async def test_end_session_forgets_the_session_and_starts_a_new_one(gateway: Gateway) -> None:
    session, client, hooks = await gateway.open()
    old_id = session.session_id
    await send(session, type="end_session")
    idle = await client.next()
    assert idle["status"] == "idle" and idle["data"] == {"session_id": session.session_id, "ended_session_id": old_id}
    assert old_id not in gateway.store and session.session_id in gateway.store
    await send(session, type="start_session", session_id=old_id)
    assert (await client.next())["code"] == "SESSION_ERROR"
    await session.aclose()
    assert hooks.ended == [old_id]


async def test_a_session_resumed_elsewhere_closes_its_old_connection(gateway: Gateway) -> None:
    first, client, _ = await gateway.open()
    second, client2, _ = await gateway.open()
    await send(second, type="start_session", session_id=first.session_id)
    assert (await client2.next())["data"]["resumed"] is True
    error = await client.next()
    assert (error["code"], error["message"]) == ("SESSION_ERROR", "Session taken over")
    await asyncio.wait_for(client.closed_event.wait(), 2)
    assert client.closed == CLOSE_TAKEN_OVER


async def test_finished_turns_are_handed_to_the_hooks(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open()
    fake.script(Reply(tool_calls=[Call("get_current_time", {})]), Reply(text="现在是十点。"))
    await send(session, type="text_input", text="几点了？")
    await client.until_idle()
    await session.aclose()
    [turn] = hooks.turns
    assert (turn.session_id, turn.user_text, turn.reply_text, turn.error) == (session.session_id, "几点了？",
                                                                             "现在是十点。", "")  # fmt: skip
    assert turn.tool_calls[0]["name"] == "get_current_time" and turn.tool_calls[0]["success"] is True
    assert turn.timings["total_ms"] >= turn.timings["llm_ms"] > 0


# -- limits --------------------------------------------------------------------------------------------------


async def test_a_message_over_the_size_limit_is_refused_and_the_socket_closed(gateway: Gateway) -> None:
    session, client, _ = await gateway.open(max_message_bytes=1024)
    await send(session, type="text_input", text="好" * 400)  # 1,200 bytes of UTF-8 in 400 characters
    error = await client.next()
    assert (error["code"], error["message"]) == ("INVALID_MESSAGE", "Message too large")
    assert client.closed == CLOSE_TOO_BIG


async def test_binary_frames_are_invalid_messages(gateway: Gateway) -> None:
    session, client, _ = await gateway.open()
    await session.feed_bytes(b"\x00\x01")
    assert (await client.next())["code"] == "INVALID_MESSAGE"


async def test_bad_frames_get_the_seed_error_codes(gateway: Gateway) -> None:
    session, client, _ = await gateway.open()
    for frame in ("{oops", '{"type": "dance"}', '{"type": "text_input", "text": ""}'):
        await session.feed(frame)
    got = [await client.next() for _ in range(3)]
    assert errors(got) == ["INVALID_MESSAGE", "UNKNOWN_MESSAGE_TYPE", "INVALID_MESSAGE"]
    assert got[2]["message"] == "Text cannot be empty"


async def test_a_silent_connection_is_closed_after_the_ping_timeout(gateway: Gateway) -> None:
    session, client, _ = await gateway.open(idle_timeout=0.4, idle_check_interval=0.05)
    for _ in range(4):  # pings keep it open well past the timeout
        await asyncio.sleep(0.2)
        await send(session, type="ping")
    assert client.closed is None
    await asyncio.wait_for(client.closed_event.wait(), 2)
    assert client.closed == CLOSE_IDLE


async def test_every_error_code_of_the_seed_is_produced_here() -> None:
    """Bookkeeping: the tests above cover each code; keep this list in step with them."""
    covered = {
        "INVALID_MESSAGE", "UNKNOWN_MESSAGE_TYPE", "LLM_ERROR", "SESSION_ERROR", "TIMEOUT", "INTERNAL_ERROR",
        "TOOL_NOT_FOUND", "TOOL_EXECUTION_FAILED", "INVALID_TOOL_PARAMETERS", "TOOL_RESULT_TIMEOUT",
        "TOOL_REGISTRATION_FAILED",
    }  # fmt: skip
    assert covered == {code.value for code in ErrorCode}


# -- the session store and the history writer (pure) -----------------------------------------------------


async def test_the_sweeper_expires_released_sessions_and_reports_them() -> None:
    expired: list[list[str]] = []

    async def on_expired(ids: list[str]) -> None:
        expired.append(ids)

    store = SessionStore(timeout=0.1, cleanup_interval=0.05, on_expired=on_expired)
    held, released = store.create(ChatOptions(), SessionToolState()), store.create(ChatOptions(), SessionToolState())
    owner = object()
    store.attach(held, owner, lambda: None)
    store.start_sweeper()
    await asyncio.sleep(0.4)
    await store.stop_sweeper()
    assert expired == [[released.session_id]] and not store.sweeping
    assert held.session_id in store  # a connection still holds it
    store.detach(held, owner)
    with pytest.raises(GatewayError, match="Session expired"):
        store.get(released.session_id)


async def test_a_full_store_drops_the_longest_idle_released_session() -> None:
    now = [0.0]
    store = SessionStore(timeout=60, cleanup_interval=60, max_sessions=2, clock=lambda: now[0])
    oldest = store.create(ChatOptions(), SessionToolState())
    now[0] = 1.0
    newer = store.create(ChatOptions(), SessionToolState())
    store.attach(oldest, object(), lambda: None)  # held: never dropped for room
    store.create(ChatOptions(), SessionToolState())
    assert oldest.session_id in store and newer.session_id not in store and len(store) == 2


def test_history_drops_the_oldest_messages_and_starts_with_a_question() -> None:
    record = SessionStore(timeout=60, cleanup_interval=60).create(ChatOptions(), SessionToolState())
    for n in range(3):
        record.add_exchange(f"q{n}", f"a{n}", limit=3)
    assert record.history == [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]


GATEWAY_S = ConversationKey("s", "gateway", client_address="127.0.0.1:1")


async def test_the_history_writer_stores_a_burst_in_one_write_and_flushes_on_close() -> None:
    batches: list[tuple[list[int], list[str]]] = []

    async def flush(turns: list[PendingTurn], ended: list[ConversationKey]) -> None:
        batches.append(([p.turn.index for p in turns], [key.session_id for key in ended]))

    writer = HistoryWriter(flush, linger=0.05)
    for n in range(3):
        writer.add_turn(GATEWAY_S, TurnRecord(session_id="s", index=n, user_text="hi"))
    await asyncio.sleep(0.2)
    writer.add_turn(GATEWAY_S, TurnRecord(session_id="s", index=3, user_text="bye"))
    writer.end_conversation(GATEWAY_S)
    await writer.aclose()
    assert batches == [([0, 1, 2], []), ([3], ["s"])]


async def test_a_failing_history_write_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def flush(turns: list[PendingTurn], ended: list[ConversationKey]) -> None:
        raise RuntimeError("database is down")

    writer = HistoryWriter(flush, linger=0.01, limit=1, retry_delays=(0.01,))
    writer.add_turn(GATEWAY_S, TurnRecord(session_id="s", index=0, user_text="hi"))
    writer.add_turn(GATEWAY_S, TurnRecord(session_id="s", index=1, user_text="hi"))  # over the limit
    await writer.aclose()
    assert writer.dropped == 1
    [failed] = [r for r in caplog.records if r.getMessage() == "history write failed, turns dropped"]
    assert failed.levelname == "ERROR" and failed.turns == 1  # type: ignore[attr-defined]


# -- bounded waits (issue 11 item 10) and provider attempts (issue 13) ------------------------------


async def test_a_model_that_stalls_after_its_first_token_is_a_timeout_after_the_gap(
    gateway: Gateway, fake: FakeOpenAI
) -> None:
    session, client, hooks = await gateway.open(llm_timeout=60.0, llm_inter_token_timeout=0.5)
    fake.script(Reply(text="Let me think about that for a long while.", stall_after=3))
    started = time.monotonic()
    await send(session, type="text_input", text="hi")
    got = await client.until_idle()  # fails after 5 s per message: far below the 60 s LLM_TIMEOUT
    assert types(got) == ["status:processing", "error", "status:idle"] and errors(got) == ["TIMEOUT"]
    assert "stalled" in got[1]["details"] and time.monotonic() - started < 5
    await session.aclose()
    turn = hooks.turns[0]
    assert turn.error.startswith("TIMEOUT")
    assert [(a["kind"], a["ok"], a.get("error")) for a in turn.provider_attempts["llm"]] == [
        ("openai", False, "ProviderStalled")]


async def test_a_gateway_turn_records_the_llm_that_served(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open(llm_inter_token_timeout=0.5)
    fake.script(Reply(text="Hello there, how can I help?", chunk_delay=0.1))  # slow, steady: never cut
    await send(session, type="text_input", text="hi")
    got = await client.until_idle()
    assert got[-2]["type"] == "llm_response" and got[-2]["content"] == "Hello there, how can I help?"
    await session.aclose()
    assert [(a["kind"], a["ok"]) for a in hooks.turns[0].provider_attempts["llm"]] == [("openai", True)]


async def test_a_model_that_never_answers_is_recorded_as_timed_out(gateway: Gateway, fake: FakeOpenAI) -> None:
    session, client, hooks = await gateway.open(llm_timeout=0.3)
    fake.script(Reply(hang=True))
    await send(session, type="text_input", text="hi")
    assert errors(await client.until_idle()) == ["TIMEOUT"]
    await session.aclose()
    (attempt,) = hooks.turns[0].provider_attempts["llm"]
    assert (attempt["kind"], attempt["ok"], attempt["error"]) == ("openai", False, "TimeoutError")
    assert attempt["ms"] >= 300
