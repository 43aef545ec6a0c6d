"""Provider configurations end to end (issue 14): a persona's LLM chain of two
OpenAI-compatible endpoints on loopback, the first answering HTTP 500. A device turn (real
sockets, real Opus, the simulator) and an LLM Gateway turn are both answered by the second
endpoint, the stored turns name the configuration that failed and the one that served, and
neither key reaches the server's log.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from conversations.gateway.keys import gateway_key_create
from conversations.models import ProviderConfig, Turn
from conversations.provider_configs import persona_chain_set
from conversations.tests.factories import PersonaFactory
from conversations.tests.test_voice_e2e import close_and_wait, wait_turn_row
from devices.tests.factories import BoundDeviceFactory, mac_for
from simulator.device import SimulatedDevice
from testing.fake_openai import FakeOpenAI, Reply
from testing.server import AsgiServer, database_url
from testing.speech import silence, speak

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FIRST_KEY = "sk-first-endpoint-0123456789"
SECOND_KEY = "sk-second-endpoint-9876543210"
ANSWER = "The second endpoint answers."


@pytest.fixture(scope="module")
def endpoints() -> Iterator[tuple[FakeOpenAI, FakeOpenAI]]:
    # The first fails, and its error text quotes the key, as careless servers do.
    failing = FakeOpenAI(default=Reply(status=500, error=f"upstream exploded for key {FIRST_KEY}"))
    serving = FakeOpenAI(default=Reply(text=f"😊 {ANSWER}"), api_key=SECOND_KEY)
    with failing, serving:
        yield failing, serving


@pytest.fixture(scope="module")
def server(django_db_setup: Any, django_db_blocker: Any) -> Iterator[AsgiServer]:
    from django.db import connection

    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    env = {
        "DATABASE_URL": db_url, "XIAOZHI_WS_AUTH": "open", "XIAOZHI_PROVIDER_PLUGINS": "testing.fake_providers",
        # The environment's LLM points nowhere: only the configurations can answer.
        "LLM_BASE_URL": "http://127.0.0.1:9/v1/", "LLM_MODEL": "env-model",
        "SECOND_API_KEY": SECOND_KEY,  # the second configuration's key is an env: reference
        "XIAOZHI_LOG_LEVEL": "DEBUG",  # the SDK's and HTTP client's debug lines must not carry keys either
    }
    with AsgiServer(env=env) as running:
        yield running


def _persona_with_two_llms(failing: FakeOpenAI, serving: FakeOpenAI) -> Any:
    persona = PersonaFactory(asr_providers=["fake_echo"], tts_providers=["fake_tone"], language="en",
                             vad_min_silence_ms=500, greeting="", exit_phrases=[])
    first = ProviderConfig.objects.create(name="Cloud (failing)", stage="llm", kind="openai",
                                          base_url=failing.base_url, api_key=FIRST_KEY, model="cloud-model")
    second = ProviderConfig.objects.create(name="Local (serving)", stage="llm", kind="openai",
                                           base_url=serving.base_url, api_key="env:SECOND_API_KEY",
                                           model="local-model")
    persona_chain_set(persona=persona, configs=[first, second])
    return persona


def _llm_attempts(turn: Turn) -> list[tuple[str, bool]]:
    return [(a.get("config", ""), a["ok"]) for a in turn.provider_attempts["llm"]]


async def test_a_device_turn_falls_over_to_the_second_endpoint_and_records_both(
    server: AsgiServer, endpoints: tuple[FakeOpenAI, FakeOpenAI]
) -> None:
    failing, serving = endpoints
    persona = await database_sync_to_async(_persona_with_two_llms)(failing, serving)
    mac = mac_for(0xC0F001)
    await database_sync_to_async(BoundDeviceFactory)(mac=mac, persona=persona)
    device = SimulatedDevice(server.http_url, mac=mac, listen_mode="auto", language="en-US")
    await device.connect(f"{server.ws_url}/xiaozhi/v1/", token="")
    try:
        await device.hello()
        await device.wait_for(lambda e: e.kind == "sent" and '"tools":[' in e.payload, timeout=10)
        await asyncio.sleep(0.1)
        await device.run_turn(silence(16000, 300) + speak("hello there"), timeout=60)
        turn = await wait_turn_row(conversation__device__mac=mac)
    finally:
        await close_and_wait(device)

    assert ANSWER in turn.reply_text and not turn.error
    assert _llm_attempts(turn) == [("Cloud (failing)", False), ("Local (serving)", True)]
    assert turn.providers["llm"] == "openai"
    # Each endpoint was asked for its own model, with its own key.
    assert [r.model for r in failing.chat_requests] == ["cloud-model"]
    assert [r.model for r in serving.chat_requests] == ["local-model"]
    assert failing.chat_requests[0].headers["Authorization"] == f"Bearer {FIRST_KEY}"
    log = server.log()
    assert "provider failed, trying the next one" in log
    assert FIRST_KEY not in log and SECOND_KEY not in log


async def test_a_gateway_turn_of_the_keys_persona_falls_over_the_same_way(
    server: AsgiServer, endpoints: tuple[FakeOpenAI, FakeOpenAI]
) -> None:
    from websockets.asyncio.client import connect

    failing, serving = endpoints
    persona = await database_sync_to_async(_persona_with_two_llms)(failing, serving)
    _key, secret = await database_sync_to_async(gateway_key_create)(name="app", persona=persona)
    before = len(serving.chat_requests)
    async with connect(f"{server.ws_url}/llm/v1/?token={secret}", open_timeout=20) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), 20))["status"] == "connected"
        await ws.send(json.dumps({"type": "text_input", "text": "hi"}))
        while (reply := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] not in ("llm_response", "error"):
            pass
    assert reply["type"] == "llm_response" and ANSWER in reply["content"]
    assert len(serving.chat_requests) == before + 1
    turn = await wait_turn_row(conversation__source="gateway", user_text="hi")
    assert _llm_attempts(turn) == [("Cloud (failing)", False), ("Local (serving)", True)]
    log = server.log()
    assert FIRST_KEY not in log and SECOND_KEY not in log
