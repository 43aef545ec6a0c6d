"""VoiceEngine: hearing, thinking and speaking behind the session's `EngineContext`.

The engine routes device events to its parts and runs one reply at a time, each behind a
`ReplyHandle`. Whoever ends a reply early only calls `interrupt()`: the handle's guard drops
anything the reply still tries to send, and the reply's task ends. Every reply reports its
start and its end to the session (`ctx.replies`), and the session decides what follows:
THINKING for a turn, `tts stop` and the rest state at the end. So the engine never sends
`tts start`/`tts stop` nor sets a state, and it reads the listen mode from the session.

A new reply (an utterance replacing a reply in realtime mode, a `say`) starts only after the
one it replaces has reported its end, so the old `tts stop` always goes out first.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

from conversations.capture import AttemptLog, TurnAudio
from conversations.pipeline import fallback, phrases
from conversations.pipeline.aio import TaskSet, cancel_and_wait
from conversations.pipeline.config import SessionConfig
from conversations.pipeline.contracts import EngineContext
from conversations.pipeline.cpu_pool import CpuMill, first_words_executor, shared_executor, speech_executor
from conversations.pipeline.fallback import Chains
from conversations.pipeline.listen import (
    POST_WAKE_MUTE_S,
    Hearing,
    HearingEvent,
    SpeechConfirmed,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    Utterance,
    VADSettings,
)
from conversations.pipeline.early import EarlyReply
from conversations.pipeline.reply import ReplyHandle, Speculation, TurnRunner, discard_speculation, normalize_phrase
from conversations.pipeline.speak import Clock, LoopClock
from conversations.pipeline.think import Thinker
from conversations.providers import registry
from conversations.providers.base import AEC, ProviderError, TurnModel

log = logging.getLogger(__name__)

__all__ = ["VoiceEngine", "normalize_phrase"]

GREETING_WAIT_S = 0.5  # the wake word's companion `listen start` comes right after `detect`
# Speculative ASR competes with real turns for the (usually single) Whisper worker, so only
# a few may run at once in a process; beyond that turns simply transcribe at the end.
MAX_SPECULATIONS = 2
_speculations = 0
Work = Callable[[ReplyHandle], Coroutine[Any, Any, object]]


async def _speculative(
    coro: Coroutine[Any, Any, tuple[str, str]], attempts: AttemptLog, early: Callable[[str], EarlyReply | None],
) -> Speculation | None:
    """A speculative result: a failure only means the turn runs ASR again, so no traceback.
    `early` starts the reply on the text at once (early.py), or returns None."""
    global _speculations
    _speculations += 1
    try:
        text, kind = await coro
    except Exception:
        return None
    finally:
        _speculations -= 1
    return Speculation(text, kind, attempts, early(text))


def preload_hearing(kind: str = SessionConfig.vad) -> None:
    """Build the process's VAD with its default options before the first device (a web worker
    calls it at start-up). Silero's weights are read with the first window otherwise: the onnx
    import and two onnxruntime graphs, ~0.2 s mostly on the interpreter lock (and 43 MiB), and
    with the first session's window every other session of the worker waited: the watcher's
    timer 250-350 ms late as a fleet arrived (docs/performance.md, session 46). A VAD that
    cannot load is logged; sessions then fail on it as they would have."""
    try:
        vad = registry.shared("vad", kind)
        load = getattr(vad, "network", None)
        if callable(load):
            load()
    except Exception:
        log.warning("the VAD could not be loaded at start-up", exc_info=True, extra={"vad": kind})


def _turn_model(config: SessionConfig) -> TurnModel | None:
    """The process's end-of-turn model, loading in the background; None (the persona's
    pauses end on the silence window) when it cannot be had."""
    kind = config.turn_model
    try:
        model = registry.shared("turn", kind, **config.providers.get(f"turn.{kind}", {}))
    except Exception as exc:
        log.warning("no end-of-turn model; using the silence window", extra={"error": str(exc)[:200]})
        return None
    warm = getattr(model, "warm", None)
    if warm is not None:
        warm()
    return model


class VoiceEngine:
    """The real engine (contracts.VoiceEngine). `on_*` return at once; work runs in tasks."""

    on_audio: Callable[[bytes, int], None]  # queue one uplink packet and its v2 stamp (Hearing.push)

    def __init__(
        self,
        ctx: EngineContext,
        *,
        hear_pool: Executor | None = None,
        speak_pool: Executor | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._ctx = ctx
        config = ctx.config
        persona = config.persona
        self._clock = clock or LoopClock()
        self._tasks = TaskSet("voice-engine")
        self._hearing = Hearing(
            mill=CpuMill.for_executor(hear_pool or shared_executor()),
            vad=registry.shared("vad", config.vad, **config.providers.get(f"vad.{config.vad}", {})),
            settings=VADSettings(
                persona.vad_threshold, persona.vad_threshold_low, float(persona.vad_min_silence_ms),
                turn_detection=persona.turn_detection, turn_pause_ms=float(persona.turn_pause_ms),
                turn_max_silence_ms=float(persona.turn_max_silence_ms),
                barge_in_min_ms=float(persona.barge_in_min_ms),
                barge_in_min_probability=persona.barge_in_min_probability,
            ),
            # An injected clock reaches the hearing too; the loop's own is read directly.
            on_event=self._on_hearing, clock=None if isinstance(self._clock, LoopClock) else self._clock.now,
            keep_packets=config.recording == "on",
            turn_model=_turn_model(config) if persona.turn_detection == "smart" else None,
            aec=self._echo_canceller(ctx),
        )
        self.on_audio = self._hearing.push  # the uplink's hot path: no hop through the engine
        self._chains = Chains(config)
        thinker = Thinker(
            persona=persona, device=config.device, toolset=ctx.toolset,
            model=config.model, tool_state=ctx.tool_state, clock=self._clock.now,
            first_token_timeout=config.llm_first_token_timeout, inter_token_timeout=config.llm_inter_token_timeout,
        )
        self._runner = TurnRunner(ctx, self._chains, thinker, speak_pool or speech_executor(), self._clock,
                                  first_words=speak_pool or first_words_executor())
        self._reply: ReplyHandle | None = None
        self._speculation: asyncio.Task[Speculation | None] | None = None
        self._greeting_go: asyncio.Event | None = None
        # The utterance in progress began over a running reply and has not (yet) had enough
        # speech to interrupt it: unless confirmed, it is not a turn (a cough, the echo).
        self._over_reply = False
        self._listening = False  # between the device's `listen start` and `listen stop`
        self._turns = 0
        self._closed = False

    @staticmethod
    def _echo_canceller(ctx: EngineContext) -> AEC | None:
        config = ctx.config
        if not ctx.server_aec or not config.aec:
            return None
        try:
            aec: AEC = registry.shared("aec", config.aec, **config.providers.get(f"aec.{config.aec}", {}))
        except (ProviderError, KeyError):
            # No canceller (the native library missing on this platform): the session goes on
            # with the device's audio as it arrives, as for a device without features.aec.
            log.warning("server-side echo cancellation unavailable", exc_info=True, extra={"kind": config.aec})
            return None
        return aec

    # -- device events (from the session) ----------------------------------------------------

    def on_audio_sent(self, opus: bytes, timestamp: int) -> None:
        """A downlink frame went out stamped `timestamp`: the reference of its echo."""
        self._hearing.reference(timestamp, opus)

    def on_listen_start(self) -> None:
        self._listening = True
        reply = self._reply
        if reply is not None and reply.kind != "greeting":
            reply.interrupt("listen_start")
        if self._greeting_go is not None:
            self._greeting_go.set()
        self._hearing.start(endpointing=self._ctx.listen_mode() != "manual")
        self._sync_hearing()
        self._chains.prepare()

    def on_listen_stop(self) -> None:
        self._listening = False
        if self._ctx.listen_mode() == "manual":
            self._hearing.finish_manual()
        else:
            self._hearing.pause()

    def on_listen_detect(self, text: str) -> None:
        self._hearing.mute(POST_WAKE_MUTE_S)
        state, persona = self._ctx.tool_state, self._ctx.config.persona
        greeting = phrases.greeting(persona.greeting, (state.language if state else "") or persona.language)
        if greeting and not self._closed:
            go = self._greeting_go = asyncio.Event()
            self._start_reply("greeting", lambda reply: self._greet(reply, greeting, go, text), recorded=True)

    async def interrupt(self, reason: str | None) -> None:
        """End the running reply (if any) and return once it has ended: its `tts stop` is out."""
        reply = self._reply
        if reply is not None:
            reply.interrupt(reason or "abort")
            await reply.wait_for_playout()
        self._cancel_speculation()
        self._sync_hearing()

    async def say(self, text: str, *, record: bool = False) -> None:
        """A fixed text; `record`: a turn of its own in the history (an operator's `say`),
        else the server's own words (activation code, farewell), not recorded."""
        if self._closed or not text.strip():
            return
        if record:
            reply = self._start_reply("say", lambda r: self._runner.announce(r, text), recorded=True)
        else:
            reply = self._start_reply("say", lambda r: self._runner.speak_fixed(r, text))
        await reply.wait_for_playout()

    async def aclose(self) -> None:
        self._closed = True
        if self._reply is not None:
            self._reply.interrupt("closing")
        await self._hearing.aclose()
        await self._tasks.aclose()
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
            self._over_reply = self._reply_running()
        elif isinstance(event, SpeechConfirmed):
            self._barge_in()
        elif isinstance(event, SpeechPaused):
            if not self._over_reply:
                self._speculate(event.utterance)
        elif isinstance(event, SpeechResumed):
            self._cancel_speculation()
        elif isinstance(event, SpeechStopped):
            if self._over_reply:
                self._over_reply = False
                log.info("speech over the reply too short to interrupt it: ignored",
                         extra={"speech_ms": round(event.utterance.speech_ms)})
                return
            self._on_utterance(event.utterance)

    def _reply_running(self) -> bool:
        reply = self._reply
        return reply is not None and not reply.done and not reply.interrupted

    def _barge_in(self) -> None:
        """Enough speech over a reply (realtime mode): interrupt it; the utterance goes on
        and becomes the next turn, its first syllables included (the ear's pre-roll)."""
        if not self._over_reply:
            return
        reply = self._reply
        if self._ctx.listen_mode() != "realtime" or reply is None or not reply.allow_interruptions:
            return  # not ours to cut: the utterance stays ignored
        self._over_reply = False
        reply.interrupt("barge_in")

    def _on_utterance(self, utterance: Utterance) -> None:
        self._ctx.voice_activity()
        speculation, self._speculation = self._speculation, None
        self._start_reply("turn", lambda r: self._turn(r, utterance, speculation))

    def _speculate(self, utterance: Utterance) -> None:
        """ASR on a pause, so the text is ready when the silence turns out to be the end."""
        self._cancel_speculation()
        chains = self._chains.ready
        manual = self._ctx.listen_mode() == "manual"
        if chains is None or manual or not chains.asr.slots or _speculations >= MAX_SPECULATIONS:
            return
        language = self._ctx.config.persona.language
        attempts = AttemptLog()
        transcript = fallback.transcribe(chains.asr, utterance.pcm, utterance.sample_rate, language, attempts)
        self._speculation = self._tasks.create(_speculative(transcript, attempts, self._early_reply),
                                               name="asr-speculative")
        if self._ctx.config.persona.early_reply:
            self._hearing.check_after(self._speculation)  # the transcript first (Hearing.check_after)

    def _early_reply(self, text: str) -> EarlyReply | None:
        if not self._ctx.config.persona.early_reply or self._closed:
            return None
        return self._runner.early_reply(text, lambda thinking: self._tasks.create(thinking, name="early-reply"))

    def _cancel_speculation(self) -> None:
        discard_speculation(self._speculation)
        self._speculation = None

    # -- replies ----------------------------------------------------------------------------

    def _start_reply(self, kind: str, work: Work, *, recorded: bool = False) -> ReplyHandle:
        """`recorded`: besides every "turn", this reply is a turn of the history too."""
        previous = self._reply
        if previous is not None:
            previous.interrupt("superseded")
        recorded = recorded or kind == "turn"
        if recorded:
            self._turns += 1
        reply = ReplyHandle(self._turns, kind, self._turn_audio() if recorded else None)
        self._reply = reply
        task = self._tasks.create(self._run_reply(reply, work, previous), name=f"reply-{kind}")
        reply.attach(task)
        task.add_done_callback(lambda _t: self._reply_done(reply))
        self._sync_hearing()
        return reply

    async def _run_reply(self, reply: ReplyHandle, work: Work, previous: ReplyHandle | None) -> None:
        replies = self._ctx.replies
        try:
            if previous is not None:
                await asyncio.shield(previous.wait_for_playout())  # its `tts stop` goes first
            replies.reply_started(reply.kind)
            await work(reply)
        except Exception:
            log.exception("reply failed", extra={"kind": reply.kind})
        finally:
            # However the reply ended, the session hears of it: it sends the `tts stop`.
            if reply.interrupted:
                log.info("reply interrupted", extra={"kind": reply.kind, "reason": reply.interrupt_reason})
            await replies.reply_ended(reply.interrupted)
            if reply.close_after and not reply.interrupted:
                self._ctx.request_close(reply.close_after)

    def _reply_done(self, reply: ReplyHandle) -> None:
        if self._reply is reply:
            self._reply = None
            self._sync_hearing()

    def _turn_audio(self) -> TurnAudio | None:
        config = self._ctx.config
        return None if config.recording == "off" else TurnAudio.for_rates(downlink_rate=config.downlink_sample_rate)

    async def _greet(self, reply: ReplyHandle, text: str, go: asyncio.Event, wake_word: str) -> None:
        try:
            async with asyncio.timeout(GREETING_WAIT_S):
                await go.wait()
        except TimeoutError:
            pass
        self._greeting_go = None
        await self._runner.announce(reply, text, user_text=wake_word)

    async def _turn(self, reply: ReplyHandle, utterance: Utterance, speculation: asyncio.Task[Any] | None) -> None:
        try:
            outcome = await self._runner.run(reply, utterance, speculation)
        finally:
            discard_speculation(speculation)  # with its early reply, used or not
            await cancel_and_wait(speculation)
        if outcome == "exit_phrase":
            reply.close_after = "exit phrase"
        elif outcome == "spoken" and self._ctx.tool_state is not None and self._ctx.tool_state.end_requested:
            reply.close_after = "end_conversation"

    def _sync_hearing(self) -> None:
        """Accept audio while listening, except in auto/manual mode while a reply runs."""
        reply = self._reply
        busy = reply is not None and not reply.done and not reply.interrupted
        if self._closed or not self._listening or (busy and self._ctx.listen_mode() != "realtime"):
            if self._hearing.accepting:
                self._hearing.pause()
        else:
            self._hearing.resume()
