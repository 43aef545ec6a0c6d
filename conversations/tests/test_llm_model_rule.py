"""One rule for the model an LLM is asked for, on a device and on the LLM Gateway alike: a
provider configuration's own model wins for its endpoint; else the persona's "LLM model";
else LLM_MODEL (conversations/pipeline/config.py `persona_llm_model`).

The endpoints are FakeOpenAI over real HTTP, which records the model of every request.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from conversations.gateway.keys import gateway_key_create
from conversations.gateway.services import gateway_llm
from conversations.models import Persona, ProviderConfig
from conversations.pipeline.config import SessionConfig
from conversations.pipeline.fallback import build_chain
from conversations.pipeline.think import Thinker, Thought
from conversations.provider_configs import persona_chain_set
from conversations.routing import websocket_urlpatterns
from conversations.selectors import session_config_for
from devices.auth import DeviceAuthResult
from devices.models import Device
from testing.fake_openai import FakeOpenAI, Reply
from tools.registry import Toolset

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def env(settings: Any, fake: FakeOpenAI) -> Any:
    fake.reset()
    settings.LLM_BASE_URL = fake.base_url
    settings.LLM_MODEL = "env-model"
    settings.LLM_TIMEOUT = 5.0
    return settings


def persona_with_two_llms(fake: FakeOpenAI, llm_model: str) -> Persona:
    """A cloud configuration naming its model, then a local one naming none."""
    persona = Persona.objects.create(name=f"Ada {llm_model or 'env'}", language="en", llm_model=llm_model)
    cloud = ProviderConfig.objects.create(name=f"Cloud {persona.pk}", stage="llm", kind="openai",
                                          base_url=fake.base_url, model="cloud-model")
    local = ProviderConfig.objects.create(name=f"Local {persona.pk}", stage="llm", kind="openai",
                                          base_url=fake.base_url)
    persona_chain_set(persona=persona, configs=[cloud, local])
    return persona


def device_config(persona: Persona) -> SessionConfig:
    device = Device.objects.create(mac=f"aa:bb:cc:dd:ee:{persona.pk:02x}", persona=persona)
    auth = DeviceAuthResult(ok=True, device=device, bound=True)
    return session_config_for(device, auth)


@pytest.mark.parametrize(("llm_model", "model"), [("persona-model", "persona-model"), ("", "env-model")])
def test_device_and_gateway_ask_the_same_model_of_the_same_persona(
    env: Any, fake: FakeOpenAI, llm_model: str, model: str,
) -> None:
    persona = persona_with_two_llms(fake, llm_model)
    device = device_config(persona)
    gateway = gateway_llm(persona.pk)
    assert device.model == gateway.model == model
    # Each configuration keeps its own model, on both sides.
    assert [spec.model for spec in device.persona.llm] == [spec.model for spec in gateway.specs] == ["cloud-model", ""]


async def device_turn(config: SessionConfig) -> None:
    """A turn as the device's engine thinks it (Thinker with the session's model)."""
    llm = build_chain("llm", config.persona.llm, config.providers)
    thinker = Thinker(persona=config.persona, device=config.device, toolset=Toolset([]), model=config.model)
    try:
        await thinker.think(llm, "hi", Thought())
    finally:
        await llm.aclose()


async def gateway_turn(persona: Persona) -> None:
    secret = await sync_to_async(gateway_key_create)(name=f"key {persona.pk}", persona=persona)
    headers = [(b"authorization", f"Bearer {secret[1]}".encode())]
    socket = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/llm/v1/", headers=headers)
    connected, _ = await socket.connect()
    assert connected
    try:
        assert json.loads(await socket.receive_from(5))["status"] == "connected"
        await socket.send_to(text_data=json.dumps({"type": "text_input", "text": "hi"}))
        while (reply := json.loads(await socket.receive_from(5)))["type"] not in ("llm_response", "error"):
            pass
        assert reply["type"] == "llm_response", reply
    finally:
        await socket.disconnect()


async def test_a_failing_cloud_is_asked_for_its_model_and_the_fallback_for_the_personas_on_both_sides(
    env: Any, fake: FakeOpenAI,
) -> None:
    persona = await sync_to_async(persona_with_two_llms)(fake, "persona-model")
    config = await sync_to_async(device_config)(persona)

    fake.script(Reply(status=500, error="cloud down"), Reply(text="Hello from the local model."))
    await device_turn(config)
    device_models = [r.model for r in fake.chat_requests]

    fake.reset()
    fake.script(Reply(status=500, error="cloud down"), Reply(text="Hello from the local model."))
    await gateway_turn(persona)
    gateway_models = [r.model for r in fake.chat_requests]

    assert device_models == gateway_models == ["cloud-model", "persona-model"]
