"""VoiceEngine: hearing, thinking and speaking behind the session's `EngineContext`.

The engine routes device events to its parts and runs one reply at a time, each behind a
`ReplyHandle`. Whoever ends a reply early only calls `interrupt()`: the handle's guard drops
anything the reply still tries to send. Who sends the `tts stop` then depends on who
interrupted: the session does for device input (`abort`, `listen start`/`stop`, commands:
it calls `on_abort` and sends it), the engine does for what it decided itself (realtime
barge-in, a new utterance replacing a reply).

State changes to SPEAKING and back happen in the session when `tts start`/`tts stop` go
out; the engine sets only THINKING (utterance ended) and the rest state after a turn that
produced nothing to say.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

from conversations.pipeline import fallback, phrases
from conversations.pipeline.aio import TaskSet, cancel_and_wait
from conversations.pipeline.contracts import EngineContext
from conversations.pipeline.cpu import CpuMill, shared_executor, speech_executor
from conversations.pipeline.listen import (
    POST_WAKE_MUTE_S,
    Hearing,
    HearingEvent,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    Utterance,
    VADSettings,
)
from conversations.pipeline.fallback import Chains
from conversations.pipeline.reply import ReplyHandle, TurnRunner
from conversations.pipeline.serial import SerialRunner
from conversations.pipeline.speak import Clock, LoopClock
from conversations.pipeline.states import IllegalTransition, SessionState
from conversations.pipeline.think import Thinker
from devices.protocol.messages import TtsStop

log = logging.getLogger(__name__)

GREETING_WAIT_S = 0.5  # the wake word's companion `listen start` comes right after `detect`
HISTORY_DRAIN_S = 3.0
# Speculative ASR competes with real turns for the (usually single) Whisper worker, so only
# a few may run at once in a process; beyond that turns simply transcribe at the end.
MAX_SPECULATIONS = 2
_speculations = 0
Work = Callable[[ReplyHandle], Coroutine[Any, Any, object]]


def normalize_phrase(text: str) -> str:
    """Exit phrases match without case, punctuation or extra spaces ("Goodbye!" = "goodbye")."""
    return " ".join(re.sub(r"[^\w\s]|_", " ", text.casefold()).split())


async def _speculative(coro: Coroutine[Any, Any, tuple[str, str]]) -> tuple[str, str] | None:
    """A speculative result: a failure only means the turn runs ASR again, so no traceback."""
    global _speculations
    _speculations += 1
    try:
        return await coro
    except Exception:
        return None
    finally:
        _speculations -= 1


class VoiceEngine:
    """The real engine (contracts.VoiceEngine). `on_*` return at once; work runs in tasks."""

    def __init__(
        self,
        ctx: EngineContext,
        *,
        hear_pool: Executor | None = None,
        speak_pool: Executor | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._ctx = ctx
        persona = ctx.config.persona
        self._clock = clock or LoopClock()
        self._tasks = TaskSet("voice-engine")
        self._history = SerialRunner("voice-engine history")
        hear_pool = hear_pool or shared_executor()
        vad = VADSettings(persona.vad_threshold, persona.vad_threshold_low, float(persona.vad_min_silence_ms))
        self._hearing = Hearing(
            run_cpu=CpuMill.for_executor(hear_pool).run, vad=vad, on_event=self._on_hearing,
            clock=self._clock.now,
        )
        self._chains = Chains(ctx.config)
        thinker = Thinker(
            persona=persona, device=ctx.config.device, toolset=ctx.toolset,
            model=persona.llm_model or ctx.config.llm_model, tool_state=ctx.tool_state, clock=self._clock.now,
        )
        speak_pool = speak_pool or speech_executor()
        self._runner = TurnRunner(ctx, self._chains, thinker, speak_pool, self._clock, self._history)
        self._reply: ReplyHandle | None = None
        self._stopping: asyncio.Task[None] | None = None  # the engine's own pending `tts stop`
        self._speculation: asyncio.Task[tuple[str, str] | None] | None = None
        self._greeting_go: asyncio.Event | None = None
        self._mode = "auto"
        self._listening = False
        self._turns = 0
        self._closed = False
        self._exit_phrases = {normalize_phrase(p) for p in persona.exit_phrases if normalize_phrase(p)}

    # -- device events (from the session) ----------------------------------------------------

    def on_listen_start(self, mode: str) -> None:
        self._mode = mode
        self._listening = True
        reply = self._reply
        if reply is not None and reply.kind != "greeting":
            reply.interrupt("listen_start")  # the session sends the `tts stop`
        if self._greeting_go is not None:
            self._greeting_go.set()
        self._hearing.start(mode)
        self._sync_hearing()
        self._chains.prepare()

    def on_listen_stop(self) -> None:
        self._listening = False
        if self._mode == "manual":
            self._hearing.finish_manual()
        else:
            self._hearing.pause()

    def on_listen_detect(self, text: str) -> None:
        self._hearing.mute(POST_WAKE_MUTE_S)
        state, persona = self._ctx.tool_state, self._ctx.config.persona
        greeting = phrases.greeting(persona.greeting, (state.language if state else "") or persona.language)
        if greeting and not self._closed:
            go = self._greeting_go = asyncio.Event()
            self._start_reply("greeting", lambda reply: self._greet(reply, greeting, go))

    def on_abort(self, reason: str | None) -> None:
        reply = self._reply
        if reply is not None:
            reply.interrupt(reason or "abort")  # the session sends the `tts stop`
        self._cancel_speculation()
        self._sync_hearing()

    def on_audio(self, opus: bytes) -> None:
        self._hearing.push(opus)

    async def say(self, text: str) -> None:
        if self._closed or not text.strip():
            return
        reply = self._start_reply("say", lambda r: self._runner.speak_fixed(r, text))
        await reply.wait_for_playout()

    async def aclose(self) -> None:
        self._closed = True
        if self._reply is not None:
            self._reply.interrupt("closing")
        await self._hearing.aclose()
        await self._tasks.aclose()
        await self._history.aclose(HISTORY_DRAIN_S)
        await self._chains.aclose()

    @property
    def hearing(self) -> Hearing:
        return self._hearing

    # -- hearing events -----------------------------------------------------------------------

    def _on_hearing(self, event: HearingEvent) -> None:
        if self._closed:
            return
        if isinstance(event, SpeechStarted):
            self._ctx.voice_activity()
            if self._mode == "realtime":
                self._barge_in()
        elif isinstance(event, SpeechPaused):
            self._speculate(event.utterance)
        elif isinstance(event, SpeechResumed):
            self._cancel_speculation()
        elif isinstance(event, SpeechStopped):
            self._on_utterance(event.utterance)

    def _barge_in(self) -> None:
        reply = self._reply
        if reply is not None and reply.allow_interruptions:
            self._interrupt_own("barge_in")

    def _on_utterance(self, utterance: Utterance) -> None:
        self._ctx.voice_activity()
        speculation, self._speculation = self._speculation, None
        self._start_reply("turn", lambda r: self._turn(r, utterance, speculation))

    def _speculate(self, utterance: Utterance) -> None:
        """ASR on a pause, so the text is ready when the silence turns out to be the end."""
        self._cancel_speculation()
        chains = self._chains.ready
        if chains is None or self._mode == "manual" or not chains.asr.slots or _speculations >= MAX_SPECULATIONS:
            return
        language = self._ctx.config.persona.language
        coro = _speculative(fallback.transcribe(chains.asr, utterance.pcm, utterance.sample_rate, language))
        self._speculation = self._tasks.create(coro, name="asr-speculative")

    def _cancel_speculation(self) -> None:
        if self._speculation is not None:
            self._speculation.cancel()
            self._speculation = None

    # -- replies ----------------------------------------------------------------------------

    def _start_reply(self, kind: str, work: Work) -> ReplyHandle:
        self._interrupt_own("superseded")
        if kind == "turn":
            self._turns += 1
        reply = ReplyHandle(self._turns, kind)
        self._reply = reply
        task = self._tasks.create(self._run_reply(reply, work), name=f"reply-{kind}")
        reply.attach(task)
        task.add_done_callback(lambda _t: self._reply_done(reply))
        self._sync_hearing()
        return reply

    async def _run_reply(self, reply: ReplyHandle, work: Work) -> None:
        try:
            if self._stopping is not None:
                await asyncio.shield(self._stopping)  # the replaced reply's `tts stop` goes first
            await work(reply)
        except Exception:
            log.exception("reply failed", extra={"kind": reply.kind})
        finally:
            # Whatever happened, the device must not be left speaking, nor the session thinking.
            if reply.speaking and not reply.interrupted:
                reply.speaking = False
                await self._ctx.send(TtsStop())
            elif not reply.interrupted and self._ctx.get_state() is SessionState.THINKING:
                self.set_state(self.rest_state)

    def _reply_done(self, reply: ReplyHandle) -> None:
        if self._reply is reply:
            self._reply = None
            self._sync_hearing()

    def _interrupt_own(self, reason: str) -> None:
        """End the current reply for a reason of the engine's own; it owes the `tts stop`."""
        reply = self._reply
        if reply is None or reply.done or reply.interrupted:
            return
        reply.interrupt(reason)
        if reply.speaking:
            self._stopping = self._tasks.create(self._send_stop(), name="tts-stop")
        elif self._ctx.get_state() is SessionState.THINKING:
            self.set_state(self.rest_state)

    async def _send_stop(self) -> None:
        await self._ctx.send(TtsStop())

    async def _greet(self, reply: ReplyHandle, text: str, go: asyncio.Event) -> None:
        try:
            async with asyncio.timeout(GREETING_WAIT_S):
                await go.wait()
        except TimeoutError:
            pass
        self._greeting_go = None
        await self._runner.speak_fixed(reply, text)

    async def _turn(self, reply: ReplyHandle, utterance: Utterance, speculation: asyncio.Task[Any] | None) -> None:
        try:
            outcome = await self._runner.run(
                reply, utterance, speculation,
                rest_state=lambda: self.rest_state, set_state=self.set_state, is_exit_phrase=self.is_exit_phrase,
            )
        finally:
            await cancel_and_wait(speculation)
        if outcome == "exit_phrase":
            self._ctx.request_close("exit phrase")
        elif outcome == "spoken" and self._ctx.tool_state is not None and self._ctx.tool_state.end_requested:
            self._ctx.request_close("end_conversation")

    def is_exit_phrase(self, text: str) -> bool:
        return normalize_phrase(text) in self._exit_phrases

    # -- state ------------------------------------------------------------------------------

    @property
    def rest_state(self) -> SessionState:
        return SessionState.IDLE if self._mode == "manual" else SessionState.LISTENING

    def set_state(self, target: SessionState) -> None:
        if self._ctx.get_state() in (target, SessionState.CLOSING):
            return
        try:
            self._ctx.set_state(target)
        except IllegalTransition:
            log.error("engine asked for an illegal state change", exc_info=True, extra={"target": target.value})

    def _sync_hearing(self) -> None:
        """Accept audio while listening, except in auto/manual mode while a reply runs."""
        reply = self._reply
        busy = reply is not None and not reply.done and not reply.interrupted
        if self._closed or not self._listening or (busy and self._mode != "realtime"):
            if self._hearing.accepting:
                self._hearing.pause()
        else:
            self._hearing.resume()
