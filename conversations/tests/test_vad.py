from __future__ import annotations

import sys

import numpy as np
import pytest

from conversations.pipeline.endpointing import SPEECH_STARTED, SPEECH_STOPPED, VADDetector, VADEvent
from conversations.providers import registry
from conversations.providers.base import VAD
from conversations.providers.vad.silero import SileroStream, SileroVAD
from devices.protocol.opus import OpusDecoder
from testing.speech import opus_packets, speak, with_silence

W = 32.0  # ms per 512-sample window at 16 kHz


def kinds(events: list[VADEvent]) -> list[str]:
    return [e.kind for e in events]


# --- VADDetector: pure logic on synthetic probabilities -------------------------------


def test_silence_produces_no_events() -> None:
    assert VADDetector().feed([0.01] * 100) == []


def test_speech_starts_on_a_majority_of_voiced_windows_and_stops_after_min_silence() -> None:
    detector = VADDetector(threshold=0.5, threshold_low=0.3, min_silence_ms=200)
    events = detector.feed([0.9] * 10 + [0.05] * 20)
    assert kinds(events) == [SPEECH_STARTED, SPEECH_STOPPED]
    started, stopped = events
    assert started.at_ms == 3 * W  # third voiced window of five makes the majority
    assert started.speech_start_ms == 0.0
    # Majority lasts until window 12 (two unvoiced in the last five), then 200 ms more.
    assert stopped.at_ms == 19 * W
    assert stopped.speech_end_ms == 10 * W
    assert stopped.speech_start_ms == 0.0
    assert not detector.in_speech


def test_probabilities_between_thresholds_keep_the_previous_verdict() -> None:
    detector = VADDetector(threshold=0.5, threshold_low=0.3, min_silence_ms=200)
    assert kinds(detector.feed([0.9] * 5 + [0.4] * 30)) == [SPEECH_STARTED]
    assert detector.in_speech
    assert kinds(detector.feed([0.29] * 12)) == [SPEECH_STOPPED]


def test_in_between_probabilities_never_start_speech_from_silence() -> None:
    assert VADDetector(threshold=0.5, threshold_low=0.3).feed([0.45] * 50) == []


def test_a_pause_shorter_than_min_silence_does_not_end_the_utterance() -> None:
    detector = VADDetector(min_silence_ms=300)
    events = detector.feed([0.9] * 10 + [0.1] * 8 + [0.9] * 10 + [0.1] * 20)
    assert kinds(events) == [SPEECH_STARTED, SPEECH_STOPPED]
    assert events[1].speech_end_ms == 28 * W


def test_a_longer_pause_splits_two_utterances() -> None:
    detector = VADDetector(min_silence_ms=200)
    events = detector.feed([0.9] * 10 + [0.1] * 20 + [0.9] * 10 + [0.1] * 20)
    assert kinds(events) == [SPEECH_STARTED, SPEECH_STOPPED, SPEECH_STARTED, SPEECH_STOPPED]
    assert events[2].speech_start_ms == 30 * W


def test_min_speech_ms_ignores_short_blips() -> None:
    detector = VADDetector(min_speech_ms=250)
    assert detector.feed([0.9] * 4 + [0.1] * 20) == []
    events = detector.feed([0.9] * 12)
    assert kinds(events) == [SPEECH_STARTED]
    assert events[0].at_ms - events[0].speech_start_ms >= 250


def test_reset_forgets_position_and_state() -> None:
    detector = VADDetector()
    detector.feed([0.9] * 10)
    detector.reset()
    assert not detector.in_speech
    assert detector.position_ms == 0.0
    assert detector.feed([0.1] * 20) == []


def test_inconsistent_thresholds_are_rejected() -> None:
    with pytest.raises(ValueError):
        VADDetector(threshold=0.3, threshold_low=0.5)
    with pytest.raises(ValueError):
        VADDetector(history=3, min_voiced=4)


# --- Silero model on real audio -------------------------------------------------------


@pytest.fixture(scope="module")
def utterance() -> bytes:
    """1 s silence, espeak "turn on the kitchen light" (~1.5 s), 1 s silence at 16 kHz."""
    return with_silence(speak("turn on the kitchen light", rate=16000), 16000, 1000, 1000)


def silero_stream() -> SileroStream:
    return registry.shared("vad", "silero").stream()  # type: ignore[no-any-return]


def test_torch_is_never_imported() -> None:
    silero_stream().probabilities(bytes(16000))
    assert "torch" not in sys.modules
    assert "silero_vad" not in sys.modules


def test_the_vad_is_registered_and_shared_per_process() -> None:
    vad = registry.shared("vad", "silero")
    assert vad is registry.shared("vad", "silero") and isinstance(vad, SileroVAD) and isinstance(vad, VAD)
    assert registry.shared("vad", "silero", path=str(vad.path)) is not vad  # other options: its own


def test_each_thread_loads_the_model_once() -> None:
    vad = SileroVAD()
    vad.stream().probabilities(bytes(3200))
    first = vad._session()
    vad.stream().probabilities(bytes(3200))
    assert vad._session() is first


def test_speech_from_device_packets_starts_and_stops_at_plausible_times(utterance: bytes) -> None:
    stream, detector, decoder = silero_stream(), VADDetector(), OpusDecoder(16000)
    events = []
    for packet in opus_packets(utterance):  # the real uplink path: Opus 60 ms -> 16 kHz PCM
        events += detector.feed(stream.probabilities(decoder.decode(packet)))
    assert kinds(events) == [SPEECH_STARTED, SPEECH_STOPPED]
    started, stopped = events
    assert 950 <= started.speech_start_ms <= 1300
    assert started.at_ms <= 1500  # detected within a few windows of onset
    assert 2200 <= stopped.speech_end_ms <= 2700
    assert stopped.at_ms - stopped.speech_end_ms <= 600


def test_chunking_does_not_change_the_probabilities(utterance: bytes) -> None:
    whole = silero_stream().probabilities(utterance)
    chunked_stream = silero_stream()
    chunked = [
        p
        for i in range(0, len(utterance), 1000)
        for p in chunked_stream.probabilities(utterance[i : i + 1000])
    ]
    assert len(chunked) == len(whole) == len(utterance) // 2 // 512
    assert np.allclose(chunked, whole, atol=1e-5)


def test_reset_restarts_the_recurrent_state(utterance: bytes) -> None:
    stream = silero_stream()
    first = stream.probabilities(utterance[:32000])
    stream.reset()
    assert np.allclose(stream.probabilities(utterance[:32000]), first, atol=1e-6)


def test_silence_and_low_level_noise_are_not_speech() -> None:
    rng = np.random.default_rng(7)
    hiss = (rng.standard_normal(16000 * 3) * 150).astype("<i2").tobytes()
    hum = (np.sin(np.arange(16000 * 3) * 2 * np.pi * 50 / 16000) * 300).astype("<i2").tobytes()
    for audio in (bytes(16000 * 3 * 2), hiss, hum):
        probs = silero_stream().probabilities(audio)
        assert max(probs) < 0.5
        assert VADDetector().feed(probs) == []
