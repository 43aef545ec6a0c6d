"""The review page in a real browser: an operator opens a conversation and plays its audio."""
from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conversations.models import Persona
from conversations.recording import turn_audio_save
from conversations.tests.review_data import rich_conversation, turn_audio
from devices.models import Device

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

PLAYER = "document.querySelector('#turn-0 .xz-row-assistant audio')"


def test_an_operator_plays_the_reply_audio_of_a_turn(asgi_server_factory: Any, browser_factory: Any,
                                                     staff_user: Any, settings: Any, tmp_path: Path) -> None:
    media = tmp_path / "media"
    settings.MEDIA_ROOT = str(media)
    device = Device.objects.create(mac="02:00:00:00:0b:01", name="Kitchen speaker")
    conversation = rich_conversation(device=device, persona=Persona.objects.create(name="Xiaoming"))
    saved = turn_audio_save(turn_id=conversation.turns.get(index=0).pk, audio=turn_audio())
    assert saved.user and saved.reply
    server = asgi_server_factory(XIAOZHI_MEDIA_ROOT=str(media))
    for path in (f"/media/{saved.reply}", f"/{saved.reply}"):  # files are not reachable by URL
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.http_url + path, timeout=10)
        assert refused.value.code == 404

    browser = browser_factory(server.http_url)
    browser.login("alice", "alice-password")
    browser.open(f"/admin/conversations/conversation/{conversation.pk}/change/")
    browser.wait_for(lambda: browser.js(f"return {PLAYER} !== null"), what="the reply player")
    assert "turn on the kitchen light" in browser.text()
    browser.set_size(1400, 1900)
    browser.screenshot("conversation-page")

    browser.js(f"{PLAYER}.play()")
    browser.wait_for(lambda: browser.js(f"return {PLAYER}.currentTime") > 0.5, what="the reply audio to play")
    state = browser.js(f"const a = {PLAYER}; return {{error: a.error && a.error.code, duration: a.duration}}")
    assert state["error"] is None
    assert 1.0 < state["duration"] < 3.0  # "The kitchen light is on now." as espeak says it
    browser.screenshot("conversation-page-playing")

    # Seeking back works (the audio view answers Range requests).
    browser.js(f"{PLAYER}.currentTime = 0.2")
    browser.wait_for(lambda: browser.js(f"const a = {PLAYER}; return !a.seeking && a.error === null"),
                     what="the seek to finish")

    # The list finds it by what was said; the device page leads back to it.
    browser.open("/admin/conversations/conversation/?q=kitchen+light")
    assert "Kitchen speaker · Xiaoming" in browser.text() and "1 error" in browser.text()
    browser.screenshot("conversation-list")
    browser.open(f"/admin/devices/device/{device.pk}/change/")
    assert "1 conversation" in browser.text() and "what is the weather" in browser.text()
    browser.screenshot("device-page")

    browser.set_size(390, 1600)  # a phone, in the admin's dark theme
    browser.open(f"/admin/conversations/conversation/{conversation.pk}/change/")
    browser.js("document.documentElement.dataset.theme = 'dark'")
    browser.screenshot("conversation-page-phone-dark")
