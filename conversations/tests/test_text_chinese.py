"""The text path on Chinese replies: sentence splitting, first clause, cleanup, emotion."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conversations.pipeline.text import SentenceSplitter, clean_for_speech, split_emotion
from conversations.pipeline.think import EmotionGate


def stream(text: str, chunk: int = 1, first_clause: bool = True) -> list[str]:
    splitter = SentenceSplitter(first_clause=first_clause)
    out: list[str] = []
    for start in range(0, len(text), chunk):
        out += splitter.push(text[start:start + chunk])
    return out + splitter.flush()


@pytest.mark.parametrize(("text", "sentences"), [
    ("今天北京天气晴朗。最高气温二十五度！要带伞吗？不用；不会下雨。",
     ["今天北京天气晴朗。", "最高气温二十五度！", "要带伞吗？", "不用；", "不会下雨。"]),
    ("他说：“明天见。”然后就走了。", ["他说：", "“明天见。”", "然后就走了。"]),
    ("真的吗?太好了!那我们走吧;出发。", ["真的吗?", "太好了!", "那我们走吧;", "出发。"]),  # ASCII marks in Chinese
    ("嗯……让我想想。", ["嗯……", "让我想想。"]),
    ("气温是23.5度，价格是1,000元。", ["气温是23.5度，价格是1,000元。"]),  # no cut inside numbers
    ("「你好」她说。（笑）好的！", ["「你好」她说。", "（笑）好的！"]),
    ("第一句。第二句", ["第一句。", "第二句"]),  # the rest is flushed at the end of the reply
])
def test_chinese_sentences_end_at_chinese_punctuation(text: str, sentences: list[str]) -> None:
    assert stream(text, first_clause=False) == sentences


@pytest.mark.parametrize(("text", "sentences"), [
    # The first clause ends at a comma once it has four characters: speech starts early.
    ("今天北京天气晴朗，最高气温二十五度，出门记得涂防晒哦！",
     ["今天北京天气晴朗，", "最高气温二十五度，出门记得涂防晒哦！"]),
    ("我喜欢的水果有苹果、香蕉和橙子。", ["我喜欢的水果有苹果、", "香蕉和橙子。"]),
    ("好的，我这就帮你查一下。", ["好的，我这就帮你查一下。"]),  # "好的" is too short to stand alone
    ("没问题～马上就好～", ["没问题～马上就好～"]),
    ("没问题呀我们马上开始～稍等一下。", ["没问题呀我们马上开始～", "稍等一下。"]),
])
def test_the_first_chinese_clause_may_end_at_a_comma(text: str, sentences: list[str]) -> None:
    assert stream(text) == sentences


def test_a_long_chinese_sentence_without_punctuation_is_cut_so_speech_is_not_held_back() -> None:
    sentences = stream("我" * 150 + "。", first_clause=False)
    assert len(sentences) == 2 and len(sentences[0]) == 120 and "".join(sentences) == "我" * 150 + "。"


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=9))
def test_chinese_splitting_does_not_depend_on_chunking(chunk: int) -> None:
    text = "😊 好的呀！今天天气不错，适合出去走走。**记得**带上水；别晒着了～"
    assert stream(text, chunk) == stream(text, len(text))


@pytest.mark.parametrize(("text", "spoken"), [
    ("😊今天天气很好☀️，适合出门🚶。", "今天天气很好，适合出门。"),
    ("**注意**：明天有雨。", "注意：明天有雨。"),
    ("## 今日天气", "今日天气"),
    ("- 苹果\n- 香蕉", "苹果 香蕉"),
    ("1、先洗手\n2、再吃饭", "先洗手 再吃饭"),
    ("１．打开设置", "打开设置"),
    ("• 第一点 ★ 重点", "第一点 重点"),
    ("・早上跑步", "早上跑步"),
    ("这是*强调*的话，还有_斜体_和`代码`。", "这是强调的话，还有斜体和代码。"),
    ("详情见[官网](https://example.com)。", "详情见官网。"),
    ("| 城市 | 气温 |\n|---|---|\n| 北京 | 25度 |", "城市, 气温 北京, 25度"),
    ("> 引用的一句话", "引用的一句话"),
    ("，。！开头的标点", "开头的标点"),
    ("🎉🎉", ""),
])
def test_chinese_replies_are_cleaned_for_speech(text: str, spoken: str) -> None:
    assert clean_for_speech(text) == spoken


@pytest.mark.parametrize(("text", "emotion", "rest"), [
    ("😊 好的，我来帮你。", "happy", "好的，我来帮你。"),
    ("😢真遗憾，明天会下雨。", "sad", "真遗憾，明天会下雨。"),
    ("🤔让我想一想……", "thinking", "让我想一想……"),
    ("✨😆哈哈，太好笑了！", "laughing", "哈哈，太好笑了！"),
    ("你好😊", None, "你好😊"),  # only a leading emoji is the face
])
def test_the_emotion_of_a_chinese_reply_comes_from_its_leading_emoji(text: str, emotion: str | None, rest: str) -> None:
    assert split_emotion(text) == (emotion, rest)


def test_the_emotion_gate_decides_on_a_streamed_chinese_reply() -> None:
    gate = EmotionGate()
    decided = [gate.push(delta) for delta in ["😌", " 放", "松一下吧", "。"]]
    assert [emotion for emotion, _ in decided] == [None, "relaxed", None, None]
    assert "".join(text for _, text in decided) == "放松一下吧。"
