"""One assistant reply (a turn's answer, a greeting, a fixed `say`): its handle and its run.

Modelled on livekit's SpeechHandle: whoever wants the reply gone (device `abort`, realtime
barge-in, a new `listen start`, the engine closing) calls `interrupt()`; nobody reaches
into the reply's tasks. The handle also guards every message the reply sends: once
`interrupt()` has returned, nothing the reply's tasks try to send reaches the device, even
if a task has not yet noticed its cancellation (protocol-reference §11.8).

A reply never sends `tts start` or `tts stop` and never changes the session's state: it
reports `reply_speaking()` when its first words are due, and the engine reports its start
and end (`ReplyEvents`, contracts.py); the session decides what the device is told.
"""
from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from conversations.capture import AttemptLog, TurnAudio
from conversations.pipeline import fallback, phrases
from conversations.pipeline.answer import Answer, Filler
from conversations.pipeline.contracts import EngineContext
from conversations.pipeline.early import EarlyReply, Spawn
from conversations.pipeline.fallback import AllProvidersFailed, Chains, ProviderChain, StageChains
from conversations.pipeline.listen import Utterance
from conversations.pipeline.speak import (
    TTS_START_GAP_S,
    Clock,
    SendAudio,
    SendMessage,
    SpeechStats,
    SpeechStream,
)
from conversations.pipeline.text import SentenceSplitter, is_speakable, split_emotion
from conversations.pipeline.think import Thinker
from conversations.providers.base import ProviderError
from conversations.turns.record import TurnRecord
from conversations.turns.tool_loop import Thought
from devices.protocol.messages import Message, Stt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Speculation:
    """A speculative ASR's text, provider kind and attempts, and the reply started on it."""

    text: str
    kind: str
    attempts: AttemptLog
    early: EarlyReply | None = None


class ReplyHandle:
    """A reply in flight.

    - `interrupt()`: synchronous and idempotent; marks the reply interrupted (so its guarded
      sends become no-ops at once) and cancels the task doing the work.
    - `interrupted` / `done`: flags; `done` is set when the task has finished, however.
    - `wait_for_playout()`: returns when the task has finished, i.e. after `tts stop` for a
      reply that completed, or after cancellation for an interrupted one.
    - `allow_interruptions`: off while something must not be cut (kept for callers such as
      a device-side MCP call; barge-in checks it, an explicit device `abort` does not).
    - `audio`: the recorded turn's audio (None: not recorded); every packet the guard lets
      through is appended to its downlink, so it holds what the device got, up to an
      interruption.
    """

    def __init__(self, index: int, kind: str = "turn", audio: TurnAudio | None = None) -> None:
        self.index = index
        self.kind = kind  # "turn" | "say" | "greeting"
        self.audio = audio
        self.allow_interruptions = True
        self.interrupt_reason = ""
        self.close_after = ""  # set by the reply: close the session (this reason) once it ended
        self._interrupted = False
        self._task: asyncio.Task[Any] | None = None
        self._done = asyncio.Event()

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def attach(self, task: asyncio.Task[Any]) -> None:
        """Bind the task that produces this reply; `done` follows that task."""
        self._task = task
        task.add_done_callback(lambda _t: self._done.set())
        if self._interrupted:
            task.cancel()

    def interrupt(self, reason: str = "") -> None:
        if self._interrupted or self.done:
            return
        self._interrupted = True
        self.interrupt_reason = reason
        if self._task is not None:
            self._task.cancel()

    async def wait_for_playout(self) -> None:
        await self._done.wait()

    def guard_send(self, send: SendMessage) -> SendMessage:
        """`send` that drops messages once the reply is interrupted."""

        async def guarded(message: Message) -> None:
            if not self._interrupted:
                await send(message)

        return guarded

    def guard_audio(self, send_audio: SendAudio) -> SendAudio:
        keep = self.audio.downlink.packets.append if self.audio is not None else None

        async def guarded(packet: bytes) -> None:
            if not self._interrupted:
                await send_audio(packet)
                if keep is not None:
                    keep(packet)  # recording: the one extra step per frame

        return guarded


# -- what a reply does ---------------------------------------------------------------------

Outcome = str  # "empty" | "spoken" | "exit_phrase" | "apology"


def normalize_phrase(text: str) -> str:
    """Exit phrases match without case, punctuation or extra spaces ("Goodbye!" = "goodbye")."""
    return " ".join(re.sub(r"[^\w\s]|_", " ", text.casefold()).split())


def _ms(at: float | None, origin: float) -> float | None:
    return None if at is None else round((at - origin) * 1000, 1)


class TurnRunner:
    """The wire sequence of a turn, given an utterance:
    `stt` → (`tts start`) → `llm` (emotion) → per sentence `sentence_start`, frames,
    `sentence_end`, returning after the playout (the `tts stop` follows from the reply's
    end); plus fixed texts (greeting, `say`, farewell, apology) as (`tts start`) → sentences.

    Every message of a reply goes through its handle's guard; the TurnRecord is handed to
    the session's hooks (which only enqueue it), never awaited on the audio path.
    """

    def __init__(self, ctx: EngineContext, chains: Chains, thinker: Thinker, executor: Executor, clock: Clock,
                 first_words: Executor | None = None) -> None:
        self._ctx, self._chains, self._thinker = ctx, chains, thinker
        self._executor, self._clock = executor, clock
        self._first_words = first_words or executor  # a reply's first frames (speak.py)
        self._persona = ctx.config.persona
        self._exit_phrases = {normalize_phrase(p) for p in self._persona.exit_phrases if normalize_phrase(p)}

    # -- a conversational turn ---------------------------------------------------------------

    async def run(
        self,
        reply: ReplyHandle,
        utterance: Utterance,
        speculation: asyncio.Task[Speculation | None] | None,
    ) -> Outcome:
        record = TurnRecord(index=reply.index, timings={"speech_end": 0.0}, session_id=self._ctx.config.session_id)
        origin = utterance.ended_at
        record.timings.update(utterance.turn)  # how the end of the turn was decided
        if reply.audio is not None:
            reply.audio.uplink.packets = utterance.packets  # as heard, pre-roll included ("on" only)
        speculated = await _speculative_result(speculation)
        early = speculated.early if speculated is not None else None
        thought = early.thought if early is not None else Thought()
        chains = await self._chains.get()
        try:
            try:
                text = await self._recognize(chains, utterance, speculated, record, origin, thought.attempts)
            except AllProvidersFailed:
                record.error = "asr: all providers failed"
                record.reply_text = self.apology
                await self.speak_fixed(reply, self.apology, chains.apology, attempts=thought.attempts)
                return "apology"
            if not text:
                return "empty"  # nothing said: the reply's end takes the session back
            record.user_text = text
            await reply.guard_send(self._ctx.send)(Stt(text))
            if self.is_exit_phrase(text):
                record.reply_text = phrases.goodbye(self._persona.farewell, self._language())
                await self.speak_fixed(reply, record.reply_text, attempts=thought.attempts)
                return "exit_phrase"
            await self._respond(reply, chains, text, thought, record, origin, early)
            return "spoken"
        finally:
            self._finish(reply, record, thought, origin)

    @property
    def apology(self) -> str:
        return phrases.apology(self._language())

    def is_exit_phrase(self, text: str) -> bool:
        return normalize_phrase(text) in self._exit_phrases

    def early_reply(self, text: str, spawn: Spawn) -> EarlyReply | None:
        """The LLM asked on a pause's transcript before the turn is certain (early.py); None
        when the turn would not ask it (no words, an exit phrase) or the chains are not built."""
        chains = self._chains.ready
        if chains is None or not is_speakable(text) or self.is_exit_phrase(text):
            return None
        llm = chains.llm
        return EarlyReply(text, lambda thought, on_text, watcher, before_tools: self._thinker.think(
            llm, text, thought, on_text, watcher=watcher, before_tools=before_tools), spawn)

    async def _recognize(
        self,
        chains: StageChains,
        utterance: Utterance,
        speculated: Speculation | None,
        record: TurnRecord,
        origin: float,
        attempts: AttemptLog,
    ) -> str:
        if speculated is None:
            text, kind = await fallback.transcribe(
                chains.asr, utterance.pcm, utterance.sample_rate, self._persona.language, attempts
            )
        else:
            text, kind = speculated.text, speculated.kind
            attempts.extend(speculated.attempts)
        record.providers["asr"] = kind
        record.timings["asr_done"] = _ms(self._clock.now(), origin) or 0.0
        return text if is_speakable(text) else ""

    async def _respond(
        self, reply: ReplyHandle, chains: StageChains, text: str, thought: Thought, record: TurnRecord, origin: float,
        early: EarlyReply | None = None,
    ) -> None:
        speech = self._stream(reply, chains.tts, await self._start_speaking(reply), thought.attempts)
        answer = Answer(speech, reply.guard_send(self._ctx.send), record)
        filler = Filler(self._ctx.config.filler_after, lambda: self._say_filler(speech, record, origin))
        try:
            try:
                if early is not None:
                    record.timings["early_reply"] = 1.0  # the LLM was asked before the turn ended
                    await early.join(answer.feed, filler)
                else:
                    await self._thinker.think(chains.llm, text, thought, answer.feed, watcher=filler)
            except ProviderError as exc:
                record.error = f"llm: {exc}"[:200]
                log.warning("llm failed during a turn", extra={"error": type(exc).__name__})
            finally:
                filler.answered()
            await answer.end(complete=not record.error)
            if record.error:
                # No answer, or one that broke off (a stall): the apology follows the whole
                # sentences said; an unfinished one is dropped.
                record.reply_text = " ".join([*answer.spoken, self.apology])
                speech.push(self.apology, chains.apology)
            elif self._ctx.tool_state is not None and self._ctx.tool_state.end_requested and not answer.spoken:
                record.reply_text = phrases.goodbye(self._persona.farewell, self._language())  # model said nothing
                speech.push(record.reply_text)
            speech.end_input()
            await speech.wait_for_playout()
        finally:
            await speech.aclose()
            self._speech_timings(record, speech.stats, origin)

    def _say_filler(self, speech: SpeechStream, record: TurnRecord, origin: float) -> None:
        speech.push(phrases.filler(self._language()))
        record.timings["filler"] = _ms(self._clock.now(), origin) or 0.0

    def _finish(self, reply: ReplyHandle, record: TurnRecord, thought: Thought, origin: float) -> None:
        record.interrupted = reply.interrupted
        record.provider_attempts = thought.attempts.as_json()
        record.audio = _recorded(reply.audio)
        if thought.reply_text and not record.reply_text:
            record.reply_text = split_emotion(thought.reply_text)[1].strip()
        record.tool_calls = thought.tool_call_dicts()
        if thought.providers:
            record.providers["llm"] = ",".join(thought.providers)
        if thought.first_token_at is not None:  # 0: already there when the turn ended (an early reply)
            record.timings["llm_first_token"] = max(0.0, _ms(thought.first_token_at, origin) or 0.0)
        if thought.reply_text:
            self._thinker.remember(record.user_text, record.reply_text)
        if record.user_text or record.error:
            self._ctx.hooks.turn_finished(record)

    @staticmethod
    def _speech_timings(record: TurnRecord, stats: SpeechStats, origin: float) -> None:
        if stats.providers:
            record.providers["tts"] = ",".join(stats.providers)
        for key, at in (
            ("tts_first_audio", stats.first_audio_at),
            ("first_frame_sent", stats.first_frame_at),
            ("last_frame_sent", stats.last_frame_at),
        ):
            value = _ms(at, origin)
            if value is not None:
                record.timings[key] = value

    # -- fixed texts -------------------------------------------------------------------------

    async def announce(self, reply: ReplyHandle, text: str, user_text: str = "") -> None:
        """A fixed text that is a turn of its own (an operator's `say`, the wake-word
        greeting after `user_text`): spoken, then recorded with its audio."""
        record = TurnRecord(index=reply.index, user_text=user_text, reply_text=text,
                            session_id=self._ctx.config.session_id)
        attempts = AttemptLog()
        try:
            await self.speak_fixed(reply, text, attempts=attempts)
        finally:
            record.interrupted = reply.interrupted
            record.provider_attempts = attempts.as_json()
            served = [a["kind"] for a in record.provider_attempts.get("tts", []) if a["ok"]]
            if served:
                record.providers["tts"] = ",".join(dict.fromkeys(served))
            record.audio = _recorded(reply.audio)
            self._ctx.hooks.turn_finished(record)

    async def speak_fixed(
        self, reply: ReplyHandle, text: str, chain: ProviderChain | None = None, *, attempts: AttemptLog | None = None,
    ) -> SpeechStats:
        """(`tts start`), the text's sentences, returning after playout (greeting, say, farewell)."""
        chains = await self._chains.get()
        speech = self._stream(reply, chains.tts, await self._start_speaking(reply), attempts)
        try:
            splitter = SentenceSplitter()
            for sentence in splitter.push(text) + splitter.flush():
                speech.push(sentence, chain)
            speech.end_input()
            await speech.wait_for_playout()
        finally:
            await speech.aclose()
        return speech.stats

    # -- helpers -----------------------------------------------------------------------------

    async def _start_speaking(self, reply: ReplyHandle) -> float:
        """Report that the reply speaks now (the session sends `tts start`); return the
        earliest time for the first frame (the firmware resets its decoder after `tts start`)."""
        if not reply.interrupted:
            await self._ctx.replies.reply_speaking()
        return self._clock.now() + TTS_START_GAP_S

    def _stream(
        self, reply: ReplyHandle, chain: ProviderChain, not_before: float, attempts: AttemptLog | None = None,
    ) -> SpeechStream:
        return SpeechStream(
            tts=chain,
            executor=self._executor,
            first_words=self._first_words,
            send=reply.guard_send(self._ctx.send),
            send_audio=reply.guard_audio(self._ctx.send_audio),
            sample_rate=self._ctx.config.downlink_sample_rate,
            complexity=self._ctx.config.downlink_opus_complexity,
            voice=self._persona.voice,
            language=self._language(),
            not_before=not_before,
            clock=self._clock,
            attempts=attempts,
        )

    def _language(self) -> str:
        state = self._ctx.tool_state
        return (state.language if state is not None and state.language else "") or self._persona.language


def _recorded(audio: TurnAudio | None) -> TurnAudio | None:
    return audio if audio is not None and (audio.uplink or audio.downlink) else None


def discard_speculation(task: asyncio.Task[Speculation | None] | None) -> None:
    """Cancel a speculative ASR and the early reply started on it (speech resumed, or its turn
    is over: a reply the turn did not use must not run on)."""
    if task is None:
        return
    task.cancel()
    if task.done() and not task.cancelled() and task.exception() is None:
        result = task.result()
        if result is not None and result.early is not None:
            result.early.cancel()


async def _speculative_result(task: asyncio.Task[Speculation | None] | None) -> Speculation | None:
    """The speculative ASR's answer, or None (not started, cancelled or failed)."""
    if task is None:
        return None
    await asyncio.wait([task])
    if task.cancelled() or task.exception() is not None:
        return None
    return task.result()  # None when the speculative ASR failed
