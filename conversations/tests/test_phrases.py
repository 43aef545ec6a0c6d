"""Spoken system phrases and TTS voices chosen by the conversation's language (pure)."""
from __future__ import annotations

import pytest

from conversations.models import LANGUAGES
from conversations.pipeline import phrases
from conversations.pipeline.commands import activation_text
from conversations.providers.tts.edge import pick_voice
from conversations.providers.tts.espeak import EspeakTTS
from conversations.providers.tts.voices import EDGE_VOICES, ESPEAK_VOICES, PIPER_VOICES, base_language


@pytest.mark.parametrize("language", ["zh", "zh-CN", "zh_CN", "zh-Hans", "ZH"])
def test_the_activation_code_is_read_digit_by_digit_in_chinese(language: str) -> None:
    assert phrases.activation_prompt("032125", language) == "请在管理后台输入验证码 0 3 2 1 2 5"


def test_the_activation_code_in_english_and_for_unknown_languages() -> None:
    english = "Please bind this device in the admin with code 0 3 2 1 2 5."
    assert phrases.activation_prompt("032125", "en") == english
    assert phrases.activation_prompt("032125", "xx") == english
    assert phrases.activation_prompt("032125", "") == english
    assert activation_text("032125", "zh") == "请在管理后台输入验证码 0 3 2 1 2 5"


def test_without_a_code_the_device_is_told_to_be_bound() -> None:
    assert phrases.activation_prompt(None, "zh") == "这台设备还没有绑定，请在管理后台完成绑定。"
    assert phrases.activation_prompt("", "en") == "This device is not bound yet. Please bind it in the admin."


def test_the_apology_follows_the_language() -> None:
    assert phrases.apology("zh-CN") == "抱歉，我这边出了点问题，请再说一遍。"
    assert phrases.apology("en") == "Sorry, something went wrong. Please try again."


@pytest.mark.parametrize(("configured", "language", "farewell"), [
    ("Goodbye!", "zh", "再见！"),  # the model's default is a stock phrase: said in Chinese
    ("再见！", "en", "Goodbye!"),
    ("  Goodbye!  ", "de", "Auf Wiedersehen!"),
    ("下次见啦～", "en", "下次见啦～"),  # the operator's own words are never replaced
    ("See you soon!", "zh", "See you soon!"),
    ("", "zh", ""),  # idle timeout with no farewell: just close
])
def test_the_idle_farewell_translates_only_the_stock_phrase(configured: str, language: str, farewell: str) -> None:
    assert phrases.farewell(configured, language) == farewell


def test_the_goodbye_after_an_exit_phrase_is_never_silent() -> None:
    assert phrases.goodbye("", "zh") == "再见！"
    assert phrases.goodbye("", "en") == "Goodbye!"
    assert phrases.goodbye("拜拜啦", "zh") == "拜拜啦"


def test_the_greeting_translates_the_stock_phrase_and_keeps_none() -> None:
    assert phrases.greeting("Hi, I'm listening.", "zh") == "你好，我在听。"
    assert phrases.greeting("你好，我在听。", "en") == "Hi, I'm listening."
    assert phrases.greeting("有什么可以帮你？", "en") == "有什么可以帮你？"
    assert phrases.greeting("", "zh") == ""


def test_every_phrase_exists_in_every_persona_language() -> None:
    for key, texts in phrases.PHRASES.items():
        missing = {code for code, _ in LANGUAGES} - texts.keys()
        assert not missing, (key, missing)
        assert all(text.count("{digits}") == (key == "activation_code") for text in texts.values()), key


# -- voices --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("language", "base"), [("zh-CN", "zh"), ("zh_Hans", "zh"), ("EN-us", "en"), ("", "")])
def test_language_tags_reduce_to_their_base_language(language: str, base: str) -> None:
    assert base_language(language) == base


@pytest.mark.parametrize(("voice", "language", "expected"), [
    ("", "zh", "cmn"), ("", "zh-CN", "cmn"), ("zh-CN-XiaoxiaoNeural", "zh", "cmn"),  # an Edge voice is not espeak's
    ("", "en", "en-us"), ("alloy", "en-GB", "en-us"), ("", "ja", "ja"), ("", "xx", "en-us"),
    ("yue", "zh", "yue"), ("en+f3", "zh", "en+f3"),  # an espeak voice named by the persona wins
])
async def test_espeak_picks_its_voice_by_language(voice: str, language: str, expected: str) -> None:
    assert await EspeakTTS()._pick_voice(voice, language) == expected


@pytest.mark.parametrize(("voice", "language", "expected"), [
    ("", "zh", "zh-CN-XiaoxiaoNeural"), ("cmn", "zh-Hans", "zh-CN-XiaoxiaoNeural"),
    ("", "en", "en-US-AriaNeural"), ("", "xx", "en-US-AriaNeural"),
    ("zh-CN-YunxiNeural", "zh", "zh-CN-YunxiNeural"),
])
def test_edge_picks_its_voice_by_language_when_the_persona_names_none(voice: str, language: str, expected: str) -> None:
    assert pick_voice(voice, language) == expected


def test_every_engine_has_a_voice_for_chinese_and_english() -> None:
    for table in (ESPEAK_VOICES, EDGE_VOICES):
        assert {"zh", "en"} <= table.keys()
    # Piper lists only the voice it ships (en_US); a Chinese persona's chain moves on to the
    # next engine instead of reading Chinese with it (test_tts_piper.py).
    assert PIPER_VOICES.keys() == {"en"}
