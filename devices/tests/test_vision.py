"""POST /mcp/vision/explain against the real view, with FakeOpenAI as the vision model."""
from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from devices.models import Device
from devices.services import device_token_issue
from devices.tests.factories import BoundDeviceFactory
from devices.vision import VISION_TOKEN_TTL_SECONDS, vision_token_issue, vision_token_valid
from simulator.firmware_tools import TINY_JPEG_B64
from testing.fake_openai import FakeOpenAI, Reply

pytestmark = pytest.mark.django_db

URL = "/mcp/vision/explain"
JPEG = base64.b64decode(TINY_JPEG_B64)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(default=Reply(text="A red mug on a desk.")) as server:
        yield server


@pytest.fixture
def vision_settings(settings: Any, fake: FakeOpenAI) -> Any:
    fake.reset()
    settings.XIAOZHI_VISION_BASE_URL = fake.base_url
    settings.XIAOZHI_VISION_API_KEY = "vision-key"
    settings.XIAOZHI_VISION_MODEL = "vision-test"
    return settings


@pytest.fixture
def device() -> Device:
    return BoundDeviceFactory()


def post(device: Device, *, token: str | None = None, mac: str | None = None, question: str | None = "What is it?",
         jpeg: bytes | None = JPEG) -> Any:
    data: dict[str, Any] = {}
    if question is not None:
        data["question"] = question
    if jpeg is not None:
        data["file"] = SimpleUploadedFile("camera.jpg", jpeg, content_type="image/jpeg")
    headers = {"Device-Id": mac or device.mac, "Client-Id": device.client_id,
               "Authorization": f"Bearer {vision_token_issue(device=device) if token is None else token}"}
    return Client().post(URL, data, headers=headers)


def test_it_answers_with_the_models_text(vision_settings: Any, fake: FakeOpenAI, device: Device) -> None:
    response = post(device)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode() == "A red mug on a desk."
    request = fake.chat_requests[-1]
    assert request.model == "vision-test" and request.body.get("stream") in (None, False)
    assert request.headers["Authorization"] == "Bearer vision-key"
    text, image = request.messages[-1]["content"]
    assert text == {"type": "text", "text": "What is it?"}
    assert image["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()


@pytest.mark.parametrize("case", ["garbage token", "websocket token", "other device", "no token"])
def test_a_wrong_token_gets_401(vision_settings: Any, fake: FakeOpenAI, device: Device, case: str) -> None:
    other = BoundDeviceFactory()
    token = {"garbage token": "nope.123", "websocket token": device_token_issue(device=device),
             "other device": vision_token_issue(device=other), "no token": ""}[case]
    assert post(device, token=token).status_code == 401
    assert fake.chat_requests == []


def test_the_device_id_header_must_name_the_tokens_device(vision_settings: Any, device: Device) -> None:
    other = BoundDeviceFactory()
    assert post(device, token=vision_token_issue(device=device), mac=other.mac).status_code == 401


def test_a_vision_token_expires(device: Device) -> None:
    token = vision_token_issue(device=device, now=time.time() - VISION_TOKEN_TTL_SECONDS - 10)
    assert not vision_token_valid(token=token, device=device)
    assert vision_token_valid(token=vision_token_issue(device=device), device=device)


@pytest.mark.parametrize(("question", "jpeg"), [(None, JPEG), ("What?", None)])
def test_missing_parts_get_400(vision_settings: Any, device: Device, question: str | None,
                               jpeg: bytes | None) -> None:
    assert post(device, question=question, jpeg=jpeg).status_code == 400


def test_a_file_that_is_not_a_jpeg_gets_400(vision_settings: Any, device: Device) -> None:
    assert post(device, jpeg=b"GIF89a....").status_code == 400


def test_an_image_over_the_limit_gets_413(vision_settings: Any, fake: FakeOpenAI, device: Device) -> None:
    vision_settings.XIAOZHI_VISION_MAX_BYTES = 2048
    response = post(device, jpeg=JPEG[:2] + b"\x00" * 4096)
    assert response.status_code == 413
    assert fake.chat_requests == []


def test_a_failing_model_gets_502(vision_settings: Any, fake: FakeOpenAI, device: Device) -> None:
    fake.script(Reply(status=500, error="model crashed"))
    response = post(device)
    assert response.status_code == 502
    assert response.json()["success"] is False


def test_only_post_is_allowed(vision_settings: Any) -> None:
    assert Client().get(URL).status_code == 405


def test_the_personas_vision_chain_falls_over_to_its_next_model(vision_settings: Any, fake: FakeOpenAI,
                                                                 device: Device) -> None:
    from conversations.models import ProviderConfig
    from conversations.provider_configs import persona_chain_set
    from conversations.tests.factories import PersonaFactory

    with FakeOpenAI(default=Reply(status=503, error="overloaded")) as down:
        first = ProviderConfig.objects.create(name="Cloud vision", stage="vision", kind="openai",
                                              base_url=down.base_url, model="big-vision", api_key="sk-cloud-0000")
        second = ProviderConfig.objects.create(name="Local vision", stage="vision", kind="openai",
                                               base_url=fake.base_url, model="small-vision")
        device.persona = PersonaFactory()
        device.save()
        persona_chain_set(persona=device.persona, configs=[first, second])
        response = post(device)
        assert response.status_code == 200 and response.content.decode() == "A red mug on a desk."
        assert [r.model for r in down.chat_requests] == ["big-vision"]
        assert down.chat_requests[0].headers["Authorization"] == "Bearer sk-cloud-0000"
    assert fake.chat_requests[-1].model == "small-vision"
