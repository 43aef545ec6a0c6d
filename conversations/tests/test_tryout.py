""""Try this persona": the admin's text chat through the device's turn code.

The LLM is FakeOpenAI (a real OpenAI-compatible HTTP server on loopback, the real `openai`
client); tools are the real built-in ones; the voice is the real espeak-ng or Piper; the audio
handed back is decoded with PyAV to check it is real speech.
"""
from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import av
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from conversations import tryout
from conversations.models import Persona
from conversations.tests.factories import PersonaFactory
from testing.fake_openai import Call, FakeOpenAI, Reply

pytestmark = pytest.mark.django_db
SECRET = "sk-try-out-secret-4242"


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(autouse=True)
def llm_settings(settings: Any, fake_llm: FakeOpenAI) -> None:
    fake_llm.reset()
    settings.LLM_BASE_URL = fake_llm.base_url
    settings.LLM_API_KEY = SECRET
    settings.LLM_MODEL = "fake-model"
    settings.LLM_TIMEOUT = 5.0
    settings.LLM_FIRST_TOKEN_TIMEOUT = 5.0


@pytest.fixture
def staff(client: Client) -> Client:
    user = get_user_model().objects.create_superuser("alice", "alice@example.com", "alice-password")
    client.force_login(user)
    return client


def persona(**fields: Any) -> Persona:
    defaults = {"language": "en", "llm_providers": ["openai"], "tts_providers": ["espeak"], "greeting": "",
                "system_prompt": "You are {persona_name}. Reply in {language}."}
    return PersonaFactory(**{**defaults, **fields})


def ask(client: Client, target: Persona, message: str, history: list[list[str]] | None = None,
        **extra: Any) -> Any:
    body = json.dumps({"message": message, "history": history or []})
    return client.post(f"/admin/conversations/persona/{target.pk}/try/reply/", body,
                       content_type="application/json", **extra)


def decoded_seconds(data_uri: str) -> float:
    assert data_uri.startswith("data:audio/ogg;base64,")
    data = base64.b64decode(data_uri.split(",", 1)[1])
    with av.open(io.BytesIO(data)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
    return samples / 48000


def test_a_message_gets_the_personas_reply_with_playable_audio(staff: Client, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(text="😊 The kitchen light is on now."))
    response = ask(staff, persona(name="Robo"), "turn on the light")
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["reply"] == "The kitchen light is on now." and data["emotion"] == "happy"
    assert data["llm"] == "openai" and data["tts"] == "espeak" and not data["audio_error"]
    assert 1.0 < decoded_seconds(data["audio"]) < 4.0
    assert abs(data["audio_seconds"] - decoded_seconds(data["audio"])) < 0.2
    request = fake_llm.chat_requests[-1]
    assert request.messages[0]["role"] == "system" and "You are Robo" in request.messages[0]["content"]
    assert request.messages[-1] == {"role": "user", "content": "turn on the light"}


def test_tools_run_through_the_same_loop_as_a_devices(staff: Client, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(tool_calls=[Call("get_current_time", {})]))
    fake_llm.on_tool_result(Reply(text="It is noon."))
    data = ask(staff, persona(), "what time is it").json()
    assert data["tools"] == [{"name": "get_current_time", "success": True}]
    assert data["reply"] == "It is noon."
    tool_round = fake_llm.chat_requests[-1].messages
    assert tool_round[-1]["role"] == "tool" and tool_round[-2]["tool_calls"]
    offered = {t["function"]["name"] for t in fake_llm.chat_requests[0].tools or []}
    assert "get_current_time" in offered and not any(name.startswith("self.") for name in offered)


def test_the_history_sent_back_is_the_context_window(staff: Client, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(text="Blue."))
    history = [["first question", "first answer"], ["second question", "second answer"]]
    ask(staff, persona(context_turns=1), "and now?", history)
    messages = fake_llm.chat_requests[-1].messages
    assert [m["content"] for m in messages[1:]] == ["second question", "second answer", "and now?"]


def test_piper_speaks_when_the_persona_says_so(staff: Client, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(text="Hello from Piper. How are you?"))
    data = ask(staff, persona(tts_providers=["piper"]), "hi").json()
    assert data["tts"] == "piper"
    assert decoded_seconds(data["audio"]) > 1.0


def test_a_failing_llm_is_a_readable_error_without_the_key(staff: Client, fake_llm: FakeOpenAI,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    fake_llm.script(Reply(status=401, error="invalid api key"))
    with caplog.at_level(logging.DEBUG):
        response = ask(staff, persona(), "hi")
    assert response.status_code == 502
    assert response.json()["error"].startswith("No LLM answered:")
    assert SECRET not in response.content.decode() and SECRET not in caplog.text


def test_an_llm_that_never_answers_times_out_after_llm_timeout(staff: Client, fake_llm: FakeOpenAI,
                                                               settings: Any) -> None:
    settings.LLM_TIMEOUT = 0.5
    settings.LLM_FIRST_TOKEN_TIMEOUT = 30.0
    fake_llm.script(Reply(hang=True))
    response = ask(staff, persona(), "hi")
    assert response.status_code == 504
    assert "0.5 s" in response.json()["error"]


def test_when_no_voice_works_the_reply_still_shows(staff: Client, fake_llm: FakeOpenAI, settings: Any) -> None:
    settings.ESPEAK_BINARY = "/nonexistent/espeak-ng"
    fake_llm.script(Reply(text="Words without a voice."))
    data = ask(staff, persona(tts_providers=["espeak"]), "hi").json()
    assert data["reply"] == "Words without a voice." and data["audio"] == ""
    assert data["audio_error"].startswith("No voice could speak the reply")


def test_a_long_reply_is_shown_whole_and_spoken_in_part(staff: Client, fake_llm: FakeOpenAI,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tryout, "MAX_SPOKEN_CHARS", 40)
    text = "This is the first sentence. " * 6
    fake_llm.script(Reply(text=text))
    data = ask(staff, persona(), "talk").json()
    assert data["reply"] == text.strip() and data["spoken_in_part"] is True
    assert decoded_seconds(data["audio"]) < 5.0


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"not json", 400, "The request is not JSON."),
        (b"\xff\xfe", 400, "The request is not JSON."),
        (b"[1, 2]", 400, "Type a message first."),
        (json.dumps({"message": "   "}).encode(), 400, "Type a message first."),
        (json.dumps({"message": 42}).encode(), 400, "Type a message first."),
        (json.dumps({"message": "x" * 1001}).encode(), 400, "The message is too long."),
        (json.dumps({"message": "hi", "history": [["only one"]]}).encode(), 400, "malformed"),
        (json.dumps({"message": "hi", "history": [["a", 7]]}).encode(), 400, "malformed"),
        (json.dumps({"message": "hi", "history": [["a", "b" * 5000]]}).encode(), 400, "malformed"),
        (json.dumps({"message": "hi", "history": "nope"}).encode(), 400, "malformed"),
        (json.dumps({"message": "y" * 40000}).encode(), 413, "too long"),
    ],
)
def test_bad_requests_get_clear_errors_and_never_reach_the_llm(
    staff: Client, fake_llm: FakeOpenAI, body: bytes, status: int, error: str
) -> None:
    target = persona()
    response = staff.post(f"/admin/conversations/persona/{target.pk}/try/reply/", body,
                          content_type="application/json")
    assert response.status_code == status
    assert error in response.json()["error"]
    assert fake_llm.chat_requests == []


def test_only_staff_who_may_change_personas_can_try(client: Client, fake_llm: FakeOpenAI) -> None:
    target = persona()
    assert ask(client, target, "hi").status_code == 403  # anonymous
    assert client.get(f"/admin/conversations/persona/{target.pk}/try/").status_code == 302  # to the login
    viewer = get_user_model().objects.create_user("bob", password="bob-password", is_staff=True)
    client.force_login(viewer)
    assert ask(client, target, "hi").status_code == 403
    assert client.get(f"/admin/conversations/persona/{target.pk}/try/").status_code == 403
    assert fake_llm.chat_requests == []


def test_the_reply_needs_a_post_with_the_csrf_token(fake_llm: FakeOpenAI) -> None:
    user = get_user_model().objects.create_superuser("carol", "c@example.com", "carol-password")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    target = persona()
    assert ask(strict, target, "hi").status_code == 403
    assert strict.get(f"/admin/conversations/persona/{target.pk}/try/reply/").status_code == 405
    assert fake_llm.chat_requests == []


def test_an_unknown_persona_is_not_found(staff: Client) -> None:
    response = staff.post("/admin/conversations/persona/999999/try/reply/", json.dumps({"message": "hi"}),
                          content_type="application/json")
    assert response.status_code == 404
    assert staff.get("/admin/conversations/persona/999999/try/").status_code == 404


def test_the_persona_page_links_to_the_try_page(staff: Client) -> None:
    target = persona(name="Linky")
    page = staff.get(f"/admin/conversations/persona/{target.pk}/change/").content.decode()
    assert f'href="/admin/conversations/persona/{target.pk}/try/"' in page
    chat = staff.get(f"/admin/conversations/persona/{target.pk}/try/")
    assert chat.status_code == 200
    html = chat.content.decode()
    tts_name = target.chain("tts")[0].name
    assert tts_name and f"({tts_name})" in html
    assert "Try Linky" in html and 'id="xz-try-form"' in html and "csrfmiddlewaretoken" in html
    assert SECRET not in html


def test_too_many_try_outs_at_once_are_told_to_wait(staff: Client, fake_llm: FakeOpenAI,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tryout, "_running", tryout.MAX_CONCURRENT)
    response = ask(staff, persona(), "hi")
    assert response.status_code == 429
    assert fake_llm.chat_requests == []
