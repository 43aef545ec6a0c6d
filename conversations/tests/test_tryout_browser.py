""""Try this persona" in a real browser: an operator chats with a persona and plays its voice.

Real daphne subprocess, real headless Chromium, the real turn code with a built-in tool, the
real Piper voice; the LLM is the scripted FakeOpenAI on loopback (the only fake).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conversations.models import Persona
from testing.fake_openai import Call, FakeOpenAI, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

LAST_PLAYER = "Array.from(document.querySelectorAll('#xz-try-log audio')).pop()"


def test_an_operator_tries_a_persona_and_hears_its_reply(asgi_server_factory: Any, browser_factory: Any,
                                                         staff_user: Any, tmp_path: Path) -> None:
    persona = Persona.objects.create(name="Robo", language="en", llm_providers=["openai"],
                                     tts_providers=["piper", "espeak"], greeting="")
    with FakeOpenAI() as fake:
        fake.script(Reply(tool_calls=[Call("get_current_time", {})]))
        fake.on_tool_result(Reply(text="😊 It is time for tea. Shall I set a timer?"))
        server = asgi_server_factory(LLM_BASE_URL=fake.base_url, LLM_MODEL="fake-model")
        browser = browser_factory(server.http_url)
        browser.login("alice", "alice-password")

        browser.open(f"/admin/conversations/persona/{persona.pk}/change/")
        browser.driver.find_element("css selector", "a.xz-try-link").click()
        browser.wait_for(lambda: browser.js("return document.getElementById('xz-try-form') !== null"),
                         what="the try-out page")
        assert "Try Robo" in browser.text()

        box = browser.driver.find_element("id", "xz-try-message")
        box.send_keys("what time is it?")
        browser.driver.find_element("id", "xz-try-send").click()
        browser.wait_for(lambda: browser.js(f"return {LAST_PLAYER} !== undefined"), timeout=60,
                         what="the reply and its player")
        text = browser.text()
        assert "It is time for tea. Shall I set a timer?" in text
        assert "get_current_time" in text and "piper" in text
        browser.wait_for(lambda: browser.js(f"return {LAST_PLAYER}.readyState") >= 1, what="the audio metadata")
        state = browser.js(f"const a = {LAST_PLAYER}; return {{error: a.error && a.error.code, duration: a.duration}}")
        assert state["error"] is None and 1.5 < state["duration"] < 8.0
        browser.js(f"{LAST_PLAYER}.play()")
        browser.wait_for(lambda: browser.js(f"return {LAST_PLAYER}.currentTime") > 0.3, what="the reply to play")
        shot = browser.screenshot("try-persona")
        assert shot.exists() and shot.stat().st_size > 10_000

        # A second message carries the first exchange along.
        fake.script(Reply(text="Done."))
        box.send_keys("yes please")
        browser.driver.find_element("id", "xz-try-send").click()
        browser.wait_for(lambda: browser.js("return document.querySelectorAll('#xz-try-log audio').length") == 2,
                         timeout=60, what="the second reply")
        sent = fake.chat_requests[-1].messages
        assert [m["content"] for m in sent if m["role"] == "user"] == ["what time is it?", "yes please"]
        browser.screenshot("try-persona-second")
