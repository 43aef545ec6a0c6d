"""Hearing: the session side of the uplink. Packets in, speech events out.

The event loop only queues packets (`push`, a bounded deque: drops are counted, never
buffered without limit). At the end of the loop tick, the session's queued packets become one
hearing job for the shared CPU pool (`CpuMill.at_tick` collects every session's in one
callback; `CpuMill.submit` with the VAD's `HearingBatch`: decode + VAD + endpointing,
endpointing.py). Its outcome comes back by a call (`deliver`), and the session takes its next
batch only then, so its audio stays in order while the jobs of many sessions share pool runs.
No task per session and no future per batch: the uplink's hand-offs are per tick, not per
packet (issue 17).

Everything stateful about the audio (Opus decoder, VAD state, the detector, the PCM buffer)
lives in the session's `Ear` and is touched only by that worker's jobs, between batches: no
locks. The engine says when to listen and how: with endpointing (auto and realtime modes:
VAD decides where an utterance ends) or without (manual mode: everything until `listen
stop` is one utterance, `finish_manual`). The utterance keeps ~600 ms of audio before VAD
fired, so the first syllable is not cut. A pause inside an utterance (`SpeechPaused`) lets
the engine start ASR speculatively; if speech resumes (`SpeechResumed`) it is discarded.
`SpeechConfirmed` says the utterance has had enough confident speech to interrupt a reply
(the persona's barge-in settings): the engine interrupts on it, not on `SpeechStarted`.

With "smart" turn detection the ear also asks, once per pause, whether the utterance is
complete: the hearing runs the end-of-turn model (its own bounded thread pool, providers/
turn/smart_turn.py) in a task it owns, and hands the verdict back to the ear between
batches; "complete" ends the utterance at once, and finds the speculative ASR (started at
the first quiet window, endpointing.SPECULATE_SMART_MS) and its early reply under way; with
early replies the check waits for that transcription first (`check_after`). The
checks of an utterance (probability, model time, who ended it, the silence waited) travel
with it to the turn's timings.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from conversations.pipeline.aio import cancel_and_wait
from conversations.pipeline.cpu_pool import CpuMill
from conversations.pipeline.echo import EchoCanceller, ReferenceRing
from conversations.pipeline.endpointing import (
    BYTES_PER_MS,
    PREROLL_MS,
    SAMPLE_RATE,
    Ear,
    EarJob,
    HearingBatch,
    Mark,
    VADSettings,
)
from conversations.providers.base import AEC, VAD, TurnModel, TurnVerdict

log = logging.getLogger(__name__)

__all__ = [
    "BYTES_PER_MS", "PREROLL_MS", "SAMPLE_RATE", "Hearing", "HearingEvent", "LagHistogram", "SpeechConfirmed",
    "SpeechPaused",
    "SpeechResumed", "SpeechStarted", "SpeechStopped", "Utterance", "VADSettings",
]

QUEUE_PACKETS = 50  # 3 s of 60 ms packets
MAX_BATCH = 16
POST_WAKE_MUTE_S = 1.8  # wake-word audio and the greeting's echo are not a question
# A pause's turn check waits this long at most for the pause's transcription (`check_after`):
# Whisper's short pass takes ~140-170 ms on 2 cores, ~250 ms while the model runs beside it.
CHECK_WAIT_S = 0.2


@dataclass(frozen=True)
class Utterance:
    pcm: bytes
    ended_at: float  # loop time of the decision (VAD end, or `listen stop`)
    speech_ms: float = 0.0
    sample_rate: int = SAMPLE_RATE
    packets: list[bytes] = field(default_factory=list)  # the Opus packets behind `pcm` (recording only)
    # End of turn, for the turn's timings: turn_silence_ms (quiet heard after the last
    # voice), and with the model: turn_checks, turn_complete (1: the model ended the turn,
    # 0: the silence limit did), turn_probability and turn_model_ms of the last check.
    turn: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SpeechStarted:
    at: float


@dataclass(frozen=True)
class SpeechConfirmed:
    """The utterance has enough confident speech to interrupt a reply (barge-in settings)."""

    at: float


@dataclass(frozen=True)
class SpeechPaused:
    utterance: Utterance


@dataclass(frozen=True)
class SpeechResumed:
    at: float


@dataclass(frozen=True)
class SpeechStopped:
    utterance: Utterance


HearingEvent = SpeechStarted | SpeechConfirmed | SpeechPaused | SpeechResumed | SpeechStopped


_FLUSH = object()  # manual mode's `listen stop`, queued behind the audio it closes


@dataclass(slots=True)
class _InFlight:
    """The job the mill runs for a session: a batch ("hear") or manual mode's `take_all`."""

    kind: str  # "hear" | "flush"
    generation: int
    arrivals: list[float]
    flush: bool = False  # "hear": `listen stop` follows the batch


class LagHistogram:
    """Lag from a packet's arrival (`push`) to the end of its decode + VAD, in 1 ms buckets:
    the streaming-capacity figure (P2, bench/p2_streaming.py), logged per session."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.max_ms = 0.0

    def add(self, seconds: float) -> None:
        ms = max(0.0, seconds * 1000)
        self.counts[int(ms)] = self.counts.get(int(ms), 0) + 1
        self.max_ms = max(self.max_ms, ms)

    def percentile(self, q: float) -> float:
        """Upper edge of the bucket holding the q-quantile (0 when empty)."""
        total, seen = sum(self.counts.values()), 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= q * total:
                return bucket + 1.0
        return 0.0


class Hearing:
    """Per-session hearing. The engine decides when it accepts audio, with endpointing or not."""

    def __init__(
        self,
        *,
        mill: CpuMill,
        vad: VAD,
        settings: VADSettings,
        on_event: Callable[[HearingEvent], None],
        queue_packets: int = QUEUE_PACKETS,
        clock: Callable[[], float] | None = None,
        keep_packets: bool = False,
        aec: AEC | None = None,
        turn_model: TurnModel | None = None,
    ) -> None:
        self._mill = mill
        self._batch = HearingBatch(vad)
        self._on_event = on_event
        if settings.smart and turn_model is None:
            settings = replace(settings, turn_detection="silence")
        # aec: the device's echo is cancelled before VAD (server AEC, `features.aec` devices)
        self.echo = EchoCanceller(aec.stream(), ReferenceRing()) if aec is not None else None
        self._ear = Ear(settings, vad, keep_packets=keep_packets, echo=self.echo)  # keep_packets: recorded
        self._turn_model = turn_model
        self._check_task: asyncio.Task[None] | None = None  # the pause's model run (at most one)
        # (generation, check, verdict, packets received when it came)
        self._verdicts: deque[tuple[int, int, TurnVerdict | None, int]] = deque(maxlen=4)
        self._checks: list[TurnVerdict] = []  # the current utterance's answers
        self._check_after: asyncio.Future[Any] | None = None  # see check_after
        self._queue: deque[tuple[bytes, float, int] | object] = deque()  # (packet, arrival, stamp) or _FLUSH
        self._queue_packets = queue_packets
        self._loop = asyncio.get_running_loop()
        self._now = clock or self._loop.time
        self._generation = 0  # bumped by start(); a batch from an older generation is stale
        self._ear_generation = 0
        self._mute_until = 0.0
        self.endpointing = True  # False in manual mode
        self.accepting = False
        self.dropped = self.ignored = self.invalid = self.packets = 0
        self._received = self._forgotten = 0  # packets queued, and dropped from the queue unheard
        self.lag = LagHistogram()
        self._inflight: _InFlight | None = None  # the job in the pool (at most one)
        self._scheduled = False  # `_next` is due at the end of this tick
        self._closed = False

    # -- called from the engine (event loop) ------------------------------------------------

    def start(self, endpointing: bool) -> None:
        """`listen start`: forget earlier audio and listen, with VAD endpointing or without
        (manual mode)."""
        self.endpointing = endpointing
        self._generation += 1
        self._forget_queue()
        self.accepting = True

    def pause(self) -> None:
        """Stop taking audio (auto/manual while the engine answers); a batch already in
        the pool is discarded too."""
        self.accepting = False
        self._generation += 1
        self._forget_queue()

    def _forget_queue(self) -> None:
        self._forgotten += sum(1 for item in self._queue if isinstance(item, tuple))
        self._queue.clear()

    def resume(self) -> None:
        if not self.accepting:
            self.start(self.endpointing)

    def mute(self, seconds: float) -> None:
        """Ignore audio for a while (after the wake word) and start afresh after it."""
        self._mute_until = self._now() + seconds
        self._generation += 1
        self._forget_queue()

    def finish_manual(self) -> None:
        """`listen stop` in manual mode: the audio queued so far is the utterance."""
        self._queue.append(_FLUSH)
        self.accepting = False
        self._schedule()

    def check_after(self, transcription: asyncio.Future[Any] | None) -> None:
        """The pause's turn check waits for `transcription` (at most CHECK_WAIT_S) before it
        runs the model. With early replies the transcript, then the LLM, is the turn's critical
        path and the verdict only has to come before the reply is ready; the model and Whisper
        on the same two cores slowed the transcript by up to ~80 ms (P4, docs/performance.md)."""
        self._check_after = transcription

    def push(self, packet: bytes, timestamp: int = 0) -> None:
        """Queue one uplink packet (`timestamp`: its v2 stamp). Never blocks; cheap enough to
        run per packet on the loop."""
        if not self.accepting or (self._mute_until and self._now() < self._mute_until):
            self.ignored += 1
            return
        if len(self._queue) >= self._queue_packets:
            self.dropped += 1
            return
        self._queue.append((packet, self._now(), timestamp))
        self._received += 1
        if not self._scheduled and self._inflight is None:
            self._schedule()

    def reference(self, timestamp: int, opus: bytes) -> None:
        """A downlink frame just sent with this v2 timestamp: the echo to cancel (server AEC)."""
        if self.echo is not None:
            self.echo.ring.add(timestamp, opus)

    @property
    def idle(self) -> bool:
        """Nothing queued, in the pool or due (tests, benchmarks)."""
        return not self._queue and self._inflight is None and not self._scheduled

    async def aclose(self) -> None:
        self.accepting = False
        self._closed = True  # a job in the pool is not delivered; one pending is skipped
        await cancel_and_wait(self._check_task)
        if self.packets or self.dropped:
            log.info("hearing stats", extra={
                "packets": self.packets, "dropped": self.dropped, "ignored": self.ignored,
                "invalid": self.invalid, "lag_p50_ms": self.lag.percentile(0.5),
                "lag_p99_ms": self.lag.percentile(0.99), "lag_max_ms": round(self.lag.max_ms, 1),
                "lag_histogram_ms": self.lag.counts,
                **({"aec": vars(self.echo.stats)} if self.echo is not None else {}),
            })  # fmt: skip

    # -- the pool's side: one job at a time, collected per tick ------------------------------

    def _schedule(self) -> None:
        """Take the next batch at the end of this tick, with every other session's."""
        if not self._scheduled and self._inflight is None and not self._closed:
            self._scheduled = True
            self._mill.at_tick(self._next)

    def _next(self) -> None:
        self._scheduled = False
        if self._closed or self._inflight is not None:
            return
        self._apply_verdicts()
        if not self._queue:
            return
        batch, arrivals, stamps, flush = self._take_batch()
        generation = self._generation
        if self._ear_generation != generation:
            self._ear.reset()
            self._ear_generation = generation
        if batch:
            self.packets += len(batch)
            job = EarJob(self._ear, batch, self.endpointing, stamps if self.echo is not None else None)
            self._inflight = _InFlight("hear", generation, arrivals, flush)
            self._mill.submit(self._batch, job, self)
        elif flush:
            self._take_all(generation)

    def _take_all(self, generation: int) -> None:
        self._inflight = _InFlight("flush", generation, [])
        self._mill.submit(None, self._ear.take_all, self)

    def done(self) -> bool:
        """`JobSink`: True once closed (nobody waits for the job)."""
        return self._closed

    def deliver(self, value: Any, error: BaseException | None) -> None:
        """`JobSink`: the outcome of the job in the pool, on the loop."""
        job, self._inflight = self._inflight, None
        if job is None or self._closed:
            return
        try:
            if error is not None:
                raise error
            if job.kind == "flush":
                pcm, packets = value
                self._on_event(SpeechStopped(Utterance(pcm, self._now(), len(pcm) / BYTES_PER_MS, packets=packets)))
            else:
                self._heard(job, value)
        except Exception:
            # One bad batch must not deafen the session for good.
            log.exception("hearing batch failed")
        else:
            if job.flush and job.generation == self._generation:
                self._take_all(job.generation)
                return
        self._apply_verdicts()
        self._schedule()

    def _heard(self, job: _InFlight, value: tuple[list[Mark], int]) -> None:
        marks, invalid = value
        done = self._now()
        add = self.lag.add
        for arrived in job.arrivals:
            add(done - arrived)
        if job.arrivals:
            self._mill.note_lag(done - job.arrivals[0])
        self.invalid += invalid
        self._dispatch(marks, job.generation)

    def _take_batch(self) -> tuple[list[bytes], list[float], list[int], bool]:
        batch: list[bytes] = []
        arrivals: list[float] = []
        stamps: list[int] = []
        while self._queue and len(batch) < MAX_BATCH:
            item = self._queue.popleft()
            if not isinstance(item, tuple):  # _FLUSH
                return batch, arrivals, stamps, True
            packet, arrived, stamp = item
            batch.append(packet)
            arrivals.append(arrived)
            stamps.append(stamp)
        return batch, arrivals, stamps, False

    def _dispatch(self, marks: list[Mark], generation: int) -> None:
        now = self._now()
        for mark in marks:
            if generation != self._generation:
                return  # start/pause/mute since the batch was taken: the rest is stale
            if mark.kind == "started":
                self._checks = []
                self._on_event(SpeechStarted(now))
            elif mark.kind == "confirmed":
                self._on_event(SpeechConfirmed(now))
            elif mark.kind == "check":
                self._ask(mark, generation)
            elif mark.kind == "paused":
                self._on_event(SpeechPaused(Utterance(mark.pcm, now, mark.speech_ms)))
            elif mark.kind == "resumed":
                self._on_event(SpeechResumed(now))
            else:
                self._cancel_check()
                turn, self._checks = self._turn_timings(mark), []
                self._on_event(SpeechStopped(Utterance(mark.pcm, now, mark.speech_ms, packets=mark.packets, turn=turn)))

    # -- end of turn ------------------------------------------------------------------------

    def _ask(self, mark: Mark, generation: int) -> None:
        """One model run per pause; a newer pause replaces an older run still going."""
        if self._turn_model is None:
            return
        self._cancel_check()
        self._check_task = self._loop.create_task(self._check(self._turn_model, mark.pcm, mark.check, generation),
                                                  name="turn-check")

    async def _check(self, model: TurnModel, pcm: bytes, check: int, generation: int) -> None:
        verdict: TurnVerdict | None
        first = self._check_after
        if first is not None and not first.done():
            await asyncio.wait((first,), timeout=CHECK_WAIT_S)  # never cancels it
        try:
            verdict = await model.predict(pcm)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("turn model failed; the pause ends on the silence window", extra={"error": str(exc)[:200]})
            verdict = None
        self._verdicts.append((generation, check, verdict, self._received))
        self._schedule()  # applied between batches: the ear has one user at a time

    def _apply_verdicts(self) -> None:
        """Apply the model's answers once the ear has heard every packet received before
        them: in a backlog (a lagging session), speech resuming after the pause makes a
        "complete" stale instead of cutting the user off."""
        while self._verdicts:
            generation, check, verdict, received = self._verdicts[0]
            stale = generation != self._generation or generation != self._ear_generation
            if not stale and self.packets + self._forgotten < received:
                return
            self._verdicts.popleft()
            if stale:
                continue
            if verdict is not None:
                self._checks.append(verdict)
            marks = self._ear.verdict(check, None if verdict is None else verdict.complete)
            self._dispatch(marks, generation)

    def _cancel_check(self) -> None:
        if self._check_task is not None and not self._check_task.done():
            self._check_task.cancel()
        self._check_task = None

    def _turn_timings(self, mark: Mark) -> dict[str, float]:
        turn = {"turn_silence_ms": round(mark.silence_ms, 1)}
        if self._checks:
            last = self._checks[-1]
            turn.update(turn_checks=float(len(self._checks)), turn_complete=1.0 if mark.by_model else 0.0,
                        turn_probability=round(last.probability, 4), turn_model_ms=round(last.elapsed_ms, 1))
        return turn
