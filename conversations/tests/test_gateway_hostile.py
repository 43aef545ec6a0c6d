"""Hostile gateway clients: tool schemas that try to make the server fetch, recurse or
backtrack, floods of tools, and frames over the size limit, in the session and end to end
over the real server."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from conversations.gateway.client_tools import ClientToolSource, Registration

from conversations.tests.test_gateway_session import (  # noqa: F401  (fixtures)
    BATTERY,
    Gateway,
    errors,
    gateway,
    send,
    types,
)
from testing.fake_openai import Call, FakeOpenAI, Reply
from tools.tests.hostile import ARGUMENTS, RecordingServer, hostile_schemas, recording_server


@pytest.fixture
def recorder() -> Iterator[RecordingServer]:
    with recording_server() as server:
        yield server


def client_tool(name: str, schema: Any) -> dict[str, Any]:
    return {"name": name, "description": f"hostile case {name}", "parameters": schema}


# -- in the session -----------------------------------------------------------------------------------------


async def test_client_tools_with_hostile_schemas_are_refused_with_the_reason_and_nothing_is_fetched(
    gateway: Gateway, fake: FakeOpenAI, recorder: RecordingServer  # noqa: F811  (fixtures imported above)
) -> None:
    corpus = hostile_schemas(recorder.url)
    session, client, _ = await gateway.open(client_tools_max=len(corpus))
    await send(session, type="register_tools", tools=[client_tool(h.name, h.schema) for h in corpus])
    refused = [h for h in corpus if h.refusal is not None]
    got = [await client.next() for _ in range(len(refused) + 1)]
    summary = got[-1]
    assert errors(got) == ["INVALID_TOOL_PARAMETERS"] * len(refused)
    assert [e["message"] for e in got[:-1]] == [h.refusal for h in refused]
    assert all(e["details"].startswith(f"tool '{h.name}'") for e, h in zip(got[:-1], refused, strict=True))
    assert summary["type"] == "tools_registered" and summary["count"] == len(corpus) - len(refused)

    # An accepted schema still checks the model's arguments, without fetching anything.
    valid, invalid = ARGUMENTS["remote_id_with_local_refs"]
    fake.script(Reply(tool_calls=[Call("remote_id_with_local_refs", invalid)]), Reply(text="好的"))
    await send(session, type="text_input", text="调用工具")
    turn = await client.until_idle()
    assert errors(turn) == ["INVALID_TOOL_PARAMETERS"] and "tool_callback" not in types(turn)
    assert recorder.requests == []


async def test_a_register_tools_listing_3000_tools_is_refused_whole_before_any_schema_is_checked(
    gateway: Gateway, recorder: RecordingServer  # noqa: F811  (fixture imported above)
) -> None:
    session, client, _ = await gateway.open()  # CLIENT_TOOLS_MAX_COUNT: 32
    remote = {"type": "object", "properties": {"q": {"$ref": f"{recorder.url}/x.json"}}}
    await send(session, type="register_tools", tools=[client_tool(f"tool_{i}", remote) for i in range(3000)])
    got = [await client.next(), await client.next()]
    assert [(m.get("code"), m.get("message"), m.get("details")) for m in got[:1]] == [
        ("TOOL_REGISTRATION_FAILED", "Too many tools", "3000 tools; at most 32 per connection")]  # fmt: skip
    assert got[1]["type"] == "tools_registered" and got[1]["count"] == 0 and got[1]["tools"] == []
    await send(session, type="register_tools", tools=[BATTERY])  # the connection still works
    assert (await client.next())["count"] == 1
    assert client.pending() == [] and recorder.requests == []


async def test_a_description_over_the_limit_is_refused(gateway: Gateway) -> None:  # noqa: F811  (fixture)
    session, client, _ = await gateway.open()
    await send(session, type="register_tools", tools=[{**BATTERY, "description": "说" * 5000}])
    error, summary = await client.next(), await client.next()
    assert (error["code"], error["message"]) == ("TOOL_REGISTRATION_FAILED", "Tool description is too long")
    assert error["details"] == "tool 'get_battery': 5000 characters; the limit is 4096" and summary["count"] == 0


# -- over the real server ---------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


async def _hello(url: str, key: str) -> ClientConnection:
    ws = await connect(f"{url}/llm/v1/?token={key}", max_size=None, open_timeout=20)
    assert json.loads(await asyncio.wait_for(ws.recv(), 20))["status"] == "connected"
    return ws


async def _next(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), 20))


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_over_the_real_server_a_remote_ref_is_refused_and_never_fetched(
    asgi_server_factory: Any, llm: FakeOpenAI, recorder: RecordingServer, gateway_key: str
) -> None:
    llm.reset()
    server = asgi_server_factory(LLM_BASE_URL=llm.base_url)
    corpus = {h.name: h for h in hostile_schemas(recorder.url)}
    ws = await _hello(server.ws_url, gateway_key)
    tools = [client_tool(name, corpus[name].schema) for name in ("remote_ref", "file_ref", "remote_id_with_local_refs")]
    await ws.send(json.dumps({"type": "register_tools", "tools": tools}))
    replies = [await _next(ws) for _ in range(3)]
    assert [(r["type"], r.get("code")) for r in replies] == [
        ("error", "INVALID_TOOL_PARAMETERS"), ("error", "INVALID_TOOL_PARAMETERS"), ("tools_registered", None)]
    assert replies[2]["count"] == 1
    llm.script(Reply(tool_calls=[Call("remote_id_with_local_refs", {"q": 5})]), Reply(text="好的"))
    await ws.send(json.dumps({"type": "text_input", "text": "试一下"}))
    turn = [await _next(ws)]
    while turn[-1] != {**turn[-1], "type": "status", "status": "idle"}:
        turn.append(await _next(ws))
    assert [m["code"] for m in turn if m["type"] == "error"] == ["INVALID_TOOL_PARAMETERS"]
    await ws.close()
    assert recorder.requests == []


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_a_frame_just_over_the_limit_gets_invalid_message_then_1009(asgi_server: Any, gateway_key: str) -> None:
    ws = await _hello(asgi_server.ws_url, gateway_key)  # CLOUD_MAX_MESSAGE_BYTES: 1 MiB
    await ws.send(json.dumps({"type": "text_input", "text": "x" * 1_100_000}))
    error = await _next(ws)
    assert (error["code"], error["message"]) == ("INVALID_MESSAGE", "Message too large")
    with pytest.raises(ConnectionClosed) as closed:
        await _next(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_a_frame_far_over_the_limit_is_closed_with_1009_not_dropped(asgi_server: Any, gateway_key: str) -> None:
    ws = await _hello(asgi_server.ws_url, gateway_key)
    await ws.send(json.dumps({"type": "text_input", "text": "x" * 3_000_000}))  # over twice the limit
    with pytest.raises(ConnectionClosed) as closed:
        await _next(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert "exceeds payload limit" in closed.value.rcvd.reason


# -- fuzz: any register_tools payload ----------------------------------------------------------------------

_NAMES = st.sampled_from(["get_battery", "device.light.on", "_x", "1bad", "a" * 65, "", "电量", "dup", "dup"])
_SCHEMAS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(["object", "string", "#", "#/$defs/a", "^(a+)+$"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "properties", "$ref", "$defs", "pattern", "items", "anyOf", "a"]), inner, max_size=4),
    max_leaves=15,
)
_TOOLS = st.lists(
    st.fixed_dictionaries({"name": _NAMES, "description": st.text(max_size=20)}, optional={"parameters": _SCHEMAS})
    | _SCHEMAS,
    max_size=40,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_tools=_TOOLS)
def test_any_register_tools_payload_gets_an_answer_per_tool_or_one_refusal(raw_tools: list[Any]) -> None:
    async def register() -> Registration:
        async def sink(message: dict[str, Any]) -> None:
            pass

        source = ClientToolSource(sink, timeout=1, max_tools=32)
        return await source.register(tuple(raw_tools))

    registration = asyncio.run(register())
    if len(raw_tools) > 32:
        assert registration.results == [] and len(registration.errors) == 1
        return
    assert len(registration.results) == len(raw_tools)
    failed = [r for r in registration.results if r["status"] == "failed"]
    assert len(registration.errors) == len(failed)
    assert all(r["status"] in ("registered", "failed") for r in registration.results)
