"""Endpointing: from Opus packets to speech marks, per session, in the shared CPU pool.

`HearingBatch.run_batch` is the hearing's pool job (listen.py submits it through
`CpuMill.run_batched`): it decodes each session's packets (Opus → 16 kHz PCM), cancels the
device's echo where the session has a canceller (echo.py: devices with `features.aec`, so
everything after this sees the residual), asks the VAD
provider for all of their window probabilities in one call (the windows of many sessions
share model runs), then endpoints each session (`Ear.endpoint`): `VADDetector` turns
probabilities into speech started/stopped with a 3-of-5 voiced-window rule and a dual
threshold, and the ear adds ~600 ms of pre-roll, pause marks for speculative ASR, the
utterance length limit and the barge-in confirmation ("confirmed": the utterance has had
`barge_in_min_ms` of windows at `barge_in_min_probability` or more, counted from its first
voiced window and started over after `CONFIRM_GAP_MS` of silence, so a cough, a short "mm"
or scattered blips of residual echo never add up to it). Pure and synchronous; timestamps
are added on the loop.

End of turn ("smart" turn detection): the detector's silence window becomes the persona's
maximum silence, and after `turn_pause_ms` of quiet the ear emits one "check" mark per pause
carrying the utterance so far; the hearing asks the end-of-turn model (off the loop) and
hands the answer back through `Ear.verdict`, which ends the utterance at once when the model
says "complete". Speech resuming re-arms the check, so a pause asks the model at most once.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from conversations.capture import PacketTrail
from conversations.pipeline.echo import EchoCanceller
from conversations.providers.base import VAD
from devices.protocol.opus import AudioError, OpusDecoder

SAMPLE_RATE = 16000
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000
PREROLL_MS = 600
KEEP_IDLE_MS = PREROLL_MS + 400  # pre-roll plus the windows VAD needs before it fires
MAX_UTTERANCE_MS = 30_000
MAX_MANUAL_MS = 60_000
CONFIRM_GAP_MS = 96  # this much unvoiced audio (3 Silero windows) restarts the barge-in count
SPECULATE_AFTER_MS = 120  # "silence": Whisper (~0.1-0.4 s) is done well inside the 600 ms window
# "smart": at the first quiet window. Silero stays voiced for 2-3 windows after the voice
# ends, so this is already ~100 ms after it; the transcript (and the early reply asked on it,
# early.py) is then the turn's critical path, not the model's verdict (P4, docs/
# performance.md). The price is a Whisper run on gaps inside a sentence, cancelled (with its
# early reply) when speech resumes.
SPECULATE_SMART_MS = 32
Outcome = tuple[Any, BaseException | None]  # (value, error) of one job


@dataclass(frozen=True)
class VADSettings:
    threshold: float = 0.5
    threshold_low: float = 0.3
    min_silence_ms: float = 600.0  # "silence" turn detection: the fixed end-of-speech window
    turn_detection: str = "silence"  # "smart": ask the end-of-turn model on pauses
    turn_pause_ms: float = 100.0  # smart: quiet before the model is asked
    turn_max_silence_ms: float = 1500.0  # smart: the turn ends after this much quiet regardless
    # What it takes for speech over a reply to interrupt it (persona settings).
    barge_in_min_ms: float = 180.0
    barge_in_min_probability: float = 0.8

    @property
    def smart(self) -> bool:
        return self.turn_detection == "smart"

    @property
    def speculate_after_ms(self) -> float:
        """Quiet before the speculative ASR starts (the "paused" mark)."""
        return min(SPECULATE_SMART_MS, self.turn_pause_ms) if self.smart else SPECULATE_AFTER_MS

    @property
    def stop_after_ms(self) -> float:
        """The detector's silence window: the hard limit in smart mode."""
        return max(self.turn_max_silence_ms, self.turn_pause_ms) if self.smart else self.min_silence_ms


@dataclass(frozen=True)
class Mark:
    """Raw outcome from the worker thread; timestamps are added on the loop."""

    kind: str  # "started" | "confirmed" | "paused" | "resumed" | "check" | "stopped"
    pcm: bytes = b""
    speech_ms: float = 0.0
    packets: list[bytes] = field(default_factory=list)  # "stopped": the Opus behind `pcm` (recording)
    check: int = 0  # "check": the pause's number, handed back with the model's verdict
    silence_ms: float = 0.0  # "stopped": audio after the last voiced window (the end-of-turn wait)
    by_model: bool = False  # "stopped": the end-of-turn model ended it


class Ear:
    """Decoder, VAD state, endpointing and PCM buffer of one session. Used in pool threads,
    by one job at a time (its session awaits each job)."""

    def __init__(
        self, settings: VADSettings, vad: VAD, *, keep_packets: bool = False, echo: EchoCanceller | None = None,
    ) -> None:
        self._settings = settings
        self.echo = echo  # server AEC: kept across resets, its filter has learnt the room
        # The utterance's Opus packets as heard, for turn audio (None: not recorded).
        self.trail: PacketTrail | None = PacketTrail() if keep_packets else None
        self._window_ms = vad.window_ms
        self._decoder: OpusDecoder | None = None
        self.vad_stream = vad.stream()
        self._detector = VADDetector(settings.threshold, settings.threshold_low, settings.stop_after_ms,
                                     window_ms=vad.window_ms)
        self._buf = bytearray()
        self._buf_start_ms = 0.0  # stream position of _buf[0]
        self._utt_start_ms: float | None = None
        self._voiced = False
        self._quiet_ms = 0.0  # trailing unvoiced audio inside an utterance
        self._paused = False
        self._strong_ms = 0.0  # confident speech since the last gap, in the candidate or utterance
        self._gap_ms = 0.0  # unvoiced audio in a row
        self._confirmed = False
        self._checks = 0  # pauses the end-of-turn model was asked about (numbers the checks)
        self._checked = False  # this pause has its check
        self._fallback = False  # the model could not answer: this pause ends at min_silence_ms

    def reset(self) -> None:
        self._detector.reset()
        self.vad_stream.reset()
        if self._decoder is not None:
            self._decoder.reset()
        self._buf.clear()
        self._buf_start_ms = 0.0
        self._utt_start_ms = None
        self._voiced = self._paused = self._checked = self._fallback = self._confirmed = False
        self._quiet_ms = self._strong_ms = self._gap_ms = 0.0
        if self.trail is not None:
            self.trail.clear()

    def hear(self, packets: list[bytes], endpointing: bool, stamps: list[int] | None = None) -> tuple[bytes, int]:
        """Decode (and cancel the echo of) a batch and buffer it; return its PCM and the count
        of packets that would not decode (manual mode buffers up to MAX_MANUAL_MS).
        `stamps`: the packets' v2 timestamps (what the device was playing)."""
        keep = endpointing or len(self._buf) < MAX_MANUAL_MS * BYTES_PER_MS
        pcm, invalid = self._decode(packets, self.trail if keep else None, stamps)
        if keep:
            self._buf += pcm
        return pcm, invalid

    def endpoint(self, probabilities: list[float]) -> list[Mark]:
        """Endpointing over the batch's window probabilities."""
        marks: list[Mark] = []
        for prob in probabilities:  # window by window: the barge-in count follows the detector
            for event in self._detector.feed([prob]):
                marks.append(self._mark(event))
            if self._confirm(prob):
                marks.append(Mark("confirmed"))
        marks += self._pause_marks(probabilities)
        return marks + self._trim()

    def verdict(self, check: int, complete: bool | None) -> list[Mark]:
        """The end-of-turn model's answer to "check" mark `check` (None: it could not answer).
        Stale answers (speech resumed, the utterance ended, a newer pause) change nothing."""
        if check != self._checks or not self._checked or not self._in_utterance():
            return []
        if complete:
            return [self._mark(self._detector.force_stop(), by_model=True)]
        if complete is None:
            self._fallback = True
            return self._fallback_stop()
        return []  # incomplete: wait for more speech or the maximum silence

    def take_all(self) -> tuple[bytes, list[bytes]]:
        """Everything buffered and its packets (manual mode's `listen stop`); the buffer
        starts over."""
        pcm = bytes(self._buf)
        packets = self.trail.take_all() if self.trail is not None else []
        self.reset()
        return pcm, packets

    def _decode(
        self, packets: list[bytes], trail: PacketTrail | None, stamps: list[int] | None = None,
    ) -> tuple[bytes, int]:
        if self._decoder is None:
            self._decoder = OpusDecoder(SAMPLE_RATE)
        parts: list[bytes] = []
        invalid = 0
        for index, packet in enumerate(packets):
            try:
                pcm = self._decoder.decode(packet)
            except AudioError:
                invalid += 1
                continue
            if self.echo is not None:
                pcm = self.echo.process(pcm, stamps[index] if stamps else 0)
            parts.append(pcm)
            if trail is not None:
                trail.add(packet, len(pcm))  # recording: the one extra step per packet
        return b"".join(parts), invalid

    def _mark(self, event: VADEvent, *, by_model: bool = False) -> Mark:
        if event.kind == SPEECH_STARTED:
            self._utt_start_ms = max(self._buf_start_ms, event.speech_start_ms - PREROLL_MS)
            self._quiet_ms, self._paused, self._checked, self._fallback = 0.0, False, False, False
            return Mark("started")
        start = self._utt_start_ms if self._utt_start_ms is not None else self._buf_start_ms
        self._utt_start_ms = None
        self._checked = self._fallback = False
        self._strong_ms, self._confirmed = 0.0, False
        last_voice = event.speech_end_ms if event.speech_end_ms is not None else event.at_ms
        speech_ms = last_voice - event.speech_start_ms
        # PCM and packets are cut with the same bounds (the turn's audio matches its PCM).
        return Mark("stopped", self._slice(start, event.at_ms), speech_ms, self._packets(start, event.at_ms),
                    silence_ms=max(0.0, event.at_ms - last_voice), by_model=by_model)

    def _in_utterance(self) -> bool:
        return self._detector.in_speech and self._utt_start_ms is not None

    def _fallback_stop(self) -> list[Mark]:
        """Without the model's answer a pause ends like in "silence" mode."""
        if self._fallback and self._in_utterance() and self._quiet_ms >= self._settings.min_silence_ms:
            return [self._mark(self._detector.force_stop())]
        return []

    def _pause_marks(self, probabilities: list[float]) -> list[Mark]:
        """A pause long enough to guess the utterance ended, or speech resuming after one."""
        marks: list[Mark] = []
        for prob in probabilities:
            if prob >= self._settings.threshold:
                self._voiced = True
            elif prob <= self._settings.threshold_low:
                self._voiced = False
            self._quiet_ms = 0.0 if self._voiced else self._quiet_ms + self._window_ms
            if self._voiced:
                self._checked = self._fallback = False  # a new pause gets its own check
            if self._paused and self._voiced:
                self._paused = False
                marks.append(Mark("resumed"))
        in_speech = self._in_utterance()
        end = self._detector.position_ms
        if in_speech and not self._paused and self._quiet_ms >= self._settings.speculate_after_ms:
            self._paused = True
            marks.append(Mark("paused", self._slice(self._utt_start_ms or 0.0, end)))
        if in_speech and self._settings.smart and not self._checked and self._quiet_ms >= self._settings.turn_pause_ms:
            self._checked = True
            self._checks += 1
            # The model hears the pause as long as turn_pause_ms, however many packets this
            # batch held (a lagging session hears several at once): more trailing quiet
            # would make "complete" likelier under load. It reads the last 8 s only.
            at = end - (self._quiet_ms - self._settings.turn_pause_ms)
            start = max(self._utt_start_ms or 0.0, at - 8000.0)
            marks.append(Mark("check", self._slice(start, at), check=self._checks))
        return marks + self._fallback_stop()

    def _confirm(self, prob: float) -> bool:
        """True once per utterance, at the window that gives it enough confident speech to
        interrupt a reply."""
        detector, settings = self._detector, self._settings
        if not detector.in_speech and not detector.has_candidate:
            self._strong_ms, self._gap_ms, self._confirmed = 0.0, 0.0, False  # nothing, or a blip that died out
            return False
        if prob >= settings.barge_in_min_probability:
            self._strong_ms += self._window_ms
            self._gap_ms = 0.0
        elif prob <= settings.threshold_low:
            self._gap_ms += self._window_ms
            if self._gap_ms >= CONFIRM_GAP_MS:
                self._strong_ms = 0.0
        if detector.in_speech and not self._confirmed and self._strong_ms >= settings.barge_in_min_ms:
            self._confirmed = True
            return True
        return False

    def _slice(self, start_ms: float, end_ms: float) -> bytes:
        begin = int((start_ms - self._buf_start_ms) * BYTES_PER_MS) & ~1
        end = int((end_ms - self._buf_start_ms) * BYTES_PER_MS) & ~1
        return bytes(self._buf[max(0, begin) : max(0, end)])

    def _packets(self, start_ms: float, end_ms: float) -> list[bytes]:
        """The uplink packets behind `_slice(start_ms, end_ms)` (when recording)."""
        if self.trail is None:
            return []
        return self.trail.between(int(start_ms * BYTES_PER_MS) & ~1, int(end_ms * BYTES_PER_MS) & ~1)

    def _trim(self) -> list[Mark]:
        """Bound the buffer: pre-roll only while idle, `MAX_UTTERANCE_MS` in speech."""
        end_ms = self._buf_start_ms + len(self._buf) / BYTES_PER_MS
        if self._utt_start_ms is None:
            self._drop_before(end_ms - KEEP_IDLE_MS)
            return []
        self._drop_before(self._utt_start_ms)
        if end_ms - self._utt_start_ms < MAX_UTTERANCE_MS:
            return []
        # A monologue (or endless noise): hand over what we have and start afresh.
        pcm, packets = self.take_all()
        return [Mark("stopped", pcm, MAX_UTTERANCE_MS, packets)]

    def _drop_before(self, ms: float) -> None:
        count = int((ms - self._buf_start_ms) * BYTES_PER_MS) & ~1
        if count > 0:
            del self._buf[:count]
            self._buf_start_ms += count / BYTES_PER_MS
            if self.trail is not None:
                self.trail.drop_before(int(self._buf_start_ms * BYTES_PER_MS))


@dataclass
class EarJob:
    """One session's batch of packets for the pool."""

    ear: Ear
    packets: list[bytes]
    endpointing: bool  # False in manual mode: buffer only, `listen stop` ends the utterance
    stamps: list[int] | None = None  # v2 uplink timestamps, one per packet (server AEC)


@dataclass(frozen=True)
class HearingBatch:
    """The BatchRunner (cpu_pool.py) of every session using `vad`: one per VAD provider,
    equal for equal providers, so the jobs of all those sessions share one call."""

    vad: VAD

    def run_batch(self, jobs: list[EarJob]) -> list[Outcome]:
        """Decode every job's packets, run the VAD for all of them at once, then endpoint each
        session. A job's failure is its own; a failed VAD run fails the jobs that needed it
        (their sessions log it and go on with the next batch). A job's value is
        (marks, packets that would not decode)."""
        outcomes: list[Outcome] = [(None, None)] * len(jobs)
        heard: dict[int, bytes] = {}
        for i, job in enumerate(jobs):
            try:
                pcm, invalid = job.ear.hear(job.packets, job.endpointing, job.stamps)
            except Exception as exc:
                outcomes[i] = (None, exc)
                continue
            outcomes[i] = (([], invalid), None)
            if job.endpointing:
                heard[i] = pcm
        work: list[tuple[Any, bytes]] = []
        for i, pcm in heard.items():
            work.append((jobs[i].ear.vad_stream, pcm))
        try:
            probs = self.vad.probabilities(work)
        except Exception as exc:
            return [(None, exc) if i in heard else outcome for i, outcome in enumerate(outcomes)]
        for i, p in zip(heard, probs, strict=True):
            outcomes[i] = ((jobs[i].ear.endpoint(p), outcomes[i][0][1]), None)
        return outcomes


# -- the detector: probabilities in, speech started/stopped out ------------------------------

SPEECH_STARTED = "speech_started"
SPEECH_STOPPED = "speech_stopped"


@dataclass(frozen=True)
class VADEvent:
    """An endpointing decision; all times are ms of audio since the detector's last reset.

    `at_ms` is when the decision could be made (end of the deciding window). `speech_start_ms`
    is the start of the first voiced window of the utterance, so callers can keep pre-roll
    from there. `speech_end_ms` (stop events only) is the end of the last voiced window.
    """

    kind: str
    at_ms: float
    speech_start_ms: float
    speech_end_ms: float | None = None


class VADDetector:
    """Dual-threshold endpointing over per-window probabilities (protocol-reference §9).

    - A window is voiced if prob >= `threshold`, unvoiced if prob <= `threshold_low`, and in
      between keeps the previous window's verdict (hysteresis against flicker).
    - "Have voice" = at least `min_voiced` of the last `history` windows are voiced.
    - Speech starts when "have voice" holds and the utterance (from its first voiced window)
      is at least `min_speech_ms` long; stops when "have voice" has been false for
      `min_silence_ms` since it was last true.
    """

    def __init__(
        self,
        threshold: float = 0.5,
        threshold_low: float = 0.3,
        min_silence_ms: float = 200.0,
        min_speech_ms: float = 0.0,
        *,
        window_ms: float = 32.0,
        history: int = 5,
        min_voiced: int = 3,
    ) -> None:
        if not 0.0 <= threshold_low <= threshold <= 1.0:
            raise ValueError("need 0 <= threshold_low <= threshold <= 1")
        if not 1 <= min_voiced <= history:
            raise ValueError("need 1 <= min_voiced <= history")
        self.threshold, self.threshold_low = threshold, threshold_low
        self.min_silence_ms, self.min_speech_ms = min_silence_ms, min_speech_ms
        self.window_ms, self.min_voiced = window_ms, min_voiced
        self._recent: deque[bool] = deque(maxlen=history)
        self.reset()

    def reset(self) -> None:
        self._recent.clear()
        self._windows = 0
        self._voiced = False
        self.in_speech = False
        self._start_ms: float | None = None  # first voiced window of the current candidate
        self._last_voiced_end_ms = 0.0  # end of the last individually voiced window
        self._last_have_voice_ms = 0.0  # last time the majority said "voice"

    @property
    def has_candidate(self) -> bool:
        """Voiced windows are building up to a start (or an utterance is running)."""
        return self._start_ms is not None

    @property
    def position_ms(self) -> float:
        """Audio consumed so far."""
        return self._windows * self.window_ms

    def feed(self, probabilities: list[float]) -> list[VADEvent]:
        """Consume window probabilities in order; return the events they caused."""
        events: list[VADEvent] = []
        for prob in probabilities:
            event = self._step(prob)
            if event is not None:
                events.append(event)
        return events

    def _step(self, prob: float) -> VADEvent | None:
        window_start = self._windows * self.window_ms  # position_ms, without a call per window
        self._windows += 1
        now = self._windows * self.window_ms
        if prob >= self.threshold:
            self._voiced = True
        elif prob <= self.threshold_low:
            self._voiced = False
        self._recent.append(self._voiced)
        have_voice = sum(self._recent) >= self.min_voiced
        if have_voice:
            self._last_have_voice_ms = now
        # Stop is judged before this window is credited to the utterance, so a voiced window
        # that arrives as the silence timer expires starts the next candidate instead.
        event = self._stopped(now, have_voice) if self.in_speech else None
        if self._voiced:
            self._last_voiced_end_ms = now
            if self._start_ms is None:
                self._start_ms = window_start
        if not self.in_speech and event is None:
            event = self._started(now, have_voice)
        return event

    def _started(self, now: float, have_voice: bool) -> VADEvent | None:
        if not any(self._recent):
            self._start_ms = None  # the candidate died out before it was long enough
            return None
        if not have_voice or self._start_ms is None:
            return None
        if self._last_voiced_end_ms - self._start_ms < self.min_speech_ms:
            return None
        self.in_speech = True
        return VADEvent(SPEECH_STARTED, now, self._start_ms)

    def force_stop(self) -> VADEvent:
        """End the current utterance now (the end-of-turn model said it is complete)."""
        start = self._start_ms if self._start_ms is not None else 0.0
        self.in_speech = False
        self._start_ms = None
        self._recent.clear()  # the next utterance needs voice of its own to start
        return VADEvent(SPEECH_STOPPED, self.position_ms, start, self._last_voiced_end_ms)

    def _stopped(self, now: float, have_voice: bool) -> VADEvent | None:
        if have_voice or now - self._last_have_voice_ms < self.min_silence_ms:
            return None
        start = self._start_ms if self._start_ms is not None else 0.0
        self.in_speech = False
        self._start_ms = None
        return VADEvent(SPEECH_STOPPED, now, start, self._last_voiced_end_ms)
