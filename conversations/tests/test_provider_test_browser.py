"""The provider "Test" buttons and the voice picker in a real browser (issue 14): an operator
tests a TTS configuration and hears it, previews a voice, and tests a whole persona."""
from __future__ import annotations

from typing import Any

import pytest

from conversations.models import ProviderConfig
from conversations.provider_configs import persona_chain_set
from conversations.tests.factories import PersonaFactory
from testing.fake_openai import FakeOpenAI, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

PLAY = """
const done = arguments[arguments.length - 1];
const audio = document.querySelector(arguments[0]);
audio.currentTime = 0;
audio.play().then(() => setTimeout(() => done({time: audio.currentTime, duration: audio.duration,
                                                error: audio.error && audio.error.code, src: audio.src}), 600),
                  (error) => done({failed: String(error)}));
"""


def play(browser: Any, selector: str) -> dict[str, Any]:
    browser.driver.set_script_timeout(15)
    state: dict[str, Any] = browser.driver.execute_async_script(PLAY, selector)
    return state


def test_an_operator_tests_a_voice_and_a_persona_and_hears_them(
        asgi_server_factory: Any, browser_factory: Any, staff_user: Any) -> None:
    with FakeOpenAI(default=Reply(text="Hello from the stub."), transcript="the quick brown fox") as fake:
        espeak = ProviderConfig.objects.create(name="espeak-ng here", stage="tts", kind="espeak", voice="en-us")
        llm = ProviderConfig.objects.create(name="LLM stub", stage="llm", kind="openai", base_url=fake.base_url)
        asr = ProviderConfig.objects.create(name="ASR stub", stage="asr", kind="openai", base_url=fake.base_url)
        persona = PersonaFactory(name="Tester", language="en")
        for chain in ([asr], [llm], [espeak]):
            persona_chain_set(persona=persona, configs=chain)
        server = asgi_server_factory()
        browser = browser_factory(server.http_url)
        browser.login("alice", "alice-password")

        # One configuration: the sentence is synthesized, loads and plays.
        browser.open(f"/admin/conversations/providerconfig/{espeak.pk}/change/")
        browser.js("document.getElementById('provider-test-button').click()")
        output = "document.querySelector('#provider-test output').textContent"
        running = browser.js("return document.getElementById('provider-test-labels').dataset.running")
        browser.wait_for(lambda: browser.js(f"return {output}") not in ("", running), what="the test's answer",
                         timeout=20)
        assert "Synthesized in" in browser.js(f"return {output}"), browser.js(f"return {output}")
        state = play(browser, "#provider-test audio")
        assert "failed" not in state and state["error"] is None, state
        assert state["src"].startswith("blob:") and state["duration"] > 0.5 and state["time"] > 0, state
        browser.js("document.getElementById('provider-test').scrollIntoView()")
        browser.screenshot("config-test-played")

        # The voice picker: espeak's voices, filtered by language; the preview speaks.
        count = browser.wait_for(lambda: int(browser.js(
            "return Number(document.getElementById('id_voice').dataset.voiceCount || 0)")), what="the voice list")
        browser.js("const s = document.querySelector('select.voice-language'); s.value = 'zh';"
                   "s.dispatchEvent(new Event('change'))")
        browser.wait_for(lambda: browser.js(
            "return [...document.getElementById('id_voice').list.options].some(o => o.value === 'cmn')"),
            what="Mandarin voices")
        assert int(browser.js("return Number(document.getElementById('id_voice').dataset.voiceCount)")) < count
        browser.js("document.querySelector('button.voice-preview').click()")
        browser.wait_for(lambda: browser.js("return document.querySelector('audio.voice-preview-audio').src"),
                         what="the preview audio", timeout=20)
        assert "failed" not in play(browser, "audio.voice-preview-audio")
        browser.js("document.getElementById('id_voice').scrollIntoView()")
        browser.screenshot("voice-picker")

        # The list: each configuration has its own Test button.
        browser.open("/admin/conversations/providerconfig/")
        browser.js(f"document.querySelector('button[data-probe-url*=\"/{llm.pk}/test/\"]').click()")
        cell = f"document.querySelector('button[data-probe-url*=\"/{llm.pk}/test/\"]').parentNode"
        browser.wait_for(lambda: "Hello from the stub." in browser.js(f"return {cell}.textContent"),
                         what="the LLM's answer in the list", timeout=20)
        browser.js(f"document.querySelector('button[data-probe-url*=\"/{espeak.pk}/test/\"]').click()")
        row_audio = f"button[data-probe-url*='/{espeak.pk}/test/'] ~ audio"
        browser.wait_for(lambda: browser.js(f"return document.querySelector(\"{row_audio}\").src"),
                         what="the list's audio", timeout=20)
        assert "failed" not in play(browser, row_audio)
        browser.screenshot("config-list-tests")

        # A whole persona: one row per configuration, the TTS row playable.
        browser.open(f"/admin/conversations/persona/{persona.pk}/change/")
        browser.js("document.getElementById('persona-test-button').click()")
        browser.wait_for(lambda: browser.js("return document.querySelectorAll('#persona-test tbody tr').length") == 3,
                         what="the persona's results", timeout=30)
        rows = browser.js("return [...document.querySelectorAll('#persona-test tbody tr')].map(r => r.innerText)")
        assert all("✔" in row for row in rows), rows
        assert "Hello from the stub." in rows[1] and "the quick brown fox" in rows[0]
        browser.js("document.querySelector('#persona-test tbody button').click()")
        browser.wait_for(lambda: browser.js("return document.querySelector('#persona-test audio').src"),
                         what="the persona's voice", timeout=20)
        assert "failed" not in play(browser, "#persona-test audio")
        browser.js("document.getElementById('persona-test').scrollIntoView()")
        browser.screenshot("persona-test")
