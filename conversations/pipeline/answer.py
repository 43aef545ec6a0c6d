"""A turn's answer on its way to speech: the model's words (`Answer`: the leading emoji → the
`llm` frame, the rest → whole sentences for the speech stream) and the filler said while the
user waits for them (`Filler`, issue 11 item 10). Used by reply.py's `TurnRunner`."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from conversations.pipeline.speak import SendMessage, SpeechStream
from conversations.pipeline.text import SentenceSplitter
from conversations.pipeline.think import EMOTION_EMOJI, EmotionGate
from conversations.turns.record import TurnRecord
from devices.protocol.messages import Llm


class Answer:
    """The model's words on their way to speech: the leading emoji becomes the `llm` frame
    (once per turn), the rest whole sentences for the speech stream; `spoken` keeps the
    sentences pushed."""

    def __init__(self, speech: SpeechStream, send: SendMessage, record: TurnRecord) -> None:
        self._speech, self._send, self._record = speech, send, record
        self._gate, self._splitter = EmotionGate(), SentenceSplitter()
        self.spoken: list[str] = []

    async def feed(self, delta: str) -> None:
        emotion, rest = self._gate.push(delta)
        await self._emotion(emotion)
        self._push(self._splitter.push(rest))

    async def end(self, *, complete: bool) -> None:
        """The model is done; `complete=False` (it failed) drops an unfinished sentence."""
        emotion, rest = self._gate.flush()
        await self._emotion(emotion)
        self._push(self._splitter.push(rest) + (self._splitter.flush() if complete else []))

    def _push(self, sentences: list[str]) -> None:
        for sentence in sentences:
            if self._speech.push(sentence):
                self.spoken.append(sentence)

    async def _emotion(self, emotion: str | None) -> None:
        if emotion is not None:
            self._record.emotion = emotion
            await self._send(Llm(emotion=emotion, text=EMOTION_EMOJI.get(emotion, "")))


class Filler:
    """The filler ("one moment…"), said at most once per turn when the user has waited
    `after` seconds for the model's first words or for a tool (tool_loop.WaitWatcher).

    `waiting()` arms a timer unless one runs; `answered()` (the round's first text) disarms
    it, so an answer in time is never preceded by a filler. When the timer fires, `say`
    queues the phrase as the reply's next sentence: the wire sequence and the pacing are the
    speech stream's as for any sentence.
    """

    def __init__(self, after: float, say: Callable[[], None]) -> None:
        self._after, self._say = after, say
        self._timer: asyncio.TimerHandle | None = None
        self.said = False

    def waiting(self) -> None:
        if self._after > 0 and not self.said and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._after, self._fire)

    def answered(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        self.said = True
        self._say()
