"""Persona configurations are built once per persona revision and reused briefly by the devices
connecting at the same time (a reboot storm), without hiding an edit."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations.models import PersonaProvider, ProviderConfig
from conversations.selectors import persona_config_cached, persona_configs_clear
from conversations.tests.factories import PersonaFactory
from tools.models import McpServer

pytestmark = pytest.mark.django_db

ENV: dict[str, dict[str, Any]] = {}


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    persona_configs_clear()


def build_queries(persona: Any) -> int:
    with CaptureQueriesContext(connection) as queries:
        persona_config_cached(persona, ENV)
    return len(queries)


def test_devices_connecting_together_share_one_build() -> None:
    persona = PersonaFactory()
    assert build_queries(persona) > 0
    assert build_queries(persona) == 0


def test_an_edit_of_the_persona_is_used_at_once() -> None:
    persona = PersonaFactory(greeting="Hello")
    assert persona_config_cached(persona, ENV).greeting == "Hello"
    persona.greeting = "Welcome back"
    persona.save()  # a new updated_at: a new key, in every process
    assert persona_config_cached(persona, ENV).greeting == "Welcome back"


def test_an_edit_of_what_the_persona_refers_to_clears_the_cache() -> None:
    persona = PersonaFactory()
    before = persona_config_cached(persona, ENV)
    config = ProviderConfig.objects.create(name="Local LLM", stage="llm", kind="openai",
                                           base_url="http://127.0.0.1:9/v1")
    PersonaProvider.objects.create(persona=persona, config=config)
    after = persona_config_cached(persona, ENV)
    assert [getattr(entry, "name", entry) for entry in after.llm] == ["Local LLM"] and after.llm != before.llm
    server = McpServer.objects.create(name="home", url="http://127.0.0.1:9/mcp")
    persona.mcp_servers.add(server)
    assert persona_config_cached(persona, ENV).mcp_servers == ("home",)


def test_other_environment_options_build_anew() -> None:
    persona = PersonaFactory()
    persona_config_cached(persona, ENV)
    with CaptureQueriesContext(connection) as queries:
        persona_config_cached(persona, {"llm.openai": {"base_url": "http://127.0.0.1:9/v1"}})
    assert len(queries) > 0
