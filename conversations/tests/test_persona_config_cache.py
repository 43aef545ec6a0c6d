"""Persona configurations are built once per persona revision, and the persona row and MCP
catalogue read once, reused briefly by the devices connecting at the same time (a reboot
storm), without hiding an edit."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from xiaozhi_site import expiring
from conversations.models import PersonaProvider, ProviderConfig
from conversations.selectors import (
    PERSONA_CONFIG_TTL_SECONDS, persona_config_cached, persona_configs_clear, persona_for_device_cached,
)
from conversations.tests.factories import PersonaFactory
from devices.tests.factories import DeviceFactory
from tools.models import McpServer
from tools.selectors import mcp_tool_sources

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


# -- the persona row and the MCP catalogue, read once for the devices connecting together -----


def setup_queries(device: Any) -> int:
    with CaptureQueriesContext(connection) as queries:
        persona = persona_for_device_cached(device)
        mcp_tool_sources(server_names=("home",), max_age=PERSONA_CONFIG_TTL_SECONDS)
    assert persona.pk is not None
    return len(queries)


def test_devices_of_one_persona_read_its_row_and_catalogue_once() -> None:
    persona = PersonaFactory()
    McpServer.objects.create(name="home", url="http://127.0.0.1:9/mcp")
    first, second = DeviceFactory(persona=persona), DeviceFactory(persona=persona)
    assert setup_queries(first) > 0
    assert setup_queries(second) == 0
    assert persona_for_device_cached(second) == persona
    # Each session gets sources of its own, built from the shared catalogue.
    one, two = (mcp_tool_sources(server_names=("home",), max_age=1.0) for _ in range(2))
    assert [s.origin for s in one] == ["home"] and one[0] is not two[0]


def test_devices_without_a_persona_get_the_default_and_others_their_own() -> None:
    own = PersonaFactory()
    default = persona_for_device_cached(DeviceFactory(persona=None))
    assert default.is_default
    assert persona_for_device_cached(DeviceFactory(persona=own)) == own


def test_an_edit_clears_the_persona_row_and_the_catalogue_at_once() -> None:
    persona = PersonaFactory(greeting="Hello")
    device = DeviceFactory(persona=persona)
    server = McpServer.objects.create(name="home", url="http://127.0.0.1:9/mcp")
    assert persona_for_device_cached(device).greeting == "Hello"
    assert mcp_tool_sources(server_names=("home",), max_age=1.0)[0].server.url == "http://127.0.0.1:9/mcp"
    persona.greeting = "Welcome back"
    persona.save()
    assert persona_for_device_cached(device).greeting == "Welcome back"
    server.url = "http://127.0.0.1:10/mcp"
    server.save()
    assert mcp_tool_sources(server_names=("home",), max_age=1.0)[0].server.url == "http://127.0.0.1:10/mcp"


def test_the_cache_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another worker's edit sends this process no signal: the row is read again after the TTL."""
    device = DeviceFactory(persona=PersonaFactory())
    now = [1000.0]
    monkeypatch.setattr(expiring.time, "monotonic", lambda: now[0])  # the clock of every such cache
    assert setup_queries(device) > 0
    now[0] += PERSONA_CONFIG_TTL_SECONDS + 0.01
    assert setup_queries(device) > 0


def test_without_max_age_the_catalogue_is_read_each_time() -> None:
    McpServer.objects.create(name="home", url="http://127.0.0.1:9/mcp")
    mcp_tool_sources()
    with CaptureQueriesContext(connection) as queries:
        mcp_tool_sources()
    assert len(queries) > 0
