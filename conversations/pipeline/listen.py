"""Hearing: uplink Opus → 16 kHz PCM → Silero VAD → utterances, per session.

The event loop only queues packets (`push`, a bounded deque: drops are counted, never
buffered without limit). One worker task per session drains the queue in batches and runs
decode + VAD + endpointing for a batch in the shared CPU pool (`run_cpu`, which groups the
batches of many sessions into few pool jobs), awaiting each batch before the next, so a
session's audio stays in order while many sessions share two cores.

Everything stateful about the audio (Opus decoder, Silero state, the detector, the PCM
buffer) lives in `_Ear` and is touched only by that worker, between batches: no locks.

Modes (protocol-reference §2.4, §9):
- auto: VAD endpointing; the engine stops accepting audio while it answers.
- realtime: VAD keeps running while the reply plays, so speech starting is a barge-in.
- manual: no VAD; everything between `listen start` and `listen stop` is one utterance.
The utterance keeps ~600 ms of audio before VAD fired, so the first syllable is not cut.
A pause inside an utterance (`SpeechPaused`) lets the engine start ASR speculatively; if
speech resumes (`SpeechResumed`) it is discarded.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from conversations.pipeline.aio import cancel_and_wait
from conversations.pipeline.cpu import VAD, VadStream
from conversations.providers.vad.silero import SPEECH_STARTED, WINDOW_MS, VADDetector, VADEvent
from devices.protocol.opus import AudioError, OpusDecoder

log = logging.getLogger(__name__)

T = TypeVar("T")
# Runs a blocking job in the shared CPU pool and awaits it (engine.CpuMill.run).
RunCpu = Callable[[Callable[[], T]], Awaitable[T]]

SAMPLE_RATE = 16000
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000
PREROLL_MS = 600
KEEP_IDLE_MS = PREROLL_MS + 400  # pre-roll plus the windows VAD needs before it fires
MAX_UTTERANCE_MS = 30_000
MAX_MANUAL_MS = 60_000
QUEUE_PACKETS = 50  # 3 s of 60 ms packets
MAX_BATCH = 16
POST_WAKE_MUTE_S = 1.8  # wake-word audio and the greeting's echo are not a question
SPECULATE_AFTER_MS = 120  # Whisper needs ~0.3-0.5 s: start it well inside the silence window


@dataclass(frozen=True)
class VADSettings:
    threshold: float = 0.5
    threshold_low: float = 0.3
    min_silence_ms: float = 600.0


@dataclass(frozen=True)
class Utterance:
    pcm: bytes
    ended_at: float  # loop time of the decision (VAD end, or `listen stop`)
    speech_ms: float = 0.0
    sample_rate: int = SAMPLE_RATE


@dataclass(frozen=True)
class SpeechStarted:
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


HearingEvent = SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped


@dataclass(frozen=True)
class _Mark:
    """Raw outcome from the worker thread; timestamps are added on the loop."""

    kind: str  # "started" | "paused" | "resumed" | "stopped"
    pcm: bytes = b""
    speech_ms: float = 0.0


class _Ear:
    """Decoder, VAD state and PCM buffer of one session. Used in pool threads, by one job at a
    time (its session awaits each job)."""

    def __init__(self, vad: VADSettings) -> None:
        self._vad = vad
        self._decoder: OpusDecoder | None = None
        self.vad = VadStream()
        self._detector = VADDetector(vad.threshold, vad.threshold_low, vad.min_silence_ms)
        self._buf = bytearray()
        self._buf_start_ms = 0.0  # stream position of _buf[0]
        self._utt_start_ms: float | None = None
        self._voiced = False
        self._quiet_ms = 0.0  # trailing unvoiced audio inside an utterance
        self._paused = False

    def reset(self) -> None:
        self._detector.reset()
        self.vad.reset()
        if self._decoder is not None:
            self._decoder.reset()
        self._buf.clear()
        self._buf_start_ms = 0.0
        self._utt_start_ms = None
        self._voiced = self._paused = False
        self._quiet_ms = 0.0

    def prepare(self, packets: list[bytes], use_vad: bool) -> tuple[np.ndarray | None, int]:
        """Decode and buffer a batch; return its VAD windows (None without VAD) and the
        count of packets that would not decode."""
        pcm, invalid = self._decode(packets)
        if not use_vad:
            if len(self._buf) < MAX_MANUAL_MS * BYTES_PER_MS:
                self._buf += pcm
            return None, invalid
        self._buf += pcm
        return self.vad.windows(pcm), invalid

    def conclude(self, probabilities: list[float]) -> list[_Mark]:
        """Endpointing over the batch's window probabilities."""
        marks = [self._mark(event) for event in self._detector.feed(probabilities)]
        marks += self._pause_marks(probabilities)
        return marks + self._trim()

    def take_all(self) -> bytes:
        """Everything buffered (manual mode's `listen stop`); the buffer starts over."""
        pcm = bytes(self._buf)
        self.reset()
        return pcm

    def _decode(self, packets: list[bytes]) -> tuple[bytes, int]:
        if self._decoder is None:
            self._decoder = OpusDecoder(SAMPLE_RATE)
        parts: list[bytes] = []
        invalid = 0
        for packet in packets:
            try:
                parts.append(self._decoder.decode(packet))
            except AudioError:
                invalid += 1
        return b"".join(parts), invalid

    def _mark(self, event: VADEvent) -> _Mark:
        if event.kind == SPEECH_STARTED:
            self._utt_start_ms = max(self._buf_start_ms, event.speech_start_ms - PREROLL_MS)
            self._quiet_ms, self._paused = 0.0, False
            return _Mark("started")
        start = self._utt_start_ms if self._utt_start_ms is not None else self._buf_start_ms
        self._utt_start_ms = None
        speech_ms = (event.speech_end_ms or event.at_ms) - event.speech_start_ms
        return _Mark("stopped", self._slice(start, event.at_ms), speech_ms)

    def _pause_marks(self, probabilities: list[float]) -> list[_Mark]:
        """A pause long enough to guess the utterance ended, or speech resuming after one."""
        marks: list[_Mark] = []
        for prob in probabilities:
            if prob >= self._vad.threshold:
                self._voiced = True
            elif prob <= self._vad.threshold_low:
                self._voiced = False
            self._quiet_ms = 0.0 if self._voiced else self._quiet_ms + WINDOW_MS
            if self._paused and self._voiced:
                self._paused = False
                marks.append(_Mark("resumed"))
        in_speech = self._detector.in_speech and self._utt_start_ms is not None
        if in_speech and not self._paused and self._quiet_ms >= SPECULATE_AFTER_MS:
            self._paused = True
            end = self._detector.position_ms
            marks.append(_Mark("paused", self._slice(self._utt_start_ms or 0.0, end)))
        return marks

    def _slice(self, start_ms: float, end_ms: float) -> bytes:
        begin = int((start_ms - self._buf_start_ms) * BYTES_PER_MS) & ~1
        end = int((end_ms - self._buf_start_ms) * BYTES_PER_MS) & ~1
        return bytes(self._buf[max(0, begin) : max(0, end)])

    def _trim(self) -> list[_Mark]:
        """Bound the buffer: pre-roll only while idle, `MAX_UTTERANCE_MS` in speech."""
        end_ms = self._buf_start_ms + len(self._buf) / BYTES_PER_MS
        if self._utt_start_ms is None:
            self._drop_before(end_ms - KEEP_IDLE_MS)
            return []
        self._drop_before(self._utt_start_ms)
        if end_ms - self._utt_start_ms < MAX_UTTERANCE_MS:
            return []
        # A monologue (or endless noise): hand over what we have and start afresh.
        pcm = bytes(self._buf)
        self.reset()
        return [_Mark("stopped", pcm, MAX_UTTERANCE_MS)]

    def _drop_before(self, ms: float) -> None:
        count = int((ms - self._buf_start_ms) * BYTES_PER_MS) & ~1
        if count > 0:
            del self._buf[:count]
            self._buf_start_ms += count / BYTES_PER_MS


Outcome = tuple[Any, BaseException | None]  # (value, error) of one job


@dataclass
class EarJob:
    """One session's batch for the CPU mill; the jobs of a group are processed together."""

    ear: _Ear
    packets: list[bytes]
    use_vad: bool

    def __call__(self) -> tuple[list[_Mark], int]:
        value, error = process_batches([self])[0]
        if error is not None:
            raise error
        return value

    @staticmethod
    def run_many(jobs: list[EarJob]) -> list[Outcome]:
        return process_batches(jobs)


def process_batches(jobs: list[EarJob]) -> list[Outcome]:
    """Decode every job's packets, run VAD for all of them in shared model runs, then
    endpoint each session. A job's failure is its own; a failed model run fails the jobs
    that needed it (their sessions log it and go on with the next batch)."""
    outcomes: list[Outcome] = [(None, None)] * len(jobs)
    windows: dict[int, np.ndarray] = {}
    for i, job in enumerate(jobs):
        try:
            found, invalid = job.ear.prepare(job.packets, job.use_vad)
        except Exception as exc:
            outcomes[i] = (None, exc)
            continue
        outcomes[i] = (([], invalid), None)
        if found is not None:
            windows[i] = found
    try:
        probs = VAD.run([jobs[i].ear.vad for i in windows], list(windows.values()))
    except Exception as exc:
        return [(None, exc) if i in windows else outcome for i, outcome in enumerate(outcomes)]
    for i, p in zip(windows, probs, strict=True):
        outcomes[i] = ((jobs[i].ear.conclude(p), outcomes[i][0][1]), None)
    return outcomes


_FLUSH = object()  # manual mode's `listen stop`, queued behind the audio it closes


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
    """Per-session hearing. The engine decides when it accepts audio and in which mode."""

    def __init__(
        self,
        *,
        run_cpu: RunCpu,
        vad: VADSettings,
        on_event: Callable[[HearingEvent], None],
        queue_packets: int = QUEUE_PACKETS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._run_cpu = run_cpu
        self._on_event = on_event
        self._ear = _Ear(vad)
        self._queue: deque[tuple[bytes, float] | object] = deque()  # (packet, arrival) or _FLUSH
        self._queue_packets = queue_packets
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._now = clock or self._loop.time
        self._generation = 0  # bumped by start(); a batch from an older generation is stale
        self._ear_generation = 0
        self._mute_until = 0.0
        self.mode = "auto"
        self.accepting = False
        self.dropped = self.ignored = self.invalid = self.packets = 0
        self.lag = LagHistogram()
        self._task = self._loop.create_task(self._run(), name="hearing")

    # -- called from the engine (event loop) ------------------------------------------------

    def start(self, mode: str) -> None:
        """`listen start`: forget earlier audio and listen in `mode`."""
        self.mode = mode
        self._generation += 1
        self._queue.clear()
        self.accepting = True

    def pause(self) -> None:
        """Stop taking audio (auto/manual while the engine answers); a batch already in
        the pool is discarded too."""
        self.accepting = False
        self._generation += 1
        self._queue.clear()

    def resume(self) -> None:
        if not self.accepting:
            self.start(self.mode)

    def mute(self, seconds: float) -> None:
        """Ignore audio for a while (after the wake word) and start afresh after it."""
        self._mute_until = self._now() + seconds
        self._generation += 1
        self._queue.clear()

    def finish_manual(self) -> None:
        """`listen stop` in manual mode: the audio queued so far is the utterance."""
        self._queue.append(_FLUSH)
        self.accepting = False
        self._wake.set()

    def push(self, packet: bytes) -> None:
        """Queue one uplink packet. Never blocks; cheap enough to run per packet on the loop."""
        if not self.accepting or (self._mute_until and self._now() < self._mute_until):
            self.ignored += 1
            return
        if len(self._queue) >= self._queue_packets:
            self.dropped += 1
            return
        self._queue.append((packet, self._now()))
        self._wake.set()

    async def aclose(self) -> None:
        self.accepting = False
        await cancel_and_wait(self._task)
        if self.packets or self.dropped:
            log.info("hearing stats", extra={
                "packets": self.packets, "dropped": self.dropped, "ignored": self.ignored,
                "invalid": self.invalid, "lag_p50_ms": self.lag.percentile(0.5),
                "lag_p99_ms": self.lag.percentile(0.99), "lag_max_ms": round(self.lag.max_ms, 1),
                "lag_histogram_ms": self.lag.counts,
            })  # fmt: skip

    # -- worker ------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                try:
                    await self._step()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # One bad batch must not deafen the session for good.
                    log.exception("hearing batch failed")

    async def _step(self) -> None:
        batch, arrivals, flush = self._take_batch()
        generation = self._generation
        if self._ear_generation != generation:
            self._ear.reset()
            self._ear_generation = generation
        use_vad = self.mode != "manual"
        if batch:
            self.packets += len(batch)
            marks, invalid = await self._run_cpu(EarJob(self._ear, batch, use_vad))
            done = self._now()
            for arrived in arrivals:
                self.lag.add(done - arrived)
            self.invalid += invalid
            self._dispatch(marks, generation)
        if flush and generation == self._generation:
            pcm = await self._run_cpu(self._ear.take_all)
            self._on_event(SpeechStopped(Utterance(pcm, self._now(), len(pcm) / BYTES_PER_MS)))

    def _take_batch(self) -> tuple[list[bytes], list[float], bool]:
        batch: list[bytes] = []
        arrivals: list[float] = []
        while self._queue and len(batch) < MAX_BATCH:
            item = self._queue.popleft()
            if item is _FLUSH:
                return batch, arrivals, True
            packet, arrived = item  # type: ignore[misc]
            batch.append(packet)
            arrivals.append(arrived)
        return batch, arrivals, False

    def _dispatch(self, marks: list[_Mark], generation: int) -> None:
        now = self._now()
        for mark in marks:
            if generation != self._generation:
                return  # start/pause/mute since the batch was taken: the rest is stale
            if mark.kind == "started":
                self._on_event(SpeechStarted(now))
            elif mark.kind == "paused":
                self._on_event(SpeechPaused(Utterance(mark.pcm, now, mark.speech_ms)))
            elif mark.kind == "resumed":
                self._on_event(SpeechResumed(now))
            else:
                self._on_event(SpeechStopped(Utterance(mark.pcm, now, mark.speech_ms)))
