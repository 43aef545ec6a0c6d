"""Provider configurations in the admin (issue 14): created, validated, ordered on a
persona, protected while used, and their API keys never shown or logged."""
from __future__ import annotations

import logging
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from conversations.models import Persona, PersonaProvider, ProviderConfig
from conversations.pipeline.fallback import build_chain, stream_llm
from conversations.provider_configs import persona_chain_set, provider_config_default, provider_spec
from conversations.selectors import persona_config
from conversations.tests.factories import PersonaFactory
from testing.fake_openai import FakeOpenAI, Reply

pytestmark = pytest.mark.django_db

SECRET = "sk-live-abcdef0123456789SECRET"
PREFIXES = {"asr": "provider_links", "llm": "provider_links-2", "tts": "provider_links-3",
            "vision": "provider_links-4"}


@pytest.fixture
def staff(client: Client) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


def config_form(**fields: Any) -> dict[str, Any]:
    data = {"name": "DeepSeek", "stage": "llm", "kind": "openai", "base_url": "https://api.deepseek.com/v1",
            "new_api_key": "", "model": "deepseek-chat", "voice": "", "timeout": "", "options": "{}"}
    data.update(fields)
    return data


def persona_form(persona: Persona | None, chains: dict[str, list[tuple[int | None, int, int, bool]]],
                 **fields: Any) -> dict[str, Any]:
    """The persona change form: its fields and, per stage, rows (link id, config id, position, delete)."""
    data: dict[str, Any] = {
        "name": persona.name if persona else "New persona", "description": "", "system_prompt": "Be {persona_name}.",
        "language": "en", "voice": "", "llm_model": "", "temperature": "0.7", "max_tokens": "512",
        "context_turns": "10", "vad_threshold": "0.5", "vad_threshold_low": "0.3", "vad_min_silence_ms": "600",
        "turn_detection": "smart", "turn_pause_ms": "200", "turn_max_silence_ms": "1500",
        "barge_in_min_ms": "180", "barge_in_min_probability": "0.8",
        "greeting": "", "farewell": "Goodbye!", "exit_phrases": "", "device_tool_exclusions": "",
        "device_tools_enabled": "on", "record_audio": "on",
    }
    data.update(fields)
    for stage, prefix in PREFIXES.items():
        rows = chains.get(stage, [])
        initial = sum(1 for row in rows if row[0] is not None)
        data.update({f"{prefix}-TOTAL_FORMS": str(len(rows)), f"{prefix}-INITIAL_FORMS": str(initial),
                     f"{prefix}-MIN_NUM_FORMS": "0", f"{prefix}-MAX_NUM_FORMS": "1000"})
        for n, (link_id, config_id, position, delete) in enumerate(rows):
            data[f"{prefix}-{n}-id"] = str(link_id or "")
            data[f"{prefix}-{n}-persona"] = str(persona.pk) if persona else ""
            data[f"{prefix}-{n}-config"] = str(config_id)
            data[f"{prefix}-{n}-position"] = str(position)
            if delete:
                data[f"{prefix}-{n}-DELETE"] = "on"
    return data


def current_rows(persona: Persona) -> dict[str, list[tuple[int | None, int, int, bool]]]:
    rows: dict[str, list[tuple[int | None, int, int, bool]]] = {}
    for link in PersonaProvider.objects.filter(persona=persona).select_related("config").order_by("position", "pk"):
        rows.setdefault(link.config.stage, []).append((link.pk, link.config_id, link.position, False))
    return rows


def errors(response: Any) -> str:
    return response.content.decode()


# -- configurations ----------------------------------------------------------------------------


def test_a_config_is_created_and_its_key_is_stored_but_never_shown(staff: Client) -> None:
    response = staff.post(reverse("admin:conversations_providerconfig_add"), config_form(new_api_key=SECRET))
    assert response.status_code == 302, errors(response)
    config = ProviderConfig.objects.get(name="DeepSeek")
    assert (config.api_key, config.base_url, config.model) == (SECRET, "https://api.deepseek.com/v1", "deepseek-chat")
    assert SECRET not in repr(config) and SECRET not in str(config)

    change = staff.get(reverse("admin:conversations_providerconfig_change", args=[config.pk]))
    page = change.content.decode()
    assert change.status_code == 200 and SECRET not in page and ">set<" in page.replace("\n", "")

    # Blank keeps the key; a new one replaces it; "clear" empties it.
    for fields, expected in (({}, SECRET), ({"new_api_key": "sk-new-0000"}, "sk-new-0000"),
                             ({"clear_api_key": "on"}, "")):
        response = staff.post(reverse("admin:conversations_providerconfig_change", args=[config.pk]),
                              config_form(**fields))
        assert response.status_code == 302, errors(response)
        config.refresh_from_db()
        assert config.api_key == expected


def test_an_env_reference_is_shown_by_name_and_resolved_at_use(staff: Client, monkeypatch: Any) -> None:
    staff.post(reverse("admin:conversations_providerconfig_add"), config_form(new_api_key="env:DEEPSEEK_API_KEY"))
    config = ProviderConfig.objects.get(name="DeepSeek")
    page = staff.get(reverse("admin:conversations_providerconfig_changelist")).content.decode()
    assert "env:DEEPSEEK_API_KEY" in page
    page = staff.get(reverse("admin:conversations_providerconfig_change", args=[config.pk])).content.decode()
    assert "from the environment variable DEEPSEEK_API_KEY" in page
    monkeypatch.setenv("DEEPSEEK_API_KEY", SECRET)
    spec = provider_spec(config, {"llm.openai": {"base_url": "http://env/", "api_key": "env-key", "timeout": 5}})
    assert spec.kwargs["api_key"] == SECRET and spec.kwargs["base_url"] == "https://api.deepseek.com/v1"
    assert spec.model == "deepseek-chat" and SECRET not in repr(spec)


def test_a_config_with_its_own_url_never_inherits_the_environments_key() -> None:
    config = ProviderConfig.objects.create(name="Other", stage="llm", kind="openai", base_url="http://other:8000/v1")
    spec = provider_spec(config, {"llm.openai": {"base_url": "http://env/", "api_key": "env-key", "timeout": 5.0}})
    assert "api_key" not in spec.kwargs and spec.kwargs["timeout"] == 5.0


@pytest.mark.parametrize(("fields", "field", "message"), [
    ({"kind": "nope"}, "kind", "Select a valid choice"),
    ({"stage": "asr", "kind": "edge"}, "kind", "Unknown ASR provider"),
    ({"base_url": "ftp://example.com/"}, "base_url", "http:// or https://"),
    ({"base_url": "not a url"}, "base_url", "http:// or https://"),
    ({"base_url": "https://user:pw@example.com/v1"}, "base_url", "not in the URL"),
    ({"options": '{"max_retry": 2}'}, "options", "max_retry: unknown option"),
    ({"options": '{"max_retries": 9}'}, "options", "max_retries: Input should be less than or equal to 3"),
    ({"options": "{not json"}, "options", "Enter a valid JSON"),
    ({"stage": "tts", "kind": "espeak", "options": '{"speed": "fast"}'}, "options", "speed:"),
    ({"timeout": "0"}, "timeout", "greater than or equal to 0.5"),
    ({"timeout": "100000"}, "timeout", "less than or equal to 600"),
    ({"new_api_key": "env:DATABASE_URL"}, "new_api_key", "_API_KEY or _TOKEN"),
    ({"new_api_key": "env:not valid"}, "new_api_key", "env:DEEPSEEK_API_KEY"),
])
def test_bad_input_is_a_clear_form_error(staff: Client, fields: dict[str, str], field: str, message: str) -> None:
    response = staff.post(reverse("admin:conversations_providerconfig_add"), config_form(**fields))
    assert response.status_code == 200
    form_errors = response.context["adminform"].form.errors
    assert field in form_errors and message in " ".join(form_errors[field]), form_errors
    assert not ProviderConfig.objects.filter(name="DeepSeek").exists()


def test_a_config_in_use_cannot_be_deleted_and_the_page_says_where(staff: Client) -> None:
    persona = PersonaFactory(name="Helper")
    config = ProviderConfig.objects.create(name="Used", stage="llm", kind="openai", api_key=SECRET)
    persona_chain_set(persona=persona, configs=[config])
    url = reverse("admin:conversations_providerconfig_delete", args=[config.pk])
    page = staff.get(url).content.decode()
    assert "Cannot delete" in page and "Helper" in page and SECRET not in page
    staff.post(url, {"post": "yes"})
    assert ProviderConfig.objects.filter(pk=config.pk).exists()
    response = staff.post(reverse("admin:conversations_providerconfig_changelist"),
                          {"action": "delete_selected", "_selected_action": [config.pk], "post": "yes"})
    assert ProviderConfig.objects.filter(pk=config.pk).exists() and SECRET not in response.content.decode()


# -- a persona's chains ----------------------------------------------------------------------------


def test_a_personas_llm_chain_is_ordered_in_the_admin(staff: Client) -> None:
    persona = PersonaFactory(asr_providers=["faster_whisper"], tts_providers=["edge", "espeak"])
    cloud = ProviderConfig.objects.create(name="Cloud", stage="llm", kind="openai", base_url="https://c.example/v1")
    local = ProviderConfig.objects.create(name="Local", stage="llm", kind="openai", base_url="http://ollama:11434/v1")
    persona_chain_set(persona=persona, configs=[cloud])
    rows = current_rows(persona)
    rows["llm"] = [*rows["llm"], (None, local.pk, 1, False)]
    url = reverse("admin:conversations_persona_change", args=[persona.pk])
    response = staff.post(url, persona_form(persona, rows))
    assert response.status_code == 302, errors(response)
    assert [c.name for c in persona.chain("llm")] == ["Cloud", "Local"]

    # Moving Local up (what the up button does: positions renumbered in row order).
    rows = current_rows(persona)
    (cloud_id, _, _, _), (local_id, _, _, _) = rows["llm"]
    rows["llm"] = [(cloud_id, cloud.pk, 1, False), (local_id, local.pk, 0, False)]
    assert staff.post(url, persona_form(persona, rows)).status_code == 302
    assert [c.name for c in persona.chain("llm")] == ["Local", "Cloud"]
    assert [spec.name for spec in persona_config(persona).llm] == ["Local", "Cloud"]

    page = staff.get(url).content.decode()
    assert "chain_order.js" in page and "chain-position" in page


def test_an_empty_or_repeating_chain_is_refused(staff: Client) -> None:
    persona = PersonaFactory(llm_providers=["openai"])
    url = reverse("admin:conversations_persona_change", args=[persona.pk])
    rows = current_rows(persona)
    link_id, config_id, _, _ = rows["llm"][0]
    emptied = {**rows, "llm": [(link_id, config_id, 0, True)]}
    response = staff.post(url, persona_form(persona, emptied))
    assert response.status_code == 200
    assert "Add at least one LLM provider configuration" in response.content.decode()
    assert [c.kind for c in persona.chain("llm")] == ["openai"]

    twice = {**rows, "llm": [(link_id, config_id, 0, False), (None, config_id, 1, False)]}
    response = staff.post(url, persona_form(persona, twice))
    llm = next(f for f in response.context["inline_admin_formsets"] if f.formset.prefix == PREFIXES["llm"])
    assert "duplicate data" in str(llm.formset.non_form_errors())
    assert [c.kind for c in persona.chain("llm")] == ["openai"]


def test_a_new_persona_starts_with_the_default_chains(staff: Client) -> None:
    page = staff.get(reverse("admin:conversations_persona_add"))
    llm_formset = next(f for f in page.context["inline_admin_formsets"] if f.formset.prefix == PREFIXES["llm"])
    default_llm = provider_config_default(stage="llm", kind="openai")
    assert [form.initial["config"] for form in llm_formset.formset.forms] == [default_llm.pk]
    formsets = page.context["inline_admin_formsets"]
    chains = {stage: [(None, form.initial["config"], form.initial["position"], False) for form in fs.formset.forms]
              for stage in PREFIXES for fs in formsets if fs.formset.prefix == PREFIXES[stage]}
    response = staff.post(reverse("admin:conversations_persona_add"), persona_form(None, chains))
    assert response.status_code == 302, errors(response)
    persona = Persona.objects.get(name="New persona")
    assert persona.tts_providers == ["edge", "piper", "espeak"] and persona.llm_providers == ["openai"]


def test_a_persona_made_in_code_shows_the_default_chain_it_runs(staff: Client) -> None:
    persona = PersonaFactory()  # no chains: it runs the defaults
    assert persona_config(persona).tts == ("edge", "piper", "espeak")
    page = staff.get(reverse("admin:conversations_persona_change", args=[persona.pk]))
    tts = next(f for f in page.context["inline_admin_formsets"] if f.formset.prefix == PREFIXES["tts"])
    assert [form.initial["config"] for form in tts.formset.forms] == [
        provider_config_default(stage="tts", kind=kind).pk for kind in ("edge", "piper", "espeak")]


def test_keys_never_appear_on_any_admin_page(staff: Client) -> None:
    persona = PersonaFactory(name="Keyed")
    config = ProviderConfig.objects.create(name="Secret cloud", stage="llm", kind="openai", api_key=SECRET,
                                           base_url="https://c.example/v1")
    persona_chain_set(persona=persona, configs=[config])
    # An edit through the admin, so the history has an entry about the key.
    staff.post(reverse("admin:conversations_providerconfig_change", args=[config.pk]),
               config_form(name="Secret cloud", new_api_key=SECRET + "2"))
    assert LogEntry.objects.filter(object_id=str(config.pk)).exists()
    pages = [
        reverse("admin:conversations_providerconfig_changelist"),
        reverse("admin:conversations_providerconfig_change", args=[config.pk]),
        reverse("admin:conversations_providerconfig_history", args=[config.pk]),
        reverse("admin:conversations_providerconfig_delete", args=[config.pk]),
        reverse("admin:conversations_persona_changelist"),
        reverse("admin:conversations_persona_change", args=[persona.pk]),
        reverse("admin:conversations_persona_history", args=[persona.pk]),
        reverse("admin:index"),
    ]
    for url in pages:
        response = staff.get(url)
        assert response.status_code == 200, url
        assert SECRET not in response.content.decode(), url
    for entry in LogEntry.objects.all():
        assert SECRET not in entry.change_message and SECRET not in entry.object_repr


async def test_a_failing_endpoint_whose_error_quotes_the_key_leaves_no_key_in_the_logs(
        caplog: pytest.LogCaptureFixture) -> None:
    failing_key, serving_key = "sk-failing-0123456789abcdef", "sk-serving-0123456789abcdef"
    with (FakeOpenAI(default=Reply(status=401, error=f"Incorrect API key provided: {failing_key}")) as failing,
          FakeOpenAI(default=Reply(text="fine"), api_key=serving_key) as serving):
        first = ProviderConfig(name="A", stage="llm", kind="openai", base_url=failing.base_url, api_key=failing_key)
        second = ProviderConfig(name="B", stage="llm", kind="openai", base_url=serving.base_url, api_key=serving_key)
        specs = [provider_spec(first, {}), provider_spec(second, {})]
        caplog.set_level(logging.DEBUG)
        chain = build_chain("llm", specs, {})
        try:
            kind, deltas = await stream_llm(chain, [{"role": "user", "content": "hi"}], tools=None, model="m",
                                            temperature=0.1, max_tokens=20)
            text = "".join([delta.text async for delta in deltas])
        finally:
            await chain.aclose()
    assert (kind, text) == ("openai", "fine")
    assert any(record.getMessage() == "provider failed, trying the next one" for record in caplog.records)
    for record in caplog.records:
        rendered = f"{record.getMessage()} {record.__dict__} {record.exc_text or ''}"
        assert failing_key not in rendered and serving_key not in rendered, rendered


def test_the_review_tells_two_configurations_of_one_kind_apart() -> None:
    from conversations.capture import AttemptLog
    from conversations.review import stage_attempts

    log = AttemptLog()
    log.failed("llm", "openai", RuntimeError(), 40.0, config="Cloud")
    log.served("llm", "openai", 400.0, config="Local")
    (llm,) = stage_attempts(log.as_json())
    assert [(k.kind, k.ok, k.failed) for k in llm.kinds] == [("Cloud · openai", 0, 1), ("Local · openai", 1, 0)]
    assert llm.fell_back


def test_seeded_key_references_read_the_settings_with_their_defaults(settings: Any, monkeypatch: Any) -> None:
    from conversations.provider_configs import api_key_resolve

    monkeypatch.delenv("LLM_API_KEY", raising=False)
    settings.LLM_API_KEY = "from-settings"
    assert api_key_resolve("env:LLM_API_KEY") == "from-settings"
    monkeypatch.setenv("OTHER_API_KEY", SECRET)
    assert api_key_resolve("env:OTHER_API_KEY") == SECRET
    assert api_key_resolve("env:DATABASE_URL") == ""  # not a key variable: never read
    assert api_key_resolve(SECRET) == SECRET
