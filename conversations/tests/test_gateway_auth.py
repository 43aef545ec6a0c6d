"""LLM Gateway API keys, per-key limits and bounded session memory (issue 11 items 6 and 7).

Pure parts (credentials, limits, the text_input check, the store's caps) directly; the
consumer through Channels' communicator; and the promises of docs/security.md end to end
against the real server over real sockets. The LLM is FakeOpenAI over real HTTP.
"""
from __future__ import annotations

import asyncio
import gc
import json
import re
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from conversations.gateway.auth import KeyGrant, KeyLimits, credential, is_text_input, key_digest
from conversations.gateway.keys import gateway_key_create, gateway_keys_revoke
from conversations.gateway.store import ChatOptions, SessionStore
from conversations.models import GatewayKey, Persona
from conversations.routing import websocket_urlpatterns
from testing.fake_openai import FakeOpenAI
from tools.builtin import SessionToolState

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gateway_settings(settings: Any, fake: FakeOpenAI) -> Any:
    fake.reset()
    settings.LLM_BASE_URL = fake.base_url
    settings.LLM_MODEL = "fake-model"
    settings.LLM_TIMEOUT = 5.0
    return settings


def create_key(**fields: Any) -> str:
    return gateway_key_create(name=fields.pop("name", "client"), **fields)[1]


def grant(key_id: int = 1, rpm: int = 60, connections: int = 2) -> KeyGrant:
    return KeyGrant(key_id=key_id, name="k", requests_per_minute=rpm, max_connections=connections)


# -- credentials, keys, limits (pure) --------------------------------------------------------------


def scope(headers: dict[str, str] | None = None, query: str = "") -> dict[str, Any]:
    encoded = [(name.lower().encode(), value.encode("latin-1")) for name, value in (headers or {}).items()]
    return {"headers": encoded, "query_string": query.encode()}


def test_a_key_comes_as_a_bearer_header_or_as_a_token_in_the_query() -> None:
    assert credential(scope({"Authorization": "Bearer xzgw_abc"})) == "xzgw_abc"
    assert credential(scope({"Authorization": "bearer   xzgw_abc "})) == "xzgw_abc"
    assert credential(scope(query="a=1&token=xzgw_q")) == "xzgw_q"
    assert credential(scope({"Authorization": "Bearer xzgw_h"}, "token=xzgw_q")) == "xzgw_h"  # header first


@pytest.mark.parametrize("headers, query", [
    ({}, ""), ({"Authorization": "Basic YWxpY2U6cHc="}, ""), ({"Authorization": "Bearer"}, ""),
    ({}, "token="), ({}, "token=" + "x" * 257), ({"Authorization": "Bearer " + "x" * 257}, ""),
    ({}, "%ZZ&&token"),
])  # fmt: skip
def test_a_missing_empty_foreign_or_oversized_credential_is_no_credential(headers: dict, query: str) -> None:
    assert credential(scope(headers, query)) is None


def test_only_a_hash_and_a_short_prefix_of_a_key_are_stored(transactional_db: None) -> None:
    key, secret = gateway_key_create(name="shop display")
    stored = GatewayKey.objects.get(pk=key.pk)
    assert secret.startswith("xzgw_") and len(secret) >= 40
    assert stored.key_hash == key_digest(secret) and secret not in stored.key_hash
    assert stored.prefix == secret[:12] and secret not in str(GatewayKey.objects.values().get(pk=key.pk))


def test_the_management_command_prints_a_working_key_once(transactional_db: None, capsys: Any) -> None:
    Persona.objects.create(name="Ada")
    call_command("gateway_key_create", "kiosk", "--requests-per-minute", "30", "--persona", "Ada")
    secret = capsys.readouterr().out.strip()
    key = GatewayKey.objects.get(key_hash=key_digest(secret))
    assert (key.name, key.requests_per_minute, key.persona.name) == ("kiosk", 30, "Ada")


def test_a_key_bursts_its_requests_per_minute_then_earns_them_back() -> None:
    now = [0.0]
    limits = KeyLimits(clock=lambda: now[0])
    key = grant(rpm=3)
    assert [limits.request(key) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.request(key) == pytest.approx(20.0)  # one request every 60/3 s
    now[0] = 19.0
    assert limits.request(key) == pytest.approx(1.0)
    now[0] = 20.0
    assert limits.request(key) == 0.0 and limits.request(key) > 0
    assert limits.request(grant(key_id=2, rpm=3)) == 0.0  # another key has its own bucket


def test_a_key_holds_at_most_its_connections_and_gets_them_back_on_close() -> None:
    limits = KeyLimits()
    key = grant(connections=2)
    assert limits.open(key) and limits.open(key) and not limits.open(key)
    assert limits.open(grant(key_id=2, connections=2))
    limits.close(key.key_id)
    assert limits.connections(key.key_id) == 1 and limits.open(key)


@pytest.mark.parametrize("frame, expected", [
    ('{"type": "text_input", "text": "hi"}', True),
    ('{"type": "text\\u005finput", "text": "hi"}', True),  # spelled with an escape
    ('{"type": "ping", "type": "text_input", "text": "x"}', True),  # the last key wins, as in the session
    ('{"type": "ping"}', False),
    ('{"type": "tool_result", "call_id": "c", "result": "text_input"}', False),
    ('{"type": "text_input", "text": "' + "x" * 300 + '"}', False),  # too large: the session says so
    ("text_input", False), ('["text_input"]', False), ('{"type": "text_input"', False),
    ("[" * 5000 + "text_input", False),
])  # fmt: skip
def test_text_input_is_recognised_however_it_is_written(frame: str, expected: bool) -> None:
    assert is_text_input(frame, max_bytes=256) is expected


# -- bounded session memory (pure) ------------------------------------------------------------------


def _detached_sessions(store: SessionStore, count: int, exchanges: int, size: int) -> list[str]:
    ids = []
    for n in range(count):
        record = store.create(ChatOptions(), SessionToolState())
        owner = object()
        store.attach(record, owner, lambda: None)
        for turn in range(exchanges):
            record.add_exchange(f"{n}-{turn}:" + "问" * size, "好的。" * 10, limit=10)
        store.detach(record, owner)
        ids.append(record.session_id)
    return ids


def test_40_disconnected_sessions_fed_large_messages_keep_only_their_capped_history() -> None:
    """The issue's case: 40 sessions, then disconnect. Each message here is ~300 KB of UTF-8
    (100,000 CJK characters), five per session: ~60 MB of text went through the store."""
    store = SessionStore(timeout=3600, cleanup_interval=60)  # the defaults: 1000 detached, 32 KiB
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ids = _detached_sessions(store, 40, 5, 100_000)
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(session_id in store for session_id in ids) and store.detached == 40
    assert retained < 40 * 64 * 1024, f"{retained / 1e6:.1f} MB kept for 40 sessions"


def test_history_keeps_the_newest_exchanges_within_the_byte_cap() -> None:
    store = SessionStore(timeout=60, cleanup_interval=60, max_history_bytes=1024)
    record = store.create(ChatOptions(), SessionToolState())
    record.add_exchange("a" * 300, "b" * 100, limit=10)
    record.add_exchange("c" * 300, "d" * 100, limit=10)
    record.add_exchange("e" * 300, "f" * 100, limit=10)  # 1,200 bytes: the oldest pair goes
    assert [m["content"][0] for m in record.history] == ["c", "d", "e", "f"]
    record.add_exchange("g" * 2000, "h", limit=10)  # alone over the cap: nothing is kept
    assert record.history == []


async def test_past_the_detached_cap_the_session_let_go_of_longest_ago_is_dropped_and_reported() -> None:
    ended: list[list[str]] = []

    async def on_expired(ids: list[str]) -> None:
        ended.append(ids)

    store = SessionStore(timeout=3600, cleanup_interval=60, max_detached=2, on_expired=on_expired)
    first, second, third = _detached_sessions(store, 3, 1, 10)
    assert first not in store and second in store and third in store and store.detached == 2
    with pytest.raises(Exception, match="Session expired"):
        store.get(first)
    assert await store.sweep() == [first] and ended == [[first]]  # its conversation is closed


# -- the consumer (Channels communicator) -------------------------------------------------------------


@pytest.fixture
async def communicators() -> AsyncIterator[list[WebsocketCommunicator]]:
    opened: list[WebsocketCommunicator] = []
    yield opened
    for communicator in opened:
        await communicator.disconnect()


async def _open(opened: list[WebsocketCommunicator], *, key: str = "", query: str = "") -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    path = "/llm/v1/" + (f"?{query}" if query else "")
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path, headers=headers)
    connected, _ = await communicator.connect()
    assert connected  # accepted first, so the client can be told why it is refused
    opened.append(communicator)
    return communicator


async def _next(communicator: WebsocketCommunicator) -> dict[str, Any]:
    return json.loads(await communicator.receive_from(5))


async def _close_code(communicator: WebsocketCommunicator) -> int:
    output = await communicator.receive_output(5)
    while output["type"] != "websocket.close":
        output = await communicator.receive_output(5)
    return int(output["code"])


async def test_without_a_key_the_client_hears_unauthorized_then_close_4001(
    gateway_settings: Any, communicators: list, fake: FakeOpenAI
) -> None:
    socket = await _open(communicators)
    error = await _next(socket)
    assert (error["type"], error["code"], error["message"]) == ("error", "UNAUTHORIZED", "Authentication required")
    assert "Bearer" in error["details"] and error["timestamp"].endswith("Z")
    assert await _close_code(socket) == 4001
    await socket.send_to(text_data=json.dumps({"type": "text_input", "text": "hi"}))
    assert fake.chat_requests == []  # nothing reached the LLM


async def test_an_unknown_or_revoked_key_is_refused_with_4001(gateway_settings: Any, communicators: list) -> None:
    revoked = await sync_to_async(create_key)(name="old")
    await sync_to_async(gateway_keys_revoke)(GatewayKey.objects.all())
    for key in ("xzgw_" + "A" * 43, revoked):
        socket = await _open(communicators, key=key)
        error = await _next(socket)
        assert (error["code"], error["message"]) == ("UNAUTHORIZED", "Invalid or revoked key")
        assert await _close_code(socket) == 4001


@pytest.mark.parametrize("headers, query", [
    ([(b"authorization", b"Bearer \x00\xff\xfe' OR 1=1 --")], ""),
    ([], "token=%00%FF%ED%A0%80"),
    ([(b"authorization", b"Bearer " + b"\xe5\xa5\xbd" * 80)], ""),
])  # fmt: skip
async def test_hostile_credentials_are_just_invalid_keys(
    gateway_settings: Any, communicators: list, headers: list, query: str
) -> None:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/llm/v1/?{query}", headers=headers)
    assert (await communicator.connect())[0]
    communicators.append(communicator)
    error = await _next(communicator)
    assert (error["code"], error["message"]) == ("UNAUTHORIZED", "Invalid or revoked key")
    assert await _close_code(communicator) == 4001


async def test_a_key_in_the_query_string_works_and_its_use_is_recorded(
    gateway_settings: Any, communicators: list
) -> None:
    secret = await sync_to_async(create_key)()
    socket = await _open(communicators, query=f"token={secret}")
    assert (await _next(socket))["status"] == "connected"
    key = await GatewayKey.objects.aget(key_hash=key_digest(secret))
    assert key.last_used_at is not None


async def test_cloud_auth_open_lets_clients_in_without_a_key(gateway_settings: Any, communicators: list) -> None:
    gateway_settings.CLOUD_AUTH = "open"
    socket = await _open(communicators)
    assert (await _next(socket))["status"] == "connected"


async def test_revoking_a_key_closes_its_live_connections_with_4001(gateway_settings: Any, communicators: list) -> None:
    doomed, other = await sync_to_async(create_key)(name="doomed"), await sync_to_async(create_key)(name="other")
    victim, bystander = await _open(communicators, key=doomed), await _open(communicators, key=other)
    await _next(victim)
    await _next(bystander)
    count = await sync_to_async(gateway_keys_revoke)(GatewayKey.objects.filter(name="doomed"))
    assert count == 1
    error = await _next(victim)
    assert (error["code"], error["message"]) == ("UNAUTHORIZED", "Key revoked")
    assert await _close_code(victim) == 4001
    await bystander.send_to(text_data=json.dumps({"type": "ping"}))
    assert (await _next(bystander))["type"] == "pong"


async def test_a_persona_on_the_key_gives_the_gateway_its_prompt(
    gateway_settings: Any, communicators: list, fake: FakeOpenAI
) -> None:
    persona = await Persona.objects.acreate(
        name="Ada", language="en",
        system_prompt="You are {persona_name} for {device_name}, in {language}. {current_time}",
    )
    secret = await sync_to_async(create_key)(name="kiosk", persona=persona)
    socket = await _open(communicators, key=secret)
    await _next(socket)
    await socket.send_to(text_data=json.dumps({"type": "text_input", "text": "hi"}))
    while (await _next(socket))["type"] != "llm_response":
        pass
    system = fake.chat_requests[-1].messages[0]["content"]
    assert system.startswith("You are Ada for kiosk, in English. 20") and "{" not in system


async def test_deleting_a_key_in_the_admin_closes_its_connections_and_the_list_filters_by_status(
    gateway_settings: Any, communicators: list, admin_client: Any
) -> None:
    secret = await sync_to_async(create_key)(name="to delete")
    await sync_to_async(create_key)(name="kept")
    await sync_to_async(gateway_keys_revoke)(GatewayKey.objects.filter(name="kept"))
    key = await GatewayKey.objects.aget(name="to delete")
    socket = await _open(communicators, key=secret)
    await _next(socket)

    revoked = await sync_to_async(admin_client.get)("/admin/conversations/gatewaykey/?status=revoked")
    assert b"kept" in revoked.content and b"to delete" not in revoked.content
    response = await sync_to_async(admin_client.post)(
        f"/admin/conversations/gatewaykey/{key.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 302 and not await GatewayKey.objects.filter(pk=key.pk).aexists()
    assert (await _next(socket))["message"] == "Key revoked"
    assert await _close_code(socket) == 4001


# -- end to end: the real server over real sockets --------------------------------------------------------


async def _hello(url: str, headers: dict[str, str] | None = None) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await connect(url, open_timeout=20, additional_headers=headers)
    return ws, json.loads(await asyncio.wait_for(ws.recv(), 20))


async def _refused(url: str, headers: dict[str, str] | None = None) -> tuple[dict[str, Any], int, str]:
    """The first message and the close code and reason of a connection the server refuses."""
    ws, first = await _hello(url, headers)
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    return first, closed.value.rcvd.code, closed.value.rcvd.reason


async def _ask(ws: ClientConnection, text: str) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "text_input", "text": text}, ensure_ascii=False))
    while (message := json.loads(await asyncio.wait_for(ws.recv(), 20)))["type"] not in ("llm_response", "error"):
        pass
    return message


async def _command(ws: ClientConnection, **message: Any) -> dict[str, Any]:
    await ws.send(json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), 20))


@pytest.mark.e2e
async def test_the_server_serves_only_clients_with_a_valid_key(asgi_server_factory: Any, fake: FakeOpenAI) -> None:
    fake.reset()
    secret = await sync_to_async(create_key)(name="app")
    revoked = await sync_to_async(create_key)(name="gone")
    await sync_to_async(gateway_keys_revoke)(GatewayKey.objects.filter(name="gone"))
    server = asgi_server_factory(LLM_BASE_URL=fake.base_url)
    url = f"{server.ws_url}/llm/v1/"

    for headers, query, message in [
        (None, "", "Authentication required"),
        ({"Authorization": "Bearer xzgw_guess"}, "", "Invalid or revoked key"),
        (None, f"?token={revoked}", "Invalid or revoked key"),
        ({"Authorization": f"Basic {secret}"}, "", "Authentication required"),
    ]:
        first, code, reason = await _refused(url + query, headers)
        assert (first["type"], first["code"], first["message"], code) == ("error", "UNAUTHORIZED", message, 4001)
        assert reason and secret not in reason
    assert fake.chat_requests == []

    for headers, query in (({"Authorization": f"Bearer {secret}"}, ""), (None, f"?token={secret}")):
        ws, first = await _hello(url + query, headers)
        assert first["status"] == "connected"
        assert (await _ask(ws, "你好"))["content"] == "好的。"
        await ws.close()
    assert secret not in server.log()  # keys never reach the log


@pytest.mark.e2e
async def test_a_key_past_its_rate_limit_gets_rate_limited_without_calling_the_llm(
    asgi_server_factory: Any, fake: FakeOpenAI
) -> None:
    fake.reset()
    secret = await sync_to_async(create_key)(requests_per_minute=2)
    server = asgi_server_factory(LLM_BASE_URL=fake.base_url)
    ws, _ = await _hello(f"{server.ws_url}/?token={secret}")
    assert [(await _ask(ws, "一"))["type"], (await _ask(ws, "二"))["type"]] == ["llm_response", "llm_response"]
    refused = await _ask(ws, "三")
    assert (refused["code"], refused["message"]) == ("RATE_LIMITED", "Rate limit exceeded")
    assert "2 requests per minute" in refused["details"] and "retry in 30 s" in refused["details"]
    assert len(fake.chat_requests) == 2
    assert (await _command(ws, type="ping"))["type"] == "pong"  # pings are not requests
    await ws.close()
    ws, _ = await _hello(f"{server.ws_url}/?token={secret}")  # reconnecting does not refill it
    assert (await _ask(ws, "四"))["code"] == "RATE_LIMITED"
    await ws.close()


@pytest.mark.e2e
async def test_idle_and_unauthenticated_sockets_do_not_lock_other_clients_out(
    asgi_server_factory: Any, fake: FakeOpenAI
) -> None:
    """Issue 11 item 6: 100 idle sockets took every slot. Now a socket without a key is
    closed at once and never counts, and one key cannot hold more than its cap."""
    fake.reset()
    greedy = await sync_to_async(create_key)(name="greedy", max_connections=2)
    polite = await sync_to_async(create_key)(name="polite", max_connections=2)
    server = asgi_server_factory(LLM_BASE_URL=fake.base_url, CLOUD_MAX_CONNECTIONS="4")
    url = f"{server.ws_url}/llm/v1/"

    strangers = await asyncio.gather(*(_refused(url) for _ in range(30)))
    assert {(first["code"], code) for first, code, _ in strangers} == {("UNAUTHORIZED", 4001)}

    held = [await _hello(f"{url}?token={greedy}") for _ in range(2)]
    assert [first["status"] for _, first in held] == ["connected", "connected"]
    first, code, reason = await _refused(f"{url}?token={greedy}")
    assert (first["code"], first["message"], code) == ("RATE_LIMITED", "Too many connections for this key", 1013)

    others = [await _hello(f"{url}?token={polite}") for _ in range(2)]  # the 3rd and 4th slots
    assert [first["status"] for _, first in others] == ["connected", "connected"]
    assert (await _ask(others[0][0], "还有位置吗？"))["content"] == "好的。"
    first, code, _ = await _refused(f"{url}?token={polite}")  # the polite key's own cap
    assert code == 1013
    for ws, _ in held + others:
        await ws.close()


@pytest.mark.e2e
async def test_disconnected_sessions_and_their_history_are_bounded(asgi_server_factory: Any, fake: FakeOpenAI) -> None:
    """Issue 11 item 6: sessions outlive their connection for CLOUD_SESSION_TIMEOUT; at most
    CLOUD_MAX_DETACHED_SESSIONS are kept and each keeps CLOUD_SESSION_HISTORY_BYTES of text."""
    fake.reset()
    secret = await sync_to_async(create_key)()
    server = asgi_server_factory(
        LLM_BASE_URL=fake.base_url, CLOUD_MAX_DETACHED_SESSIONS="2", CLOUD_SESSION_HISTORY_BYTES="4096"
    )
    ws, first = await _hello(f"{server.ws_url}/?token={secret}")
    sessions = [first["data"]["session_id"]]
    for _ in range(3):  # a new session lets go of the previous one, in order
        sessions.append((await _command(ws, type="start_session"))["data"]["session_id"])
    expired = await _command(ws, type="start_session", session_id=sessions[0])
    assert (expired["code"], expired["message"]) == ("SESSION_ERROR", "Session expired")
    resumed = await _command(ws, type="start_session", session_id=sessions[1])
    assert resumed["data"] == {"session_id": sessions[1], "resumed": True}

    await ws.send(json.dumps({"type": "configure", "enable_context": True}))
    await _ask(ws, "短问题")
    await _ask(ws, "长" * 2000)  # 6,000 bytes: more than a session keeps, so nothing before it stays
    assert fake.chat_requests[-1].messages[1:-1] == [{"role": "user", "content": "短问题"},
                                                     {"role": "assistant", "content": "好的。"}]  # fmt: skip
    await _ask(ws, "再来")
    assert fake.chat_requests[-1].messages[1:-1] == []
    await _ask(ws, "最后")
    assert fake.chat_requests[-1].messages[1:-1] == [{"role": "user", "content": "再来"},
                                                     {"role": "assistant", "content": "好的。"}]  # fmt: skip
    await ws.close()


# -- the admin, in a real browser ----------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.browser
async def test_an_operator_creates_a_key_sees_it_once_and_revoking_it_closes_its_connection(
    asgi_server_factory: Any, browser_factory: Any, staff_user: Any, fake: FakeOpenAI
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    fake.reset()
    server = asgi_server_factory(LLM_BASE_URL=fake.base_url)
    browser = browser_factory(server.http_url)
    browser.login("alice", "alice-password")
    browser.open("/admin/conversations/gatewaykey/add/")
    browser.driver.find_element(By.NAME, "name").send_keys("Shop display")
    rate = browser.driver.find_element(By.NAME, "requests_per_minute")
    rate.clear()
    rate.send_keys("10")
    browser.driver.find_element(By.NAME, "_save").click()
    shown = browser.wait_for(lambda: browser.driver.find_element(By.ID, "gateway-key").get_attribute("value"),
                             what="the new key")  # fmt: skip
    assert "shown only this once" in browser.text()
    browser.screenshot("gateway-key-created")
    key = await GatewayKey.objects.aget(name="Shop display")
    assert key.key_hash == key_digest(shown) and key.requests_per_minute == 10 and shown.startswith(key.prefix)

    ws, first = await _hello(f"{server.ws_url}/llm/v1/?token={shown}")
    assert first["status"] == "connected"

    browser.open("/admin/conversations/gatewaykey/")
    assert shown not in browser.driver.page_source and key.prefix in browser.text()
    browser.driver.find_element(By.CSS_SELECTOR, f"input.action-select[value='{key.pk}']").click()
    Select(browser.driver.find_element(By.NAME, "action")).select_by_value("revoke")
    browser.driver.find_element(By.NAME, "index").click()
    browser.wait_for(lambda: "1 key revoked." in browser.text(), what="the revoke message")
    browser.screenshot("gateway-key-revoked")

    error = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert (error["code"], error["message"]) == ("UNAUTHORIZED", "Key revoked")
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
    first, code, _ = await _refused(f"{server.ws_url}/llm/v1/?token={shown}")
    assert (first["code"], code) == ("UNAUTHORIZED", 4001)
    browser.open(f"/admin/conversations/gatewaykey/{key.pk}/change/")
    assert shown not in browser.driver.page_source
    browser.screenshot("gateway-key-change")


def test_a_query_string_with_too_many_fields_carries_no_credential() -> None:
    assert credential(scope(query="&".join(f"f{n}=1" for n in range(30)) + "&token=xzgw_x")) is None


def test_the_page_with_a_new_key_is_never_cached_and_no_other_page_shows_the_key(admin_client: Any) -> None:
    response = admin_client.post("/admin/conversations/gatewaykey/add/", {
        "name": "Hall display", "requests_per_minute": "30", "max_connections": "2", "_save": "Save",
    })  # fmt: skip
    assert response.status_code == 200
    secret = re.search(rb'id="gateway-key" type="text" readonly value="(xzgw_[^"]+)"', response.content)
    assert secret, "the new key is on the page"
    key = GatewayKey.objects.get(name="Hall display")
    assert key.key_hash == key_digest(secret.group(1).decode()) and "no-store" in response["Cache-Control"]
    for page in ("/admin/conversations/gatewaykey/", f"/admin/conversations/gatewaykey/{key.pk}/change/"):
        shown = admin_client.get(page)
        assert shown.status_code == 200 and key.prefix.encode() in shown.content
        assert secret.group(1) not in shown.content
