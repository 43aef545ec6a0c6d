"""The admin's "Test" buttons (issue 14): a configuration or a whole persona tried live
against the loopback OpenAI-compatible stubs, espeak-ng, Piper and faster-whisper, with
readable errors and a bound of the configuration's timeout."""
from __future__ import annotations

import io
import re
import wave
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from conversations.models import ProviderConfig
from conversations.provider_configs import persona_chain_set
from conversations.tests.factories import PersonaFactory
from testing.fake_openai import FakeOpenAI, Reply

pytestmark = pytest.mark.django_db

KEY = "sk-probe-0123456789abcdef"


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture(scope="module")
def fake() -> Any:
    with FakeOpenAI(transcript="the quick brown fox jumps over the lazy dog") as server:
        yield server


def probe_url(config: ProviderConfig) -> str:
    return reverse("admin:conversations_providerconfig_test", args=[config.pk])


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def wav(response: Any) -> tuple[int, int]:
    """(sample rate, frames) of a WAV response."""
    assert response.status_code == 200 and response["Content-Type"] == "audio/wav", response.content[:300]
    with wave.open(io.BytesIO(response.content)) as audio:
        return audio.getframerate(), audio.getnframes()


def test_an_llm_answers_with_its_reply_and_time_to_first_token(staff: Client, fake: FakeOpenAI) -> None:
    fake.reset()
    fake.default = Reply(text="Hello, I am the stub.")
    config = ProviderConfig.objects.create(name="Stub", stage="llm", kind="openai", base_url=fake.base_url,
                                           model="stub-model", api_key=KEY)
    data = staff.post(probe_url(config)).json()
    assert data["ok"] and data["text"] == "Hello, I am the stub." and data["first_token_ms"] <= data["ms"]
    assert "first token after" in data["summary"]
    assert fake.chat_requests[-1].model == "stub-model"


@pytest.mark.parametrize(("reply", "base_url", "timeout", "message"), [
    (Reply(status=401, error=f"Incorrect API key provided: {KEY}"), None, None,
     "The endpoint refused the API key (HTTP 401)."),
    (Reply(status=500, error="boom"), None, None, "The endpoint answered HTTP 500"),
    (Reply(hang=True), None, 1.0, "No answer within 1 s (the configuration's timeout)."),
    (None, "http://127.0.0.1:9/v1", None, "Connection refused"),
    (None, "http://no-such-host.invalid/v1", None, "could not be resolved (DNS failure)"),
])
def test_errors_are_one_readable_line_without_the_key(
    staff: Client, fake: FakeOpenAI, reply: Reply | None, base_url: str | None, timeout: float | None, message: str,
) -> None:
    fake.reset()
    if reply is not None:
        fake.default = reply
    config = ProviderConfig.objects.create(name="Bad", stage="llm", kind="openai", base_url=base_url or fake.base_url,
                                           api_key=KEY, timeout=timeout)
    response = staff.post(probe_url(config))
    data = response.json()
    assert response.status_code == 502 and not data["ok"]
    assert message in data["error"] and KEY not in response.content.decode()
    assert data["summary"].startswith("Failed after")
    fake.default = Reply(text="好的。")


def test_an_incomplete_configuration_says_what_is_missing(staff: Client) -> None:
    # asr.openai without a base URL, and none in the environment.
    config = ProviderConfig.objects.create(name="No URL", stage="asr", kind="openai")
    data = staff.post(probe_url(config)).json()
    assert not data["ok"] and "incomplete" in data["error"] and "base_url" in data["error"]


def test_an_openai_compatible_tts_sentence_comes_back_as_playable_wav(staff: Client, fake: FakeOpenAI) -> None:
    fake.reset()
    config = ProviderConfig.objects.create(name="Speech", stage="tts", kind="openai", base_url=fake.base_url,
                                           model="tts-1", voice="alloy")
    rate, frames = wav(staff.post(probe_url(config), {"text": "Testing one two three."}))
    assert rate == 24000 and frames > rate // 2
    assert fake.requests[-1].body["input"] == "Testing one two three." and fake.requests[-1].body["voice"] == "alloy"


@pytest.mark.parametrize("kind", ["espeak", "piper"])
def test_local_engines_speak_the_sentence(staff: Client, kind: str) -> None:
    config = ProviderConfig.objects.create(name=kind, stage="tts", kind=kind)
    rate, frames = wav(staff.post(probe_url(config), {"language": "en"}))
    assert frames > rate // 2  # at least half a second of speech


def test_an_openai_compatible_asr_transcribes_the_bundled_sample(staff: Client, fake: FakeOpenAI) -> None:
    fake.reset()
    config = ProviderConfig.objects.create(name="Whisper API", stage="asr", kind="openai", base_url=fake.base_url)
    data = staff.post(probe_url(config)).json()
    assert data["ok"] and data["text"] == "the quick brown fox jumps over the lazy dog"
    assert data["expected"] == "The quick brown fox jumps over the lazy dog."
    assert fake.requests[-1].file is not None and fake.requests[-1].file[:4] == b"RIFF"


@pytest.mark.slow
def test_faster_whisper_transcribes_the_bundled_sample(staff: Client) -> None:
    config = ProviderConfig.objects.create(name="Whisper", stage="asr", kind="faster_whisper", timeout=60)
    data = staff.post(probe_url(config)).json()
    assert data["ok"], data
    assert len(words(data["text"]) & words(data["expected"])) >= 5, data


def test_a_whole_persona_is_tested_at_once(staff: Client, fake: FakeOpenAI) -> None:
    fake.reset()
    fake.default = Reply(text="Persona here.")
    persona = PersonaFactory(language="en")
    llm = ProviderConfig.objects.create(name="LLM stub", stage="llm", kind="openai", base_url=fake.base_url)
    dead = ProviderConfig.objects.create(name="Dead LLM", stage="llm", kind="openai", base_url="http://127.0.0.1:9/v1")
    asr = ProviderConfig.objects.create(name="ASR stub", stage="asr", kind="openai", base_url=fake.base_url)
    tts = ProviderConfig.objects.create(name="espeak here", stage="tts", kind="espeak")
    persona_chain_set(persona=persona, configs=[dead, llm])
    persona_chain_set(persona=persona, configs=[asr])
    persona_chain_set(persona=persona, configs=[tts])
    response = staff.post(reverse("admin:conversations_persona_test", args=[persona.pk]))
    rows = [(r["stage"], r["name"], r["ok"]) for r in response.json()["results"]]
    assert rows == [("asr", "ASR stub", True), ("llm", "Dead LLM", False), ("llm", "LLM stub", True),
                    ("tts", "espeak here", True)]
    page = staff.get(reverse("admin:conversations_persona_change", args=[persona.pk])).content.decode()
    assert "persona-test-button" in page and "provider_test.js" in page


def test_tests_are_for_staff_and_post_only(client: Client, staff: Client) -> None:
    config = ProviderConfig.objects.create(name="espeak", stage="tts", kind="espeak")
    assert staff.get(probe_url(config)).status_code == 405
    assert staff.post(reverse("admin:conversations_providerconfig_test", args=[99999])).status_code == 404
    staff.logout()
    assert client.post(probe_url(config)).status_code == 403
    plain = get_user_model().objects.create_user("bob", "bob@example.com", "pw", is_staff=True)
    client.force_login(plain)  # staff, without the permission to change configurations
    assert client.post(probe_url(config)).status_code == 403
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(get_user_model().objects.get(username="root"))
    assert csrf.post(probe_url(config)).status_code == 403


def test_the_voice_picker_lists_an_engines_voices_for_a_language(staff: Client) -> None:
    url = reverse("admin:conversations_providerconfig_voices")
    voices = staff.get(url, {"kind": "espeak", "language": "zh"}).json()["voices"]
    names = {v["name"] for v in voices}
    assert "cmn" in names and "en-us" not in names and {v["kind"] for v in voices} == {"espeak"}
    both = staff.get(url, {"kind": ["piper", "openai", "nope"], "language": "en"}).json()["voices"]
    assert {"piper", "openai"} == {v["kind"] for v in both} and "alloy" in {v["name"] for v in both}
    assert staff.post(url).status_code == 405

    config = ProviderConfig.objects.create(name="espeak", stage="tts", kind="espeak")
    page = staff.get(reverse("admin:conversations_providerconfig_change", args=[config.pk])).content.decode()
    assert "data-voice-picker" in page and "voice_picker.js" in page and probe_url(config) in page
    persona = PersonaFactory(tts_providers=["piper", "espeak"])
    page = staff.get(reverse("admin:conversations_persona_change", args=[persona.pk])).content.decode()
    assert 'data-kinds="piper,espeak"' in page and 'data-language-source="id_language"' in page


def test_every_configuration_has_a_test_button_in_the_list(staff: Client) -> None:
    config = ProviderConfig.objects.create(name="espeak", stage="tts", kind="espeak")
    page = staff.get(reverse("admin:conversations_providerconfig_changelist")).content.decode()
    assert f'data-probe-url="{probe_url(config)}"' in page and "provider_test.js" in page
    assert 'id="provider-test-labels"' in page
