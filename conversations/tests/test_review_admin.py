"""Conversation review in the admin: the chat page, the list (titles, filters, search), the
export, the device page's link, and what hostile rows or missing files do to them."""
from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.test import Client
from django.utils import timezone

from conversations.models import Conversation, Persona, Turn
from conversations.tests.review_data import REPLY, UTTERANCE, rich_conversation
from devices.models import Device
from devices.tests.factories import BoundDeviceFactory, UserFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/conversations/conversation/"


def page_of(conversation: Conversation) -> str:
    return f"{LIST}{conversation.pk}/change/"


@pytest.fixture(autouse=True)
def _fast(settings: Any, tmp_path: Path) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.MEDIA_ROOT = str(tmp_path / "media")


@pytest.fixture
def kitchen() -> Device:
    return BoundDeviceFactory(mac="02:00:00:00:0a:01", name="Kitchen speaker",
                              owner=UserFactory(username="olga"))


@pytest.fixture
def conversation(kitchen: Device) -> Conversation:
    return rich_conversation(device=kitchen, persona=Persona.objects.create(name="Xiaoming"))


def listed(response: Any) -> list[int]:
    assert response.status_code == 200
    return sorted(response.context["cl"].result_list.values_list("pk", flat=True))


# --- the chat page ---------------------------------------------------------------------------------


def test_the_conversation_page_reads_like_a_chat(admin_client: Client, conversation: Conversation) -> None:
    response = admin_client.get(page_of(conversation))
    page = response.content.decode()
    assert response.status_code == 200
    # Title: device, persona, turn count.
    assert response.context["title"].startswith("Kitchen speaker · Xiaoming · ")
    assert response.context["title"].endswith("· 3 turns")
    # Bubbles in order: what the user said, the tool calls, the reply with its emotion.
    order = [page.index(text) for text in (UTTERANCE, "self.light.turn_on", "weather", "🙂", REPLY)]
    assert order == sorted(order)
    assert "tell me a long story" in page and "Once upon a time there was" in page


def test_tool_calls_show_source_duration_outcome_and_pretty_printed_json(
    admin_client: Client, conversation: Conversation,
) -> None:
    page = admin_client.get(page_of(conversation)).content.decode()
    assert page.count('<details class="xz-tool') == 2
    assert '<details class="xz-tool xz-tool-failed">' in page
    assert "device" in page and "MCP server" in page and "48 ms" in page
    assert "timed out" in page  # the error code "timeout" in words
    # Arguments and the JSON text result are indented, one key per line.
    assert "{\n  &quot;room&quot;: &quot;kitchen&quot;,\n  &quot;brightness&quot;: 80\n}" in page
    assert "{\n  &quot;ok&quot;: true,\n  &quot;state&quot;: &quot;on&quot;\n}" in page
    assert "MCP server did not answer within 10 s" in page


def test_timings_are_a_labelled_waterfall_in_pipeline_order(admin_client: Client, conversation: Conversation) -> None:
    page = admin_client.get(page_of(conversation)).content.decode()
    labels = ["End of speech", "Speech recognised", "First LLM token", "First synthesized audio",
              "First audio frame sent", "Last audio frame sent"]
    first_turn = page[page.index('id="turn-0"'):page.index('id="turn-1"')]
    positions = [first_turn.index(label) for label in labels]
    assert positions == sorted(positions)
    for raw in ("asr_done", "llm_first_token", "first_frame_sent"):
        assert raw not in page
    assert "+492" in first_turn  # ASR done (312 ms) → first LLM token (804 ms)
    assert "2451 ms" in first_turn


def test_a_tts_fallback_and_an_llm_failure_are_visible_at_a_glance(
    admin_client: Client, conversation: Conversation,
) -> None:
    page = admin_client.get(page_of(conversation)).content.decode()
    first = page[page.index('id="turn-0"'):page.index('id="turn-1"')]
    third = page[page.index('id="turn-2"'):]
    assert "Fallback" in first
    assert "✘ edge" in first and "ConnectionError" in first and "12 ms lost" in first and "✔ espeak" in first
    assert "Fallback" not in third  # nothing served after openai failed: that is an error, not a fallback
    assert "✘ openai" in third and "APIConnectionError" in third and "2005 ms lost" in third
    assert "llm: APIConnectionError" in third and "xz-badge-error" in third


def test_interrupted_turns_are_marked(admin_client: Client, conversation: Conversation) -> None:
    page = admin_client.get(page_of(conversation)).content.decode()
    second = page[page.index('id="turn-1"'):page.index('id="turn-2"')]
    assert "Interrupted" in second
    assert "Interrupted" not in page[page.index('id="turn-0"'):page.index('id="turn-1"')]


def test_how_the_turn_ended_is_one_line_beside_the_waterfall(admin_client: Client) -> None:
    device = Conversation.objects.create(session_id="eot-1", source=Conversation.SOURCE_DEVICE)
    Turn.objects.create(conversation=device, index=0, user_text="what time is it", timings={
        "speech_end": 0.0, "asr_done": 120.0, "turn_silence_ms": 262.4, "turn_checks": 1.0, "turn_complete": 1.0,
        "turn_probability": 0.9712, "turn_model_ms": 83.6})
    Turn.objects.create(conversation=device, index=1, user_text="I want to order a pizza", timings={
        "speech_end": 0.0, "turn_silence_ms": 1530.0, "turn_checks": 2.0, "turn_complete": 0.0,
        "turn_probability": 0.04, "turn_model_ms": 80.0})
    Turn.objects.create(conversation=device, index=2, user_text="hello", timings={
        "speech_end": 0.0, "turn_silence_ms": 640.0, "turn_probability": "hostile", "turn_complete": True})
    page = admin_client.get(page_of(device)).content.decode()
    first = page[page.index('id="turn-0"'):page.index('id="turn-1"')]
    second = page[page.index('id="turn-1"'):page.index('id="turn-2"')]
    third = page[page.index('id="turn-2"'):]
    assert "Ended by the end-of-turn model (probability 0.97, 84 ms) after 262 ms of silence" in first
    assert "Ended by the silence limit after 1530 ms" in second and "2 checks" in second
    assert "Ended after 640 ms of silence" in third  # no model numbers: said plainly, nothing invented
    assert "turn_" not in page  # never a raw key, and never a bar in the waterfall


def test_gateway_turns_show_their_own_timing_labels(admin_client: Client) -> None:
    gateway = Conversation.objects.create(session_id="gw-1", source=Conversation.SOURCE_GATEWAY)
    Turn.objects.create(conversation=gateway, index=0, user_text="hello", reply_text="hi there",
                        timings={"llm_ms": 420.5, "total_ms": 433.0}, providers={"llm": "openai", "model": "qwen"})
    response = admin_client.get(page_of(gateway))
    page = response.content.decode()
    assert "Language model (all rounds)" in page and "Whole turn" in page
    assert "llm_ms" not in page and "End of speech" not in page
    assert "qwen" in page  # the model served, shown when no attempts were recorded
    assert response.context["title"].startswith("LLM Gateway client · ")


def test_audio_players_point_at_the_protected_view_and_missing_files_say_so(
    admin_client: Client, conversation: Conversation,
) -> None:
    turn = conversation.turns.get(index=0)
    kept = default_storage.save("turns/2026/01/01/kept.ogg", ContentFile(b"OggS-not-really"))
    Turn.objects.filter(pk=turn.pk).update(user_audio=kept, user_audio_ms=1600,
                                           reply_audio="turns/2026/01/01/gone.ogg", reply_audio_ms=1700)
    page = admin_client.get(page_of(conversation)).content.decode()
    first = page[page.index('id="turn-0"'):page.index('id="turn-1"')]
    assert f'src="/admin/conversations/conversation/audio/{turn.pk}/user/"' in first
    assert "1.6 s" in first
    assert f"/audio/{turn.pk}/reply/" not in first  # the file is gone: no dead player
    assert "Audio unavailable" in first
    assert "/media/" not in page


def test_hostile_history_rows_still_render(admin_client: Client) -> None:
    conversation = Conversation.objects.create(session_id="odd")
    Turn.objects.create(
        conversation=conversation, index=0, user_text="<script>alert(1)</script>", reply_text="x" * 5000,
        emotion="<b>", tool_calls=[42, "call", {"name": "<img src=x onerror=alert(1)>", "arguments": "not json {",
                                                "result": "[1, 2", "success": "yes", "duration_ms": "fast"}],
        timings=["not", "a", "dict"], providers="edge",
        provider_attempts={"tts": [{"kind": 5}, "x", {"kind": "edge", "ok": "true", "ms": "12", "error": None}],
                           "asr": "nope"},
    )
    Turn.objects.create(conversation=conversation, index=1, timings={"asr_done": -5, "weird": True, "x": 1e12})
    response = admin_client.get(page_of(conversation))
    page = response.content.decode()
    assert response.status_code == 200
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page
    assert "✘ edge" in page  # ok must be the JSON true, not a truthy string


def test_long_conversations_are_paged(admin_client: Client) -> None:
    conversation = Conversation.objects.create(session_id="long")
    Turn.objects.bulk_create([Turn(conversation=conversation, index=i, user_text=f"question {i}")
                              for i in range(120)])
    first = admin_client.get(page_of(conversation)).content.decode()
    last = admin_client.get(page_of(conversation), {"page": 3}).content.decode()
    assert 'id="turn-0"' in first and 'id="turn-49"' in first and 'id="turn-50"' not in first
    assert "Turns 1–50 of 120" in first
    assert 'id="turn-119"' in last and 'id="turn-99"' not in last


def test_a_turn_opens_in_its_conversation_page(admin_client: Client, conversation: Conversation) -> None:
    turn = conversation.turns.get(index=2)
    response = admin_client.get(f"/admin/conversations/turn/{turn.pk}/change/")
    assert response.status_code == 302
    assert response["Location"] == f"{page_of(conversation)}?page=1#turn-2"


def test_the_page_is_for_staff_with_view_permission_only(client: Client, conversation: Conversation) -> None:
    assert client.get(page_of(conversation)).status_code == 302  # anonymous: to the login page
    staff = get_user_model().objects.create_user("sam", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(page_of(conversation)).status_code == 403
    assert client.get(f"{page_of(conversation)[:-7]}export/").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_conversation"))
    assert client.get(page_of(conversation)).status_code == 200


def test_the_page_cannot_be_posted_to(admin_client: Client, conversation: Conversation) -> None:
    assert admin_client.post(page_of(conversation), {"session_id": "x"}).status_code == 405
    assert Conversation.objects.get(pk=conversation.pk).session_id == "3f1c-review"


def test_an_unknown_conversation_redirects_to_the_list(admin_client: Client) -> None:
    response = admin_client.get(f"{LIST}999999/change/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/")


def test_the_page_queries_do_not_grow_with_turns(
    admin_client: Client, conversation: Conversation, django_assert_max_num_queries: Any,
) -> None:
    Turn.objects.bulk_create([Turn(conversation=conversation, index=i, user_text="q", tool_calls=[],
                                   provider_attempts={"tts": [{"kind": "espeak", "ok": True, "ms": 5}]})
                              for i in range(3, 50)])
    with django_assert_max_num_queries(12):
        assert admin_client.get(page_of(conversation)).status_code == 200


# --- the list -------------------------------------------------------------------------------------------


def test_the_list_shows_titles_turn_counts_and_issues(admin_client: Client, conversation: Conversation) -> None:
    response = admin_client.get(LIST)
    page = response.content.decode()
    assert listed(response) == [conversation.pk]
    assert "Kitchen speaker · Xiaoming · " in page
    assert "1 error</span>" in page and "1 interrupted</span>" in page
    title = page[page.index('<th class="field-conversation">'):]
    assert title.startswith(f'<th class="field-conversation"><a href="{page_of(conversation)}">Kitchen speaker · ')
    assert "3f1c-review" not in title[:title.index("</th>")]  # session UUIDs are not titles


def test_conversations_without_turns_are_hidden_unless_asked_for(admin_client: Client,
                                                                  conversation: Conversation) -> None:
    empty = Conversation.objects.create(session_id="nobody-spoke")
    assert listed(admin_client.get(LIST)) == [conversation.pk]
    assert listed(admin_client.get(LIST, {"turns": "empty"})) == [empty.pk]
    assert listed(admin_client.get(LIST, {"turns": "all"})) == sorted([conversation.pk, empty.pk])


def test_the_list_filters_by_owner_device_persona_source_date_errors_and_interruptions(
    admin_client: Client, conversation: Conversation, kitchen: Device,
) -> None:
    other_device = BoundDeviceFactory(mac="02:00:00:00:0a:02", name="Bedroom")
    calm = Conversation.objects.create(session_id="calm", device=other_device,
                                       persona=Persona.objects.create(name="Calm"))
    Turn.objects.create(conversation=calm, index=0, user_text="good night", reply_text="sleep well")
    gateway = Conversation.objects.create(session_id="gw", source=Conversation.SOURCE_GATEWAY)
    Turn.objects.create(conversation=gateway, index=0, user_text="hi")
    Conversation.objects.filter(pk=gateway.pk).update(started_at=timezone.now() - timedelta(days=40))

    assert listed(admin_client.get(LIST, {"owner": kitchen.owner_id})) == [conversation.pk]
    assert listed(admin_client.get(LIST, {"device": other_device.pk})) == [calm.pk]
    assert listed(admin_client.get(LIST, {"device": "not-a-number"})) == []
    assert listed(admin_client.get(LIST, {"persona__id__exact": calm.persona_id})) == [calm.pk]
    assert listed(admin_client.get(LIST, {"source": "gateway"})) == [gateway.pk]
    assert listed(admin_client.get(LIST, {"errors": "yes"})) == [conversation.pk]
    assert listed(admin_client.get(LIST, {"errors": "no"})) == sorted([calm.pk, gateway.pk])
    assert listed(admin_client.get(LIST, {"interrupted": "yes"})) == [conversation.pk]
    since = (timezone.now() - timedelta(days=7)).isoformat()
    assert listed(admin_client.get(LIST, {"started_at__gte": since})) == sorted([conversation.pk, calm.pk])


def test_search_finds_what_was_said_and_devices_by_label_mac(admin_client: Client, conversation: Conversation) -> None:
    other = Conversation.objects.create(session_id="other")
    Turn.objects.create(conversation=other, index=0, user_text="play some jazz", reply_text="Here is jazz")
    assert listed(admin_client.get(LIST, {"q": "KITCHEN LIGHT"})) == [conversation.pk]
    assert listed(admin_client.get(LIST, {"q": "jazz"})) == [other.pk]
    assert listed(admin_client.get(LIST, {"q": "02-00-00-00-0A-01"})) == [conversation.pk]
    assert listed(admin_client.get(LIST, {"q": "nobody said this"})) == []


def test_the_list_queries_do_not_grow_with_rows(admin_client: Client, kitchen: Device,
                                                django_assert_max_num_queries: Any) -> None:
    for n in range(30):
        conversation = Conversation.objects.create(session_id=f"s{n}", device=kitchen)
        Turn.objects.create(conversation=conversation, index=0, user_text="hi", error="x" if n % 2 else "")
    with django_assert_max_num_queries(10):
        assert len(listed(admin_client.get(LIST))) == 30


# --- export -----------------------------------------------------------------------------------


def test_a_conversation_exports_as_json_with_audio_links(admin_client: Client, conversation: Conversation) -> None:
    turn = conversation.turns.get(index=0)
    Turn.objects.filter(pk=turn.pk).update(reply_audio="turns/x.ogg", reply_audio_ms=1700)
    response = admin_client.get(f"{LIST}{conversation.pk}/export/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert f'filename="conversation-{conversation.pk}.json"' in response["Content-Disposition"]
    data = json.loads(response.content)
    assert data["conversation"]["device"] == {"mac": "02:00:00:00:0a:01", "name": "Kitchen speaker"}
    assert data["conversation"]["persona"] == "Xiaoming"
    first, second, third = data["turns"]
    assert first["user_text"] == UTTERANCE and first["reply_text"] == REPLY
    assert first["tool_calls"][0]["arguments"] == {"room": "kitchen", "brightness": 80}
    assert first["timings_ms"]["last_frame_sent"] == 2450.7
    assert first["provider_attempts"]["tts"][0] == {"kind": "edge", "ok": False, "ms": 12.0,
                                                    "error": "ConnectionError"}
    assert first["audio"]["user"] is None
    assert first["audio"]["reply"] == {
        "url": f"http://testserver/admin/conversations/conversation/audio/{turn.pk}/reply/", "duration_ms": 1700}
    assert second["interrupted"] is True and third["error"] == "llm: APIConnectionError"


def test_export_of_an_unknown_conversation_is_404(admin_client: Client) -> None:
    assert admin_client.get(f"{LIST}424242/export/").status_code == 404


# --- the device page -----------------------------------------------------------------------------------


def test_the_device_page_links_to_its_conversations_and_shows_its_last_turn(
    admin_client: Client, conversation: Conversation, kitchen: Device,
) -> None:
    page = admin_client.get(f"/admin/devices/device/{kitchen.pk}/change/").content.decode()
    assert f'href="/admin/conversations/conversation/?device={kitchen.pk}">1 conversation</a>' in page
    last = conversation.turns.get(index=2)
    assert f'href="/admin/conversations/turn/{last.pk}/change/"' in page
    assert "what is the weather" in page and "error" in page


def test_a_device_without_conversations_says_so(admin_client: Client) -> None:
    device = BoundDeviceFactory(mac="02:00:00:00:0a:09")
    page = admin_client.get(f"/admin/devices/device/{device.pk}/change/").content.decode()
    assert "0 conversations" in page and "No turn yet." in page


def test_personas_have_a_recording_switch(admin_client: Client) -> None:
    persona = Persona.objects.create(name="Quiet")
    page = admin_client.get(f"/admin/conversations/persona/{persona.pk}/change/").content.decode()
    assert 'name="record_audio"' in page
