"""Speaking: sentences → TTS (with fallback) → downlink-rate PCM → 60 ms Opus → paced frames.

Two tasks per reply, joined by a bounded frame queue (pipecat's output transport, livekit's
stream adapter):
- the synthesizer turns each sentence into PCM with the TTS chain and encodes it into Opus
  frames in the shared CPU pool (never on the event loop);
- the pacer sends `sentence_start`, the sentence's frames and `sentence_end`, in order,
  against an absolute playout clock: frame n plays at anchor + n × 60 ms and is sent no
  earlier than `MAX_LEAD_FRAMES` frames before that, so the device's 40-packet decode
  queue never floods and an interruption is heard within a frame or so
  (protocol-reference §8, §11.7). When audio is late the device has run dry and restarted
  its own clock, so the pacer re-anchors on the late frame instead of bursting to "catch up".
The reply's `tts stop` is due only after the last frame's playout (`wait_for_playout`).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

from conversations.capture import AttemptLog
from conversations.pipeline import fallback
from conversations.pipeline.aio import cancel_and_wait
from conversations.pipeline.fallback import ProviderChain
from conversations.pipeline.text import clean_for_speech
from conversations.providers.base import PCMChunk, ProviderError
from devices.protocol.audio import resample
from devices.protocol.messages import Message, TtsSentenceEnd, TtsSentenceStart
from devices.protocol.opus import OpusEncoder

log = logging.getLogger(__name__)

SendMessage = Callable[[Message], Awaitable[None]]
SendAudio = Callable[[bytes], Awaitable[None]]

FRAME_MS = 60
FRAME_S = FRAME_MS / 1000
MAX_LEAD_FRAMES = 3  # frames sent whose playout has not finished, the one playing included
TTS_START_GAP_S = 0.005  # firmware resets its decoder one loop turn after `tts start`
STOP_MARGIN_S = 0.12  # transport jitter and device decode/I2S latency after the computed playout end
FIRST_SLICE_FRAMES = 3  # encode a chunk's first frames alone: the pacer starts sooner
SLICE_FRAMES = 6  # later slices stay short so another reply's first frames never wait long
QUEUE_FRAMES = 40  # server-side buffer per reply (2.4 s), the synthesizer waits beyond it
ENCODER_COMPLEXITY = 5


class Clock(Protocol):
    """Time source of the pacer; tests inject a virtual one."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class LoopClock:
    """The event loop's monotonic clock (what `call_at` schedules against)."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep_until(self, deadline: float) -> None:
        delay = deadline - self.now()
        if delay > 0:
            await asyncio.sleep(delay)


class FrameEncoder:
    """Resample to the downlink rate and cut 60 ms Opus frames. Used from executor threads,
    by one reply only (a fresh encoder per reply: an interrupted reply's encode job may
    still be running in a worker thread, and libopus state is not thread-safe)."""

    def __init__(self, sample_rate: int, complexity: int = ENCODER_COMPLEXITY) -> None:
        self.sample_rate = sample_rate
        self.complexity = complexity
        self._encoder: OpusEncoder | None = None
        self._pending = bytearray()

    def feed(self, pcm: bytes, rate: int, max_frames: int, *, keep_lock: bool = False) -> list[bytes]:
        """Add PCM at `rate`; return up to `max_frames` encoded frames."""
        if rate != self.sample_rate:
            pcm = resample(pcm, rate, self.sample_rate)
        self._pending += pcm
        return self.take(max_frames, keep_lock=keep_lock)

    def take(self, max_frames: int, *, keep_lock: bool = False) -> list[bytes]:
        encoder = self._get_encoder()
        size = encoder.frame_bytes
        count = min(max_frames, len(self._pending) // size)
        frames = [encoder.encode(bytes(self._pending[i * size : (i + 1) * size]), keep_lock=keep_lock)
                  for i in range(count)]
        del self._pending[: count * size]
        return frames

    def finish(self) -> list[bytes]:
        """The remainder of a sentence, the last frame zero-padded."""
        frames = self.take(len(self._pending))
        if self._pending:
            frames.append(self._get_encoder().encode(bytes(self._pending)))
            self._pending.clear()
        return frames

    @property
    def has_full_frame(self) -> bool:
        return len(self._pending) >= self._get_encoder().frame_bytes

    def _get_encoder(self) -> OpusEncoder:
        if self._encoder is None:
            # VoIP mode at complexity 5 (the default): 360 us per 24 kHz frame instead of 615 us
            # at libopus's 10 (measured on the 2-core box), for speech that decodes the same to
            # the ear; 78's reference server uses VoIP mode too.
            self._encoder = OpusEncoder(self.sample_rate, FRAME_MS, application="voip", complexity=self.complexity)
        return self._encoder


@dataclass
class SpeechStats:
    """Loop-clock times for the turn record, and counters."""

    first_audio_at: float | None = None  # first PCM from a TTS provider
    first_frame_at: float | None = None
    last_frame_at: float | None = None
    frames: int = 0
    sentences: int = 0
    failed_sentences: int = 0
    underruns: int = 0
    spoken: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)


@dataclass
class _Sentence:
    text: str
    kind: str  # the TTS provider that serves it
    started: bool = False


@dataclass(frozen=True)
class _SentenceStart:
    text: str


@dataclass(frozen=True)
class _SentenceEnd:
    text: str


_END = object()
_Item = _SentenceStart | _SentenceEnd | bytes | object


class SpeechStream:
    """One reply's speech. `push()` sentences, `end_input()`, then `wait_for_playout()`.

    `send`/`send_audio` should be the reply's guarded senders; `not_before` is the earliest
    loop time for the first frame (`tts start` + a few ms); `attempts` gets every TTS call.
    The reply's first encode job runs on `first_words` (default: `executor`), so a reply's
    first frames never wait behind the later frames of the replies already speaking; audio
    already at the downlink rate has its very first frame encoded on the loop (`_first_frames`).
    """

    def __init__(
        self,
        *,
        tts: ProviderChain,
        executor: Executor,
        first_words: Executor | None = None,
        send: SendMessage,
        send_audio: SendAudio,
        sample_rate: int,
        complexity: int = ENCODER_COMPLEXITY,
        voice: str,
        language: str,
        not_before: float = 0.0,
        clock: Clock | None = None,
        on_sentence: Callable[[], None] | None = None,
        attempts: AttemptLog | None = None,
    ) -> None:
        self._tts, self._executor = tts, executor
        self._first_words = first_words or executor
        self._attempts = attempts
        self._send, self._send_audio = send, send_audio
        self._voice, self._language = voice, language
        self._clock = clock or LoopClock()
        self._not_before = not_before
        self._on_sentence = on_sentence
        self._encoder = FrameEncoder(sample_rate, complexity)
        self._sentences: asyncio.Queue[tuple[str, ProviderChain] | None] = asyncio.Queue()
        self._frames: asyncio.Queue[_Item] = asyncio.Queue(QUEUE_FRAMES)
        self._playout_end: float | None = None
        self.pushed = 0  # speakable sentences queued
        self.stats = SpeechStats()
        loop = asyncio.get_running_loop()
        self._synth_task = loop.create_task(self._synthesize(), name="speech-synth")
        self._pacer_task = loop.create_task(self._pace(), name="speech-pacer")

    def push(self, sentence: str, chain: ProviderChain | None = None) -> bool:
        """Queue a sentence (cleaned of emoji and markdown here); False if nothing speakable.

        `chain` overrides the TTS chain for this sentence (the espeak-only apology)."""
        text = clean_for_speech(sentence)
        if text:
            self.pushed += 1
            self._sentences.put_nowait((text, chain or self._tts))
        return bool(text)

    def end_input(self) -> None:
        self._sentences.put_nowait(None)

    async def wait_for_playout(self) -> None:
        """Return once every frame is sent and its playout time has passed."""
        await asyncio.shield(self._pacer_task)
        if self._playout_end is not None:
            await self._clock.sleep_until(self._playout_end + STOP_MARGIN_S)

    async def aclose(self) -> None:
        """Drop whatever is queued and stop both tasks (interruption or the turn ended)."""
        await cancel_and_wait(self._synth_task, self._pacer_task)

    # -- synthesizer -----------------------------------------------------------------------

    async def _synthesize(self) -> None:
        try:
            while (item := await self._sentences.get()) is not None:
                await self._speak_sentence(*item)
        except Exception:
            # A bug here must end the reply (tts stop), not leave the device speaking.
            log.exception("speech synthesis failed")
        await self._frames.put(_END)

    async def _speak_sentence(self, text: str, chain: ProviderChain) -> None:
        try:
            kind, chunks = await fallback.synthesize(
                chain, text, voice=self._voice, language=self._language, attempts=self._attempts
            )
        except ProviderError:
            self.stats.failed_sentences += 1
            log.error("no tts provider could speak a sentence", extra={"sentence": text})
            return
        sentence = _Sentence(text, kind)
        try:
            async for chunk in chunks:
                if self.stats.first_audio_at is None:
                    self.stats.first_audio_at = self._clock.now()
                    frames = await self._first_frames(sentence, chunk)
                else:
                    frames = await self._run(self._encoder.feed, chunk.pcm, chunk.sample_rate, FIRST_SLICE_FRAMES)
                await self._queue_frames(sentence, frames)
                while self._encoder.has_full_frame:
                    await self._queue_frames(sentence, await self._run(self._encoder.take, SLICE_FRAMES))
        except ProviderError:
            log.warning("tts stream broke mid-sentence", extra={"provider": kind, "sentence": text})
        await self._queue_frames(sentence, await self._run(self._encoder.finish))
        if sentence.started:
            await self._frames.put(_SentenceEnd(text))

    async def _first_frames(self, sentence: _Sentence, chunk: PCMChunk) -> list[bytes]:
        """The reply's first words. Audio already at the downlink rate has its first frame
        encoded here, on the loop (~0.5 ms, keeping the interpreter lock), and queued at once;
        the rest of the first slice, and audio to resample, go to the first-words pool. P1 at
        200 devices (docs/performance.md, session 34): the pool's hand-off, the encode waiting
        for the lock at each frame, and the way back took 34 ms of the slowest 1 % of first
        frames' 55 ms, for 1.5 ms of CPU."""
        if chunk.sample_rate == self._encoder.sample_rate:
            await self._queue_frames(sentence, self._encoder.feed(chunk.pcm, chunk.sample_rate, 1, keep_lock=True))
            return await self._run(self._encoder.take, FIRST_SLICE_FRAMES - 1, executor=self._first_words)
        return await self._run(self._encoder.feed, chunk.pcm, chunk.sample_rate, FIRST_SLICE_FRAMES,
                               executor=self._first_words)

    async def _queue_frames(self, sentence: _Sentence, frames: list[bytes]) -> None:
        """Queue frames; the sentence's subtitle goes first, once it has audio at all."""
        if frames and not sentence.started:
            sentence.started = True
            self.stats.sentences += 1
            self.stats.spoken.append(sentence.text)
            if sentence.kind not in self.stats.providers:
                self.stats.providers.append(sentence.kind)
            await self._frames.put(_SentenceStart(sentence.text))
        for frame in frames:
            await self._frames.put(frame)

    async def _run(
        self, func: Callable[..., list[bytes]], *args: object, executor: Executor | None = None,
    ) -> list[bytes]:
        return await asyncio.get_running_loop().run_in_executor(executor or self._executor, func, *args)

    # -- pacer -----------------------------------------------------------------------------

    async def _pace(self) -> None:
        anchor: float | None = None  # playout time of frame 0 on the device's clock
        sent = 0
        pending: list[_SentenceStart] = []
        while (item := await self._frames.get()) is not _END:
            if isinstance(item, _SentenceStart):
                pending.append(item)
            elif isinstance(item, _SentenceEnd):
                await self._send(TtsSentenceEnd(item.text))
            elif isinstance(item, bytes):
                anchor = await self._wait_for_slot(anchor, sent)
                for start in pending:
                    await self._sentence_started(start)
                pending.clear()
                await self._send_audio(item)
                sent += 1
                self._frame_sent()
        if anchor is not None:
            self._playout_end = anchor + sent * FRAME_S

    async def _wait_for_slot(self, anchor: float | None, sent: int) -> float:
        """Sleep until frame `sent` may go out; return the (possibly new) anchor."""
        now = self._clock.now()
        if anchor is None:
            anchor = max(now, self._not_before)
        elif now > anchor + sent * FRAME_S:
            # Underrun: the device played everything it had, so this frame plays on arrival.
            self.stats.underruns += 1
            anchor = now - sent * FRAME_S
        due = max(anchor + (sent - (MAX_LEAD_FRAMES - 1)) * FRAME_S, self._not_before)
        if due > now:
            await self._clock.sleep_until(due)
        return anchor

    async def _sentence_started(self, start: _SentenceStart) -> None:
        if self._on_sentence is not None:
            self._on_sentence()
        await self._send(TtsSentenceStart(start.text))

    def _frame_sent(self) -> None:
        now = self._clock.now()
        if self.stats.first_frame_at is None:
            self.stats.first_frame_at = now
        self.stats.last_frame_at = now
        self.stats.frames += 1
