"""What a device session is told about recording and bounded waits comes from settings and
the persona (selectors.session_config_for), so nothing is captured when recording is off."""
from __future__ import annotations

from typing import Any

import pytest

from conversations.models import Persona
from conversations.pipeline.config import SessionConfig
from conversations.pipeline.speak import ENCODER_COMPLEXITY
from conversations.selectors import session_config_for
from devices.auth import DeviceAuthResult
from devices.models import Device

pytestmark = pytest.mark.django_db


def config_for(persona: Persona) -> Any:
    device = Device.objects.create(mac="aa:bb:cc:dd:ee:21", persona=persona)
    auth = DeviceAuthResult(ok=True, close_code=None, reason="", device=device, bound=True, activation_code=None)
    return session_config_for(device, auth)


@pytest.mark.parametrize(("setting", "persona_records", "mode"), [
    ("on", True, "on"), ("reply-only", True, "reply-only"), ("off", True, "off"),
    ("on", False, "off"), ("reply-only", False, "off"),
])
def test_the_recording_mode_follows_the_setting_and_the_persona(
    settings: Any, setting: str, persona_records: bool, mode: str
) -> None:
    settings.XIAOZHI_RECORDING = setting
    assert config_for(Persona.objects.create(name="P", record_audio=persona_records)).recording == mode


def test_the_bounded_waits_come_from_settings(settings: Any) -> None:
    settings.LLM_FIRST_TOKEN_TIMEOUT = 7.5
    settings.LLM_INTER_TOKEN_TIMEOUT = 4.0
    settings.XIAOZHI_FILLER_SECONDS = 0.0
    config = config_for(Persona.objects.create(name="P"))
    assert (config.llm_first_token_timeout, config.llm_inter_token_timeout, config.filler_after) == (7.5, 4.0, 0.0)


def test_the_downlink_encoder_complexity_comes_from_settings(settings: Any) -> None:
    default = SessionConfig.__dataclass_fields__["downlink_opus_complexity"].default
    assert settings.XIAOZHI_OPUS_COMPLEXITY == default == ENCODER_COMPLEXITY  # one default everywhere
    settings.XIAOZHI_OPUS_COMPLEXITY = 1
    assert config_for(Persona.objects.create(name="P")).downlink_opus_complexity == 1
