"""Whisper windows: word errors and time per utterance, over the same speech.

    .venv/bin/python bench/asr_accuracy.py [--voices piper,espeak] [--limit N] [--fast-windows 12,10]
                                           [--confidence=-0.2,-0.3]

100 questions and commands of the kind a voice assistant hears, spoken by Piper (en_US
"joe", the natural voice) and by espeak-ng, sent through Opus and back as a device would,
then transcribed by faster-whisper tiny.en (int8, 2 threads) in three ways per utterance:
the full 30 s window (`transcribe`, the default), and the short first pass of `fast_pass`
over each `--fast-windows` window. From those it reports, per voice and in all:
- the 30 s window alone;
- each short window alone (what `window_s` gives);
- `fast_pass` with each short window: the short answer where `confident()` accepts it,
  else the 30 s answer (so the two-pass time is short + full for the unsure ones);
  `--confidence` adds the same at other avg_logprob floors than `CONFIDENT_LOGPROB`, to
  choose it. The first twelve sentences are P4's questions: the rows "without P4's" leave
  them out, so a floor is not chosen for the benchmark it speeds up.

Word errors: the edit distance over words after lowercasing, dropping punctuation and
spelling digits out ("30%" → "thirty percent"), so "set a timer for 10 minutes" is right.
Runs alone on the machine (the times are CPU-bound); no server is started.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from common import fmt, header, md_table

from testing.speech import word_edits

P4_QUESTIONS = 12  # the first twelve sentences are bench/p4_voice.py's questions
SENTENCES = (
    "what time is it", "turn on the kitchen light", "what is the weather going to be like tomorrow",
    "please set the volume to thirty percent", "tell me a joke", "how far is the moon from the earth",
    "set a timer for ten minutes", "who wrote romeo and juliet", "play some relaxing music",
    "what is the capital of france", "remind me to call my mother at six",
    "how many days are there in a leap year", "turn off the lights in the living room",
    "what is the capital of australia", "who won the football match last night",
    "set an alarm for seven in the morning", "how do you say thank you in french",
    "what is the tallest mountain in the world", "add milk and eggs to my shopping list",
    "how long does it take to boil an egg", "open the garage door", "close the bedroom curtains",
    "what is twelve times eight", "how many minutes are in a day", "play the next song",
    "stop the music", "what day is it today", "when does the sun set tonight",
    "will it rain this afternoon", "how cold is it outside", "turn the heating up to twenty one degrees",
    "dim the lights in the dining room", "lock the front door", "is the back door locked",
    "what is on my calendar tomorrow", "cancel my alarm", "read me the news",
    "what is the population of china", "how old is the eiffel tower", "who painted the mona lisa",
    "what is the speed of light", "how many legs does a spider have", "tell me a fun fact about space",
    "what should I cook for dinner", "give me a recipe for pancakes", "how do I make a cup of tea",
    "translate good morning into spanish", "spell the word necessary", "what does the word brief mean",
    "call my sister", "send a message to david saying I am running late", "what is the score of the game",
    "how tall is a giraffe", "why is the sky blue", "what is the boiling point of water",
    "how many ounces are in a pound", "convert five miles to kilometers", "what is the square root of sixty four",
    "set a reminder to water the plants on sunday", "turn on the fan in the office",
    "make the lights warmer", "set the bedroom lights to fifty percent", "what movies are playing tonight",
    "play a podcast about history", "skip this song", "pause the audiobook", "resume playback",
    "what song is this", "who sings this song", "turn the volume down a little", "mute the television",
    "what is the weather in london", "is it going to snow this weekend", "how windy is it today",
    "what time does the pharmacy close", "find a coffee shop nearby", "how far is the airport",
    "order a large pizza with mushrooms", "what is my next appointment", "wake me up at half past six",
    "how much is one hundred dollars in euros", "what is the date next friday",
    "how many weeks until christmas", "tell me a bedtime story", "sing me a song", "what can you do",
    "good night", "thank you very much", "I am feeling a bit tired today", "can you help me with my homework",
    "what is photosynthesis", "who was the first person on the moon", "what is the largest ocean",
    "how many planets are in the solar system", "start the vacuum cleaner", "is the washing machine finished",
    "turn off all the lights", "what is the humidity inside", "play my morning playlist",
    "what is the fastest animal on earth",
)

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def spell(number: int) -> str:
    """0-999 in words (enough for what these sentences say)."""
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens - 2] + ("" if ones == 0 else " " + _ONES[ones])
    hundreds, rest = divmod(number, 100)
    return _ONES[hundreds] + " hundred" + ("" if rest == 0 else " " + spell(rest))


def words(text: str) -> list[str]:
    text = text.lower().replace("%", " percent").replace("-", " ")
    text = re.sub(r"\d+", lambda m: spell(int(m.group())) if int(m.group()) < 1000 else m.group(), text)
    return re.sub(r"[^a-z0-9' ]+", " ", text).split()


def word_errors(reference: str, heard: str) -> int:
    """Edit distance over words (substitutions, insertions, deletions)."""
    return word_edits(words(reference), words(heard))


@dataclass(frozen=True)
class Short:
    """The short pass over one window."""

    text: str  # the answer (empty when keep_segment drops it)
    ms: float
    decoded: str  # what the decoder said, which confident() judges
    avg_logprob: float

    def sure(self, floor: float) -> bool:
        from conversations.providers.asr.faster_whisper import confident  # noqa: PLC0415 - after django.setup

        return confident(self.decoded, self.avg_logprob, floor)


@dataclass
class Heard:
    """One utterance, decoded every way."""

    sentence: str
    full: str
    full_ms: float
    short: dict[int, Short] = field(default_factory=dict)  # by window


def through_opus(pcm: bytes) -> np.ndarray:
    from devices.protocol.opus import OpusDecoder  # noqa: PLC0415 - after sys.path
    from testing.speech import opus_packets  # noqa: PLC0415

    decoder = OpusDecoder(16000)
    out = b"".join(decoder.decode(packet) for packet in opus_packets(pcm, dtx=False))
    return np.frombuffer(out, dtype="<i2").astype(np.float32) / 32768.0


def decode_all(sentences: tuple[str, ...], say: Callable[[str], bytes], windows: list[int]) -> list[Heard]:
    from conversations.providers.asr import faster_whisper as fw  # noqa: PLC0415
    from testing.speech import silence  # noqa: PLC0415

    asr = fw.FasterWhisperASR()
    engine = asr._get_engine()
    model = engine.load()
    asr.warm_up()
    heard: list[Heard] = []
    for sentence in sentences:
        audio = through_opus(silence(16000, 300) + say(sentence) + silence(16000, 100))
        started = time.perf_counter()
        full = asr._decode_full(model, audio, "en")
        item = Heard(sentence, full, (time.perf_counter() - started) * 1000)
        for window in windows:
            started = time.perf_counter()
            short = asr._decode_short(engine, model, audio, "en", window)
            elapsed = (time.perf_counter() - started) * 1000
            item.short[window] = Short(asr._answer(short), elapsed, short.text, short.avg_logprob)
        heard.append(item)
    return heard


def rows_for(voice: str, heard: list[Heard], windows: list[int], floors: list[float]) -> list[list[str]]:
    total = sum(len(words(h.sentence)) for h in heard)
    rows = [[voice, "30 s window (default)", str(sum(word_errors(h.sentence, h.full) for h in heard)), str(total),
             fmt(statistics.median(h.full_ms for h in heard), 0), "-"]]
    for window in windows:
        alone = sum(word_errors(h.sentence, h.short[window].text) for h in heard)
        rows.append([voice, f"{window} s window alone", str(alone), str(total),
                     fmt(statistics.median(h.short[window].ms for h in heard), 0), "-"])
        for floor in floors:
            label = f"fast_pass over {window} s" + ("" if floor == fw_floor() else f", avg_logprob ≥ {floor:g}")
            rows.append([voice, label, *two_passes(heard, window, floor)])
            rows.append([voice, f"{label}, without P4's", *two_passes(heard[P4_QUESTIONS:], window, floor)])
    return rows


def two_passes(heard: list[Heard], window: int, floor: float) -> list[str]:
    """Word errors, words, median ms and answers kept of `fast_pass` at one confidence floor."""
    kept = [h.short[window].sure(floor) for h in heard]
    errors = sum(word_errors(h.sentence, h.short[window].text if sure else h.full)
                 for h, sure in zip(heard, kept, strict=True))
    times = [h.short[window].ms + (0.0 if sure else h.full_ms) for h, sure in zip(heard, kept, strict=True)]
    return [str(errors), str(sum(len(words(h.sentence)) for h in heard)), fmt(statistics.median(times), 0),
            f"{sum(kept)} of {len(heard)}"]


def fw_floor() -> float:
    from conversations.providers.asr.faster_whisper import CONFIDENT_LOGPROB  # noqa: PLC0415 - after django.setup

    return CONFIDENT_LOGPROB


def main() -> None:
    parser = argparse.ArgumentParser(description="Whisper windows: word errors and time")
    parser.add_argument("--voices", default="piper,espeak")
    parser.add_argument("--limit", type=int, default=len(SENTENCES), help="the first N sentences only")
    parser.add_argument("--fast-windows", default="12,10", help="short windows to try (s)")
    parser.add_argument("--confidence", default="", help="avg_logprob floors to try besides the default")
    args = parser.parse_args()
    import django  # noqa: PLC0415

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xiaozhi_site.settings")
    django.setup()
    from testing.speech import speak  # noqa: PLC0415
    from testing.utterances import PiperSpeaker  # noqa: PLC0415

    windows = [int(w) for w in args.fast_windows.split(",") if w.strip()]
    floors = [fw_floor(), *[float(f) for f in args.confidence.split(",") if f.strip() and float(f) != fw_floor()]]
    speakers: dict[str, Callable[[str], bytes]] = {"espeak": speak}
    if "piper" in args.voices:
        speakers["piper"] = PiperSpeaker().say
    sentences = SENTENCES[: args.limit]
    print(header("Whisper windows: word errors and time per utterance"))
    rows: list[list[str]] = []
    misheard: list[list[str]] = []
    for voice in [v.strip() for v in args.voices.split(",") if v.strip()]:
        heard = decode_all(sentences, speakers[voice], windows)
        rows += rows_for(voice, heard, windows, floors)
        for h in heard:
            texts = [h.full] + [h.short[w].text for w in windows]
            if any(word_errors(h.sentence, t) for t in texts):
                misheard.append([voice, h.sentence, h.full,
                                 *[f"{h.short[w].text} ({h.short[w].avg_logprob:.2f})" for w in windows]])
    print(md_table(["voice", "decoding", "word errors", "words", "median ms", "short answer kept"], rows,
                   align="llrrrr"))
    print()
    print(md_table(["voice", "said", "30 s heard", *[f"{w} s heard (avg_logprob)" for w in windows]], misheard))


if __name__ == "__main__":
    main()
