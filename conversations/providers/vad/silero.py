"""Silero VAD v6, batched across sessions: the production VAD provider.

`SileroVAD` holds the network (one per process and model file: the pipeline gets it through
`registry.shared("vad", "silero")`, so the windows of every session share matrix products);
each session has a `SileroStream` with its own recurrent state, the 64-sample context and
the samples not yet forming a 512-sample window.

The weights are Silero's own, read with `onnx` from the 16 kHz export in the silero-vad
package; the network (an STFT, four 1-D convolutions, an LSTM cell, a 1x1 convolution) runs
as numpy matrix products. Not onnxruntime, measured (docs/performance.md, session 26): its
1-D Conv runs one small GEMM per batch item (4 time steps wide), so 32 windows in one run
still cost ~75 us each on the 2-core box, and every run is sequential in the windows of a
stream. Here the STFT and the convolutions have no recurrence, so every window of every
session in a call is one product of (windows x 4 steps) rows (~27 us a window at 32); only
the LSTM cell steps window by window. Probabilities equal onnxruntime's on the same file
within 1e-5 (tested). Digital silence (DTX packets decode to +-1) is probability 0 without
the LSTM step once the model itself has settled on silence, so the end of speech keeps its
smoothing.

The `silero_vad` package is never imported: its `__init__` imports torch (which we do not
ship) and calls `torch.set_num_threads(1)` globally. We only borrow its ONNX file.
"""
from __future__ import annotations

import importlib.util
import itertools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from conversations.providers.base import ProviderError

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 512  # what the 16 kHz model expects (32 ms)
CONTEXT_SAMPLES = 64  # tail of the previous window prepended to each input, as silero does
WINDOW_MS = WINDOW_SAMPLES * 1000 / SAMPLE_RATE
_WINDOW_BYTES = 2 * WINDOW_SAMPLES
MODEL_FILE = "silero_vad_16k_op15.onnx"  # the 16 kHz export: its weights are plain initializers
_HOP = 128  # the STFT's hop; its frame is two hops (256 samples)
_REFLECT = 64  # the STFT pads the right edge by reflection
_HIDDEN = 128


def default_model_path() -> Path:
    """Locate the model file in `silero_vad/data/` without executing the package."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ProviderError("silero-vad is not installed (pip install --no-deps silero-vad)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / MODEL_FILE
    if not path.is_file():
        raise ProviderError(f"Silero VAD model file not found: {path}")
    return path


class SileroStream:
    """One session's Silero state. Used by one pool job at a time (its session awaits each)."""

    def __init__(self, vad: SileroVAD) -> None:
        self._vad = vad
        self.reset()

    def reset(self) -> None:
        """Forget the audio so far (new `listen start`)."""
        self.state = np.zeros((2, _HIDDEN), dtype=np.float32)  # the LSTM's h and c
        self.context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self.leftover = b""
        self.last = 1.0  # last probability the model gave

    def windows(self, pcm16k: bytes) -> np.ndarray:
        """The complete windows in `pcm16k` (plus earlier leftover), s16, shape (n, 512)."""
        if len(pcm16k) % 2:
            raise ValueError(f"PCM length {len(pcm16k)} is not a whole number of s16 samples")
        samples = self.leftover + pcm16k if self.leftover else bytes(pcm16k)  # (no copy of bytes)
        count = len(samples) // _WINDOW_BYTES
        self.leftover = samples[count * _WINDOW_BYTES :]
        return np.frombuffer(samples, dtype="<i2", count=count * WINDOW_SAMPLES).reshape(count, WINDOW_SAMPLES)

    def probabilities(self, pcm16k: bytes) -> list[float]:
        """This stream alone: a probability per complete window (blocking)."""
        return self._vad.probabilities([(self, pcm16k)])[0]


@dataclass(frozen=True)
class _Conv:
    weight: np.ndarray  # (3 * in channels, out channels): the kernel's taps side by side
    bias: np.ndarray
    stride: int


@dataclass(frozen=True)
class Network:
    """Silero's weights, laid out for row-major matrix products."""

    stft: np.ndarray  # (256, 258): real parts then imaginary parts
    encoder: tuple[_Conv, ...]
    lstm_input: np.ndarray  # (128, 512), gates reordered i, f, o, g (three sigmoids in one call)
    lstm_hidden: np.ndarray  # (128, 512), the same order
    lstm_bias: np.ndarray
    out: np.ndarray  # (128,)
    out_bias: float

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        """(n, 64 + 512) samples -> (n, 128) features; windows are independent here."""
        count = len(inputs)
        padded = np.concatenate([inputs, inputs[:, -2 : -2 - _REFLECT : -1]], axis=1)  # torch's reflect
        hops = padded.reshape(count, -1, _HOP)
        frames = np.concatenate([hops[:, :-1], hops[:, 1:]], axis=2)  # (n, 4, 256)
        steps = frames.shape[1]
        spectrum = frames.reshape(count * steps, 2 * _HOP) @ self.stft
        spectrum *= spectrum
        half = spectrum.shape[1] // 2
        features = np.sqrt(spectrum[:, :half] + spectrum[:, half:]).reshape(count, steps, half)
        for conv in self.encoder:
            features = _convolve(features, conv)
        return features[:, 0, :]

    def project(self, features: np.ndarray) -> np.ndarray:
        """The LSTM's input half for every window at once: it has no recurrence."""
        projected = features @ self.lstm_input
        projected += self.lstm_bias
        return projected

    def step(self, projected: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One window per row: (b, 512) projected features and (b, 2, 128) states ->
        probabilities (b,) and the new states."""
        gates = states[:, 0] @ self.lstm_hidden
        gates += projected
        sigmoids = _sigmoid(gates[:, : 3 * _HIDDEN])
        i, f, o = (sigmoids[:, k * _HIDDEN : (k + 1) * _HIDDEN] for k in range(3))
        cell = f * states[:, 1] + i * np.tanh(gates[:, 3 * _HIDDEN :])
        hidden = o * np.tanh(cell)
        probability = _sigmoid(np.maximum(hidden, 0) @ self.out + self.out_bias)
        return probability, np.stack([hidden, cell], axis=1)


def _convolve(x: np.ndarray, conv: _Conv) -> np.ndarray:
    """Conv1d (kernel 3, padding 1) + ReLU on (n, steps, channels), as one 2-D product."""
    count, steps, channels = x.shape
    padded = np.zeros((count, steps + 2, channels), dtype=np.float32)
    padded[:, 1:-1] = x
    out_steps = (steps - 1) // conv.stride + 1
    span = conv.stride * (out_steps - 1) + 1
    taps = np.concatenate([padded[:, k : k + span : conv.stride] for k in range(3)], axis=2)
    y = taps.reshape(count * out_steps, 3 * channels) @ conv.weight
    y += conv.bias
    np.maximum(y, 0, out=y)
    return y.reshape(count, out_steps, -1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class SileroVAD:
    """The VAD provider (providers/base.py `VAD`): 16 kHz s16 mono in, one speech
    probability per 32 ms window out, for many streams per call."""

    name = "silero"
    window_ms = WINDOW_MS
    SILENCE_PEAK = 0.002  # float samples, about -54 dBFS (65 in s16 units)
    SETTLED = 0.1  # below any sensible threshold_low

    def __init__(self, path: str | Path | None = None, **_: Any) -> None:
        self.path = Path(path) if path else default_model_path()
        self._network: Network | None = None
        self._loading = threading.Lock()

    def stream(self) -> SileroStream:
        return SileroStream(self)

    def network(self) -> Network:
        """The weights, read with the first window (pool threads share them, read-only)."""
        if self._network is None:
            with self._loading:
                if self._network is None:
                    self._network = load_network(self.path)
        return self._network

    def probabilities(self, work: list[tuple[SileroStream, bytes]]) -> list[list[float]]:
        """Probabilities per stream for its new audio, in order; advances every stream.

        Every window that may need the model goes through the encoder in one product; then
        step k runs the LSTM for the k-th window of every stream that has one.
        (Flat arrays and plain loops: this runs for every packet of every session.)"""
        streams = [stream for stream, _ in work]
        found = [stream.windows(pcm) for stream, pcm in work]
        counts = [len(mine) for mine in found]
        probs: list[list[float]] = [[] for _ in work]
        if not any(counts):
            return probs
        windows = np.concatenate(found, dtype=np.float32)
        windows *= 1 / 32768  # full scale is 1.0, as the model was trained
        quiet = (np.abs(windows).max(axis=1) < self.SILENCE_PEAK).tolist()
        inputs = np.empty((len(windows), CONTEXT_SAMPLES + WINDOW_SAMPLES), dtype=np.float32)
        inputs[:, CONTEXT_SAMPLES:] = windows
        inputs[1:, :CONTEXT_SAMPLES] = windows[:-1, -CONTEXT_SAMPLES:]  # the window before, mostly
        firsts = [0, *itertools.accumulate(counts)][:-1]  # each stream's first window in the flat array
        for stream, count, first in zip(streams, counts, firsts, strict=True):
            if count:
                inputs[first, :CONTEXT_SAMPLES] = stream.context  # its own context
        encoded = self._needed(streams, counts, firsts, quiet)
        network = self.network()
        projected = network.project(network.encode(inputs[encoded])) if encoded else None
        row_of = {flat: row for row, flat in enumerate(encoded)}
        for k in range(max(counts)):
            stepping: list[int] = []
            for i, count in enumerate(counts):
                if count <= k:
                    continue
                if quiet[firsts[i] + k] and streams[i].last < self.SETTLED:
                    probs[i].append(0.0)  # settled digital silence: no step, the state stays
                else:
                    stepping.append(i)
            if stepping:
                assert projected is not None
                rows = [row_of[firsts[i] + k] for i in stepping]
                self._step(network, stepping, projected[rows], streams, probs)
        for i, stream in enumerate(streams):
            if counts[i]:
                stream.context = windows[firsts[i] + counts[i] - 1, -CONTEXT_SAMPLES:].copy()
        return probs

    def _needed(
        self, streams: list[SileroStream], counts: list[int], firsts: list[int], quiet: list[bool]
    ) -> list[int]:
        """The windows that may need a step. A stream's leading quiet windows are skipped while
        it has settled; a quiet window after a loud one may still need its step (that depends
        on the loud one's probability), so it is encoded."""
        needed: list[int] = []
        for stream, count, first in zip(streams, counts, firsts, strict=True):
            skipping = stream.last < self.SETTLED
            for flat in range(first, first + count):
                skipping = skipping and quiet[flat]
                if not skipping:
                    needed.append(flat)
        return needed

    @staticmethod
    def _step(
        network: Network, stepping: list[int], projected: np.ndarray, streams: list[SileroStream],
        probs: list[list[float]],
    ) -> None:
        states = np.stack([streams[i].state for i in stepping])
        probability, new_states = network.step(projected, states)
        for row, value in enumerate(probability.tolist()):
            stream = streams[stepping[row]]
            stream.state = new_states[row]
            stream.last = value
            probs[stepping[row]].append(value)


_WEIGHTS = (
    "model.stft.forward_basis_buffer",
    *(f"model.encoder.{n}.reparam_conv.{part}" for n in range(4) for part in ("weight", "bias")),
    "model.decoder.rnn.weight_ih",
    "model.decoder.rnn.weight_hh",
    "model.decoder.rnn.bias_ih",
    "model.decoder.rnn.bias_hh",
    "model.decoder.decoder.2.weight",
    "model.decoder.decoder.2.bias",
)
_STRIDES = (1, 2, 2, 1)
# PyTorch's gate rows are i, f, g, o; i, f, o first lets one sigmoid call cover three gates
_GATES = np.r_[0 : 2 * _HIDDEN, 3 * _HIDDEN : 4 * _HIDDEN, 2 * _HIDDEN : 3 * _HIDDEN]


def load_network(path: Path) -> Network:
    """Read Silero's weights from its ONNX file; a file of another shape is a ProviderError."""
    import onnx  # noqa: PLC0415 - loaded with the first VAD window
    from onnx import numpy_helper  # noqa: PLC0415

    try:
        graph = onnx.load(str(path)).graph
        found = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in graph.initializer}
        missing = [name for name in _WEIGHTS if name not in found]
        if missing:
            raise ValueError(f"not the 16 kHz Silero VAD v5/v6 export (missing {missing[0]})")
        network = _network(found)
    except Exception as exc:  # onnx raises its own untyped errors for bad files
        raise ProviderError(f"cannot load Silero VAD model {path}: {exc}") from exc
    _single_threaded_blas()
    logger.info("silero vad model loaded", extra={"path": str(path)})
    return network


def _network(w: dict[str, np.ndarray]) -> Network:
    def conv(n: int) -> _Conv:
        weight = w[f"model.encoder.{n}.reparam_conv.weight"]  # (out, in, 3)
        taps = weight.transpose(2, 1, 0).reshape(-1, weight.shape[0])
        return _Conv(np.ascontiguousarray(taps), w[f"model.encoder.{n}.reparam_conv.bias"], _STRIDES[n])

    rnn = "model.decoder.rnn."
    out = w["model.decoder.decoder.2.weight"]
    network = Network(
        stft=np.ascontiguousarray(w["model.stft.forward_basis_buffer"][:, 0, :].T),
        encoder=tuple(conv(n) for n in range(4)),
        lstm_input=np.ascontiguousarray(w[rnn + "weight_ih"][_GATES].T),
        lstm_hidden=np.ascontiguousarray(w[rnn + "weight_hh"][_GATES].T),
        lstm_bias=(w[rnn + "bias_ih"] + w[rnn + "bias_hh"])[_GATES],
        out=np.ascontiguousarray(out.reshape(-1)),
        out_bias=float(w["model.decoder.decoder.2.bias"][0]),
    )
    probe = network.encode(np.zeros((1, CONTEXT_SAMPLES + WINDOW_SAMPLES), dtype=np.float32))
    # weights of other shapes raise here, not with the first session's audio
    network.step(network.project(probe), np.zeros((1, 2, _HIDDEN), dtype=np.float32))
    return network


def _single_threaded_blas() -> None:
    """The products are small and every pool thread runs its own: BLAS threads of their own
    would only spin against the event loop and the other pool threads."""
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    threadpool_limits(limits=1, user_api="blas")
