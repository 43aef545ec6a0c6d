"""The personas shipped by the migrations: the English default and the Chinese 小智."""
from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps

from conversations.models import Persona
from conversations.pipeline.prompt import render_system_prompt
from conversations.selectors import persona_config

pytestmark = pytest.mark.django_db
english_migration = importlib.import_module("conversations.migrations.0003_default_persona")
migration = importlib.import_module("conversations.migrations.0007_chinese_default_persona")


@pytest.fixture(autouse=True)
def shipped_personas() -> None:
    """The personas as a fresh `migrate` leaves them (a transactional test elsewhere may have
    flushed the migrations' rows from the shared test database)."""
    Persona.objects.all().delete()
    english_migration.create_default_persona(apps, None)
    migration.create_chinese_persona(apps, None)


def test_a_chinese_persona_ships_beside_the_english_default() -> None:
    english, chinese = Persona.objects.get(name="Xiaozhi"), Persona.objects.get(name="小智")
    assert english.is_default and not chinese.is_default and english.language == "en"
    assert (chinese.language, chinese.voice, chinese.tts_providers) == (
        "zh", "zh-CN-XiaoxiaoNeural", ["edge", "espeak"])
    assert (chinese.greeting, chinese.farewell) == ("你好，我在听。", "再见！")
    assert "再见" in chinese.exit_phrases and "你是{persona_name}" in chinese.system_prompt


def test_the_chinese_prompt_fills_every_placeholder() -> None:
    from conversations.pipeline.config import DeviceInfo

    config = persona_config(Persona.objects.get(name="小智"))
    device = DeviceInfo(id=1, mac="aa:bb:cc:dd:ee:ff", name="客厅音箱", location="上海", timezone="Asia/Shanghai")
    prompt = render_system_prompt(config, device)
    assert "{" not in prompt and "你是小智" in prompt and "设备名称：客厅音箱" in prompt and "所在位置：上海" in prompt


@pytest.mark.parametrize(("language_code", "default"), [("zh-hans", "小智"), ("en-us", "Xiaozhi")])
def test_a_chinese_server_makes_the_chinese_persona_the_default(settings: Any, language_code: str,
                                                                 default: str) -> None:
    Persona.objects.filter(name="小智").delete()
    settings.LANGUAGE_CODE = language_code
    migration.create_chinese_persona(apps, None)
    assert list(Persona.objects.filter(is_default=True).values_list("name", flat=True)) == [default]


def test_an_operators_own_default_persona_is_kept(settings: Any) -> None:
    Persona.objects.filter(name="小智").delete()
    Persona.objects.update(is_default=False)
    Persona.objects.create(name="Robo", is_default=True)
    settings.LANGUAGE_CODE = "zh-hans"
    migration.create_chinese_persona(apps, None)
    assert list(Persona.objects.filter(is_default=True).values_list("name", flat=True)) == ["Robo"]


piper_migration = importlib.import_module("conversations.migrations.0010_default_persona_piper")


def test_the_english_default_speaks_edge_then_piper_then_espeak() -> None:
    assert Persona.objects.get(name="Xiaozhi").tts_providers == ["edge", "piper", "espeak"]
    assert Persona.objects.create(name="New").tts_providers == ["edge", "piper", "espeak"]


@pytest.mark.parametrize(
    ("before", "after"),
    [(["edge", "espeak"], ["edge", "piper", "espeak"]), (["espeak"], ["espeak"]),
     (["openai", "edge", "espeak"], ["openai", "edge", "espeak"])],
)
def test_the_piper_migration_changes_only_the_shipped_list(before: list[str], after: list[str]) -> None:
    shipped = Persona.objects.get(name="Xiaozhi")
    shipped.tts_providers = before  # the chain of the kinds' default configurations
    shipped.save()
    piper_migration.add_piper(apps, None)
    assert Persona.objects.get(name="Xiaozhi").tts_providers == after
    assert Persona.objects.get(name="小智").tts_providers == ["edge", "espeak"]  # no Chinese Piper voice
    piper_migration.remove_piper(apps, None)
    assert Persona.objects.get(name="Xiaozhi").tts_providers == before
