"""Emotion emoji, speech cleanup and sentence splitting (pure, table-driven)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conversations.pipeline.text import (
    EMOJI_EMOTIONS,
    SentenceSplitter,
    clean_for_speech,
    is_speakable,
    split_emotion,
)

EMOTIONS = {
    "neutral", "happy", "laughing", "funny", "sad", "angry", "crying", "loving", "embarrassed", "surprised",
    "shocked", "thinking", "winking", "cool", "relaxed", "delicious", "kissy", "confident", "sleepy", "silly",
    "confused",
}  # fmt: skip


def test_every_emoji_maps_to_one_of_the_21_emotions() -> None:
    assert set(EMOJI_EMOTIONS.values()) == EMOTIONS


@pytest.mark.parametrize(
    ("emoji", "emotion"),
    [("😶", "neutral"), ("🙂", "happy"), ("😆", "laughing"), ("😂", "funny"), ("😔", "sad"), ("😠", "angry"),
     ("😭", "crying"), ("😍", "loving"), ("😳", "embarrassed"), ("😲", "surprised"), ("😱", "shocked"),
     ("🤔", "thinking"), ("😉", "winking"), ("😎", "cool"), ("😌", "relaxed"), ("🤤", "delicious"),
     ("😘", "kissy"), ("😏", "confident"), ("😴", "sleepy"), ("😜", "silly"), ("🙄", "confused"),
     ("😊", "happy"), ("😀", "happy"), ("😢", "sad"), ("😮", "surprised"), ("😐", "neutral")],
)  # fmt: skip
def test_the_protocol_table_and_common_variants_are_mapped(emoji: str, emotion: str) -> None:
    assert EMOJI_EMOTIONS[emoji] == emotion


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("😊你好呀！", ("happy", "你好呀！")),
        ("  🤔 Let me think.", ("thinking", "Let me think.")),
        ("❤️ 爱你", ("loving", "爱你")),  # with variation selector
        ("☺ hi", ("happy", "hi")),  # without it
        ("✨😢 Oh no", ("sad", "Oh no")),  # first known emoji in the leading run wins
        ("😢😊 mixed", ("sad", "mixed")),
        ("🌞 Sunny today", (None, "🌞 Sunny today")),  # unknown emoji: text untouched
        ("你好😊", (None, "你好😊")),  # not leading
        ("Plain text", (None, "Plain text")),
        ("", (None, "")),
        ("😊", ("happy", "")),
    ],
)
def test_split_emotion_takes_the_leading_emoji(text: str, expected: tuple[str | None, str]) -> None:
    assert split_emotion(text) == expected


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("今天天气很好😊，适合出门", "今天天气很好，适合出门"),
        ("Great! 🎉🎉 Let's go", "Great! Let's go"),
        ("👨‍👩‍👧 family", "family"),  # ZWJ sequence
        ("👍🏽 ok", "ok"),  # skin tone
        ("🇨🇳 中国", "中国"),  # flag
        ("⭐️ star ❤️", "star"),  # variation selectors
        ("★重点☆ ◆一◇二 ●三■四□五", "重点 一二 三四五"),
        ("※ 注意 → 这里", "注意 这里"),
        ("**加粗**和*斜体*和__下划线__", "加粗和斜体和下划线"),
        ("Use `pip install` now", "Use pip install now"),
        ("## 今日要点", "今日要点"),
        ("- 第一点\n* 第二点\n+ 第三点", "第一点 第二点 第三点"),
        ("1. 打开应用\n2) 点击设置", "打开应用 点击设置"),
        ("详见[官网](https://example.com)。", "详见官网。"),
        ("看图![示意图](http://x/a.png)就懂", "看图就懂"),
        ("> 引用的话\n> 第二行", "引用的话 第二行"),
        ("| 城市 | 温度 |\n|---|:---:|\n| 北京 | 25 |", "城市, 温度 北京, 25"),
        ("```python\nprint(1)\n```", "print(1)"),
        ("上文\n---\n下文", "上文 下文"),
        ("~~删掉~~保留", "删掉保留"),
        ("3 * 4 = 12, 2*3*4, snake_case_name", "3 * 4 = 12, 2*3*4, snake_case_name"),
        ("**没闭合的加粗", "没闭合的加粗"),
        ("，好的。", "好的。"),
        ("  多个   空格\n\n和换行  ", "多个 空格 和换行"),
        ("😊", ""),
        ("**", ""),
        ("。！", ""),
        ("-5 degrees", "-5 degrees"),
    ],
)
def test_clean_for_speech(text: str, spoken: str) -> None:
    assert clean_for_speech(text) == spoken


@pytest.mark.parametrize(
    ("text", "speakable"), [("a", True), ("五", True), ("3", True), ("😊。!", False), ("", False)]
)
def test_is_speakable(text: str, speakable: bool) -> None:
    assert is_speakable(text) is speakable


def _split(text: str, **options: int | bool) -> list[str]:
    """Feed one character at a time, the hardest case for boundary decisions."""
    splitter = SentenceSplitter(**options)  # type: ignore[arg-type]
    sentences = [s for ch in text for s in splitter.push(ch)]
    return sentences + splitter.flush()


SPLITS = [
    ("你好。今天天气很好！你呢？", ["你好。", "今天天气很好！", "你呢？"]),
    ("第一；第二：第三", ["第一；", "第二：", "第三"]),
    ("第一行\n第二行\n", ["第一行", "第二行"]),
    ("Hello there. How are you? Fine!", ["Hello there.", "How are you?", "Fine!"]),
    ("It costs 3.5 yuan. Done.", ["It costs 3.5 yuan.", "Done."]),
    ("Mr. Smith and Dr. Who met, e.g. at noon. Bye.", ["Mr. Smith and Dr. Who met, e.g. at noon.", "Bye."]),
    ("J. K. Rowling wrote it. Yes.", ["J. K. Rowling wrote it.", "Yes."]),
    ("Visit example.com today. Ok.", ["Visit example.com today.", "Ok."]),
    ("1. First step.\n2. Second step.", ["1. First step.", "2. Second step."]),
    ("他说：“你好。”然后走了。", ["他说：", "“你好。”", "然后走了。"]),
    ("Really?! Yes.", ["Really?!", "Yes."]),
    ("Wait... what? No.", ["Wait...", "what?", "No."]),
    ("好的.我们走.", ["好的.", "我们走."]),
    ("No final punctuation", ["No final punctuation"]),
    ("😊\n你好。", ["😊\n你好。"]),  # an emoji-only line is merged forward
    ("你好。😊", ["你好。"]),  # a trailing unspeakable rest is dropped
    ("。。你好。", ["。。你好。"]),
    ("**注意。**这是重点。", ["**注意。**", "这是重点。"]),
    ("第一句。**第二句**很重要。", ["第一句。", "**第二句**很重要。"]),
    ("**加粗里面。还在加粗**外面。", ["**加粗里面。还在加粗**外面。"]),
    ("`a. b` 结束。", ["`a. b` 结束。"]),
    ("看[这里。说明](http://a.b/c?d=1)好。", ["看[这里。说明](http://a.b/c?d=1)好。"]),
    ("网址 http://a.com/?q=1!x 好。", ["网址 http://a.com/?q=1!x 好。"]),
    ("", []),
]


@pytest.mark.parametrize(("text", "sentences"), SPLITS)
def test_sentences_end_at_terminators_without_first_clause(text: str, sentences: list[str]) -> None:
    assert _split(text, first_clause=False) == sentences


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("好的，我来帮你查一下天气，请稍等。北京今天晴，气温25度。",
         ["好的，我来帮你查一下天气，", "请稍等。", "北京今天晴，气温25度。"]),
        ("Sure thing, let me check that for you, ok.", ["Sure thing,", "let me check that for you, ok."]),
        ("嗯，好，今天天气真不错、阳光明媚。", ["嗯，好，今天天气真不错、", "阳光明媚。"]),
        ("约3~5天可以到达~很快的。", ["约3~5天可以到达~", "很快的。"]),
        ("It has 1,000,000 stars, wow.", ["It has 1,000,000 stars,", "wow."]),
        ("~~删除线的内容~~和后文，然后。", ["~~删除线的内容~~和后文，", "然后。"]),
        ("😊 好，好，好的没问题，马上。", ["😊 好，好，好的没问题，", "马上。"]),
        # A one-word opener is a chunk of its own (a short first render); later sentences
        # stay whole, commas and all.
        ("😊 Sure, I can help with that. Here is a short answer, for you.",
         ["😊 Sure,", "I can help with that.", "Here is a short answer, for you."]),
        ("Okay, let me see.", ["Okay,", "let me see."]),
        ("OK, let me see.", ["OK, let me see."]),  # too short to stand alone
        ("Yes, of course.", ["Yes, of course."]),
    ],
)  # fmt: skip
def test_the_first_sentence_may_end_at_a_comma(text: str, sentences: list[str]) -> None:
    assert _split(text) == sentences


def test_first_clause_applies_again_after_flush() -> None:
    splitter = SentenceSplitter()
    assert splitter.push("好的好的好的，然后，") == ["好的好的好的，"]
    assert splitter.flush() == ["然后，"]
    assert splitter.push("第二轮回复开始了，") == []  # still waiting for the character after "，"
    assert splitter.push("后面") == ["第二轮回复开始了，"]


def test_reset_drops_pending_text() -> None:
    splitter = SentenceSplitter()
    splitter.push("被打断的一句话")
    splitter.reset()
    assert splitter.flush() == []


def test_a_run_on_sentence_is_cut_at_a_pause() -> None:
    text = "这是一个很长的句子" * 5 + "，" + "没有句号的部分" * 10
    sentences = _split(text, first_clause=False, max_chars=60)
    assert sentences[0] == "这是一个很长的句子" * 5 + "，"
    assert all(len(s) <= 60 for s in sentences)
    assert "".join(sentences) == text


def test_sentences_are_emitted_as_soon_as_the_next_character_arrives() -> None:
    splitter = SentenceSplitter(first_clause=False)
    assert splitter.push("Done.") == []  # "." might be "Done.5" or "Done.com"
    assert splitter.push(" Next") == ["Done."]
    assert splitter.push("\n") == ["Next"]  # a newline needs no look-ahead


@settings(max_examples=60, deadline=None)
@given(data=st.data(), case=st.sampled_from(SPLITS))
def test_splitting_does_not_depend_on_how_the_text_was_chunked(
    data: st.DataObject, case: tuple[str, list[str]]
) -> None:
    text, expected = case
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    splitter = SentenceSplitter(first_clause=False)
    sentences: list[str] = []
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        sentences += splitter.push(text[start:end])
    assert sentences + splitter.flush() == expected
