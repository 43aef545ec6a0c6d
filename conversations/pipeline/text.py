"""Text utilities of the voice pipeline: emotion emoji, speech cleanup, sentence splitting.

Pure functions over strings. The LLM writes for a screen (emoji, markdown, decorative
bullets); the device speaks, so every sentence is cleaned before TTS, and a leading emoji
becomes the device's face (the `llm` emotion frame) instead of being read aloud.
"""
from __future__ import annotations

import re

# The 21 emotion names the firmware's emote assets know, keyed by the emoji that selects
# them (xiaozhi emotion protocol), plus common variants models like to use instead.
_CANONICAL: dict[str, str] = {
    "😶": "neutral", "🙂": "happy", "😆": "laughing", "😂": "funny", "😔": "sad",
    "😠": "angry", "😭": "crying", "😍": "loving", "😳": "embarrassed", "😲": "surprised",
    "😱": "shocked", "🤔": "thinking", "😉": "winking", "😎": "cool", "😌": "relaxed",
    "🤤": "delicious", "😘": "kissy", "😏": "confident", "😴": "sleepy", "😜": "silly",
    "🙄": "confused",
}
_VARIANTS: dict[str, str] = {
    "😊": "happy", "😀": "happy", "😃": "happy", "😄": "happy", "🤗": "happy", "😇": "happy",
    "☺": "happy", "😁": "laughing", "😹": "laughing", "🤣": "funny", "😢": "sad", "😞": "sad",
    "😟": "sad", "🙁": "sad", "☹": "sad", "🥺": "sad", "😡": "angry", "🤬": "angry",
    "😤": "angry", "😿": "crying", "🥰": "loving", "😻": "loving", "❤": "loving",
    "💕": "loving", "😅": "embarrassed", "😬": "embarrassed", "🙈": "embarrassed",
    "😮": "surprised", "😯": "surprised", "😦": "surprised", "😧": "surprised",
    "🤯": "shocked", "😨": "shocked", "😰": "shocked", "🙀": "shocked", "🧐": "thinking",
    "😐": "neutral", "😑": "neutral", "😋": "delicious", "😗": "kissy", "😚": "kissy",
    "😙": "kissy", "🥱": "sleepy", "😪": "sleepy", "💤": "sleepy", "😛": "silly",
    "😝": "silly", "🤪": "silly", "🙃": "silly", "😕": "confused", "🤨": "confused",
    "😵": "confused", "🤓": "confident", "💪": "confident",
}
EMOJI_EMOTIONS: dict[str, str] = {**_CANONICAL, **_VARIANTS}
# Text-default symbols (☺ ☹ ❤) usually arrive with VS16; accept both spellings.
EMOJI_EMOTIONS.update({k + "\ufe0f": v for k, v in list(EMOJI_EMOTIONS.items()) if len(k) == 1})

# Pictographs and the symbol blocks models use as decoration. Arrows, geometric shapes
# (★☆◆◇●■□▲), box drawing and dingbats are read aloud as "black star" by TTS engines.
_SYMBOL_RANGES = (
    "\U0001f000-\U0001faff"  # mahjong .. symbols & pictographs ext-A, flags, skin tones
    "\u2190-\u21ff"  # arrows
    "\u2300-\u23ff"  # misc technical (⌚ ⏰ ⏳ ...)
    "\u2500-\u27bf"  # box drawing, blocks, geometric shapes, misc symbols, dingbats
    "\u2b00-\u2bff"  # misc symbols and arrows (⭐ ⬛ ...)
    "\u2022\u2023\u2043\u203b\u3013\u3030\u303d\u3297\u3299"  # • ‣ ⁃ ※ 〓 〰 〽 ㊗ ㊙
)
# Invisible glue of emoji sequences: ZWJ, variation selectors, keycap, tag characters.
_EMOJI_GLUE = "\u200d\ufe0e\ufe0f\u20e3\U000e0020-\U000e007f"
_SYMBOLS = re.compile(f"[{_SYMBOL_RANGES}{_EMOJI_GLUE}]+")
_MODIFIERS = f"[{_EMOJI_GLUE}\U0001f3fb-\U0001f3ff]*"
_CLUSTER = f"[{_SYMBOL_RANGES}]{_MODIFIERS}(?:\u200d[{_SYMBOL_RANGES}]{_MODIFIERS})*"
_LEADING_CLUSTER = re.compile(rf"\s*({_CLUSTER})")
_NOT_IN_LOOKUP = re.compile("[\ufe0e\ufe0f\U0001f3fb-\U0001f3ff]")


def split_emotion(text: str) -> tuple[str | None, str]:
    """Split a reply's leading emoji off: ("happy", "rest") or (None, text unchanged).

    Every emoji in the leading run is consumed and the first one with a known emotion wins
    (models sometimes write "✨😊 ..."); when none is known the text is returned as is and
    `clean_for_speech` removes the emoji later.
    """
    emotion: str | None = None
    pos = 0
    while match := _LEADING_CLUSTER.match(text, pos):
        if emotion is None:
            emotion = EMOJI_EMOTIONS.get(_NOT_IN_LOOKUP.sub("", match.group(1)))
        pos = match.end()
    if emotion is None:
        return None, text
    return emotion, text[pos:].lstrip()


_FENCE = re.compile(r"^[ \t]*(?:```|~~~).*$", re.M)
_RULE = re.compile(r"^[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t]*$", re.M)
_TABLE_SEPARATOR = re.compile(r"^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)*\|?[ \t]*$", re.M)
_TABLE_ROW = re.compile(r"^[ \t]*\|(.*?)\|?[ \t]*$", re.M)
_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+", re.M)
_QUOTE = re.compile(r"^[ \t]*(?:>[ \t]?)+", re.M)
# Chinese lists also use "・"/"·" bullets and "1、", "１．", "1）" numbers, often unspaced.
_BULLET = re.compile(r"^[ \t]*(?:[-*+•][ \t]+|[・·][ \t]*)", re.M)
_NUMBERED = re.compile(r"^[ \t]*\d{1,3}(?:[.)][ \t]+|[、．）][ \t]*)", re.M)
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_REF_LINK = re.compile(r"\[([^\]]+)\]\[[^\]]*\]")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
# `*` may emphasise inside CJK text but not between ASCII operands ("2*3*4").
_ITALIC_STAR = re.compile(r"(?<![A-Za-z0-9*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![A-Za-z0-9*])")
# `_` emphasises next to CJK text too, but never inside ASCII names (snake_case_name).
_ITALIC_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9_])_(?=\S)(.+?)(?<=\S)_(?![A-Za-z0-9_])")
_STRIKE = re.compile(r"~~(.+?)~~")
_CODE = re.compile(r"`+([^`]*)`+")
# Markers left unpaired when a sentence was cut; a lone `*` survives only as "3 * 4".
_STRAY_MARKERS = re.compile(r"\*\*|__|~~|`|(?<![\d\s])\*|\*(?![\d\s])")
_LEADING_PUNCT = re.compile(r"^[\s,，、;；:：.。!！?？~～]+")
_SPACES = re.compile(r"\s+")


def _strip_block_markdown(text: str) -> str:
    """Line-level markdown: fences, rules, tables, headings, quotes, list markers."""
    for pattern in (_FENCE, _RULE, _TABLE_SEPARATOR, _HEADING, _QUOTE, _BULLET, _NUMBERED):
        text = pattern.sub("", text)
    return _TABLE_ROW.sub(lambda m: re.sub(r"[ \t]*\|[ \t]*", ", ", m.group(1).strip()), text)


def _strip_inline_markdown(text: str) -> str:
    text = _IMAGE.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _REF_LINK.sub(r"\1", text)
    text = _CODE.sub(r"\1", text)
    text = _BOLD.sub(r"\2", text)
    text = _ITALIC_STAR.sub(r"\1", text)
    text = _ITALIC_UNDERSCORE.sub(r"\1", text)
    text = _STRIKE.sub(r"\1", text)
    return _STRAY_MARKERS.sub("", text)


def clean_for_speech(text: str) -> str:
    """Text as it should be spoken: no emoji, decorative symbols or markdown, one line.

    Returns "" when nothing speakable is left; callers skip such sentences.
    """
    text = _strip_block_markdown(text)
    text = _strip_inline_markdown(text)
    text = _SYMBOLS.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _LEADING_PUNCT.sub("", text).strip()
    return text if is_speakable(text) else ""


def is_speakable(text: str) -> bool:
    """True if the text has a letter or digit, i.e. a TTS engine would say something."""
    return any(ch.isalnum() for ch in text)


# Sentence boundaries (docs/protocol-reference.md §9, TTS segmentation).
_FULL_WIDTH_ENDS = frozenset("。？！；：…")
_ASCII_ENDS = frozenset("?!;")
_SOFT_ENDS = frozenset("，、,~～")
_RUN_CHARS = _FULL_WIDTH_ENDS | _ASCII_ENDS | frozenset(".") | frozenset("”’」』）)】]》〉")
_PAIRED_MARKERS = frozenset('*`"')
# ASCII characters after "?!;" that mean we are inside a URL, query or expression.
_ASCII_CONTINUATION = frozenset("[(/=&_-.")
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e", "cf", "fig", "approx"}
)
_WORD_BEFORE_DOT = re.compile(r"[A-Za-z.]+$")
_LIST_NUMBER = re.compile(r"(?:^|\n)[ \t]*\d{1,3}$")


def _is_cjk(ch: str) -> bool:
    return "\u3000" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" or "\uff00" <= ch <= "\uffef"


def _inside_markup(text: str) -> bool:
    """True while a bold span, code span or link is open: cutting there breaks cleanup."""
    return (
        text.count("**") % 2 == 1
        or text.count("`") % 2 == 1
        or text.count("~~") % 2 == 1
        or text.count("[") > text.count("]")
        or text.rfind("](") > text.rfind(")")
    )


def _is_open(text: str, marker: str) -> bool:
    """Whether `marker` after `text` would close a span ("**" pairs count as one marker)."""
    if marker == "*":
        bold = text.count("**")
        return bold % 2 == 1 or (text.count("*") - 2 * bold) % 2 == 1
    return text.count(marker) % 2 == 1


def _run_end(buf: str, i: int) -> int:
    """End of the terminator run at i: "?!", "。”", "。**" (only if it closes a span)."""
    j = i + 1
    while j < len(buf):
        ch = buf[j]
        if ch in _RUN_CHARS:
            j += 1
        elif ch in _PAIRED_MARKERS and _is_open(buf[:j], ch):
            while j < len(buf) and buf[j] == ch:
                j += 1
        else:
            break
    return j


def _dot_ends_sentence(buf: str, i: int, after: str | None) -> bool:
    if after is not None and not (after.isspace() or _is_cjk(after)):
        return False  # 3.5, example.com, e.g.
    match = _WORD_BEFORE_DOT.search(buf, 0, i)
    word = match.group() if match else ""
    if word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper()):
        return False  # Mr. Smith, J. K. Rowling
    return not _LIST_NUMBER.search(buf, 0, i)  # "1. " opening a list item


def _is_boundary(buf: str, i: int, after: str | None, soft: bool) -> bool:
    """Whether the mark at i ends a sentence, given the character after its run."""
    ch = buf[i]
    if ch in _FULL_WIDTH_ENDS:
        return True
    if ch == ".":
        return _dot_ends_sentence(buf, i, after)
    if ch in _ASCII_ENDS:
        return after is None or not (after.isascii() and (after.isalnum() or after in _ASCII_CONTINUATION))
    if soft and ch in "，、":
        return True
    if soft and ch == ",":
        return after is None or after.isspace() or _is_cjk(after)  # not 1,000
    if soft and ch in "~～":
        # not a range (3~5) nor strikethrough (~~x~~)
        return buf[i - 1 : i] != "~" and (after is None or not (after.isdigit() or after == "~"))
    return False


class SentenceSplitter:
    """Cut streamed LLM text into sentences for TTS, one reply at a time.

    The first sentence of a reply may end at a comma once it has `first_min_chars` letters,
    so the device starts speaking while the model is still writing, and the TTS renders a
    short first chunk: Piper renders a whole chunk before its first audio, "Sure," in ~25 ms
    against ~120 ms for "Sure, I can help with that." (P4, docs/performance.md). Four lets
    "Sure,", "Okay," or "Well," stand alone and keeps "OK," or "好的，" with what follows. Sentences with nothing
    speakable ("😊", "**") are merged into the next one. Markdown and emoji are left in
    place: callers clean each sentence with `clean_for_speech`.
    """

    def __init__(self, first_clause: bool = True, first_min_chars: int = 4, max_chars: int = 120) -> None:
        self._first_clause = first_clause
        self._first_min_chars = first_min_chars
        self._max_chars = max_chars
        self._buf = ""
        self._first = first_clause

    def push(self, delta: str) -> list[str]:
        """Add streamed text; return the sentences it completed."""
        self._buf += delta
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """End the reply: return what is left. The next push starts a new reply."""
        sentences = self._drain(final=True)
        rest, self._buf = self._buf.strip(), ""
        if is_speakable(rest):
            sentences.append(rest)
        self._first = self._first_clause
        return sentences

    def reset(self) -> None:
        """Drop pending text (the reply was interrupted)."""
        self._buf = ""
        self._first = self._first_clause

    def _drain(self, final: bool) -> list[str]:
        sentences: list[str] = []
        while (end := self._find_end(final)) is not None:
            sentence, self._buf = self._buf[:end].strip(), self._buf[end:]
            sentences.append(sentence)
            self._first = False
        return sentences

    def _find_end(self, final: bool) -> int | None:
        """Index just after the first speakable sentence in the buffer, or None to wait."""
        buf = self._buf
        i = 0
        while i < min(len(buf), self._max_chars):
            if buf[i] == "\n":
                if is_speakable(buf[:i]) and not _inside_markup(buf[:i]):
                    return i + 1
                i += 1
                continue
            if buf[i] not in _RUN_CHARS and buf[i] not in _SOFT_ENDS:
                i += 1
                continue
            j = _run_end(buf, i)
            if j == len(buf) and not final:
                return None  # the next character decides (3.5, closing quote, "**")
            after = buf[j] if j < len(buf) else None
            if self._accepts(buf, i, j, after):
                return j
            i = j
        return self._forced_end() if len(buf) > self._max_chars else None

    def _accepts(self, buf: str, i: int, j: int, after: str | None) -> bool:
        soft = self._first and sum(ch.isalnum() for ch in buf[:i]) >= self._first_min_chars
        if not _is_boundary(buf, i, after, soft):
            return False
        if buf[j - 1] == "]" and after == "(":
            return False  # "[text.](url)"
        return is_speakable(buf[:j]) and not _inside_markup(buf[:j])

    def _forced_end(self) -> int | None:
        """A run-on sentence: cut at the last pause or space so speech is not held back."""
        window = self._buf[: self._max_chars]
        for k in range(len(window) - 1, len(window) // 2, -1):
            if (window[k] in _SOFT_ENDS or window[k].isspace()) and is_speakable(window[: k + 1]):
                return k + 1
        return self._max_chars if is_speakable(window) else None
