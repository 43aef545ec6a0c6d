from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conversations.pipeline.endpointing import SPEECH_STARTED, SPEECH_STOPPED, VADDetector, VADEvent
from conversations.providers import registry
from conversations.providers.base import VAD, ProviderError
from conversations.providers.turn.smart_turn import SmartTurn
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


def test_the_weights_load_once_per_vad_and_are_shared_by_every_thread() -> None:
    vad = SileroVAD()
    vad.stream().probabilities(bytes(3200))
    first = vad.network()
    with ThreadPoolExecutor(2) as pool:
        seen = set(pool.map(lambda _: id(vad.network()), range(4)))
    assert seen == {id(first)}


def test_a_file_that_is_not_the_silero_model_is_a_provider_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model at all")
    other = tmp_path / "other.onnx"  # a real ONNX file, but not Silero's: Smart Turn's
    other.write_bytes(SmartTurn().path.read_bytes())
    for path in (garbage, other, tmp_path / "missing.onnx"):
        with pytest.raises(ProviderError, match="cannot load Silero VAD model"):
            SileroVAD(path=path).stream().probabilities(bytes(3200))


def onnxruntime_reference(vad: SileroVAD, clips: list[np.ndarray]) -> list[list[float]]:
    """Silero's own graph through onnxruntime, the same file, a window at a time per clip."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(vad.path), providers=["CPUExecutionProvider"])
    out = []
    for clip in clips:
        state = np.zeros((2, 1, 128), dtype=np.float32)
        context = np.zeros(64, dtype=np.float32)
        probs = []
        for start in range(0, len(clip) - 511, 512):
            window = np.concatenate([context, clip[start : start + 512]])[None, :]
            prob, state = session.run(None, {"input": window, "state": state, "sr": np.array(16000)})
            context = window[0, -64:]
            probs.append(float(prob[0, 0]))
        out.append(probs)
    return out


def test_our_graphs_give_the_probabilities_of_silero_own_graph_on_the_same_file(utterance: bytes) -> None:
    """Speech, room noise and a loud tone, three sessions in the same calls, 60 ms packets."""
    rng = np.random.default_rng(11)
    speech = np.frombuffer(utterance, dtype="<i2")
    noise = (rng.standard_normal(len(speech)) * 900).astype("<i2")
    tone = (np.sin(np.arange(len(speech)) * 2 * np.pi * 440 / 16000) * 20000).astype("<i2")
    clips = [speech, noise, tone]
    vad = SileroVAD()
    vad.SILENCE_PEAK = 0.0  # the model itself, without the silence gate
    streams = [vad.stream() for _ in clips]
    got: list[list[float]] = [[] for _ in clips]
    for start in range(0, len(speech), 960):
        work = [(s, c[start : start + 960].tobytes()) for s, c in zip(streams, clips, strict=True)]
        for out, probs in zip(got, vad.probabilities(work), strict=True):
            out.extend(probs)
    want = onnxruntime_reference(vad, [c.astype(np.float32) / 32768.0 for c in clips])
    for have, expected in zip(got, want, strict=True):
        assert len(have) == len(expected) == len(speech) // 512
        assert np.allclose(have, expected, atol=1e-5)
    assert max(want[0]) > 0.9 and max(want[1]) < 0.5  # the clips test both ends of the scale


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


def test_settled_digital_silence_skips_the_lstm_and_speech_after_it_is_still_heard(utterance: bytes) -> None:
    vad = SileroVAD()
    stepped: list[int] = []
    counting = _Counting(SileroVAD.network(vad), stepped)
    vad.network = lambda: counting  # type: ignore[method-assign,assignment,return-value]
    twice = utterance + utterance  # zeros, speech, zeros, zeros, speech, zeros
    stream = vad.stream()
    probs = [p for i in range(0, len(twice), 1920) for p in stream.probabilities(twice[i : i + 1920])]
    assert len(probs) == len(twice) // 2 // 512
    assert sum(stepped) < len(probs) * 0.6  # the silences past the first windows cost no step
    gated = [i for i, p in enumerate(probs) if p == 0.0]
    assert gated and all(p < 0.5 for p in probs[: gated[0]])
    half = len(probs) // 2
    assert max(probs[:half]) > 0.9 and max(probs[half:]) > 0.9  # both utterances heard


class _Counting:
    def __init__(self, network: object, stepped: list[int]) -> None:
        self._network, self._stepped = network, stepped

    def __getattr__(self, name: str) -> object:
        return getattr(self._network, name)

    def step(self, projected: np.ndarray, states: np.ndarray) -> object:
        self._stepped.append(len(projected))
        return self._network.step(projected, states)  # type: ignore[attr-defined]


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


@pytest.mark.filterwarnings("error")  # an overflow in the network's exp/sqrt would be a warning
def test_full_scale_hostile_audio_gives_finite_probabilities_without_warnings() -> None:
    rng = np.random.default_rng(5)
    t = np.arange(16000 * 2)
    loud = {
        "square": np.sign(np.sin(t * 2 * np.pi * 300 / 16000)) * 32767,
        "noise": rng.integers(-32768, 32768, t.size),
        "dc": np.full(t.size, -32768),
        "clicks": np.where(t % 97 == 0, 32767, 0),
    }
    for name, samples in loud.items():
        probs = silero_stream().probabilities(samples.astype("<i2").tobytes())
        assert len(probs) == t.size // 512, name
        assert all(0.0 <= p <= 1.0 for p in probs), name


# --- start-up: the worker loads the VAD before the first device ---------------------------


def test_preloading_the_hearing_loads_the_sessions_vad_and_survives_one_that_cannot_load(
        caplog: pytest.LogCaptureFixture) -> None:
    from conversations.pipeline.engine import preload_hearing

    preload_hearing()
    assert registry.shared("vad", "silero")._network is not None  # the instance every session shares
    with caplog.at_level("WARNING"):
        preload_hearing("no-such-vad")
    assert "the VAD could not be loaded at start-up" in caplog.text


def test_a_web_worker_has_the_vads_weights_once_its_application_is_imported() -> None:
    import subprocess

    script = (
        "import os\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'xiaozhi_site.settings')\n"
        "import xiaozhi_site.asgi\n"
        "from conversations.providers import registry\n"
        "print(registry.shared('vad', 'silero')._network is not None)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.strip().splitlines()[-1:] == ["True"], done.stderr[-2000:]
