"""Silero VAD v6, batched across sessions: the production VAD provider.

`SileroVAD` holds the network (one per process and model file: the pipeline gets it through
`registry.shared("vad", "silero")`, so the windows of every session share matrix products);
each session has a `SileroStream` with its own recurrent state, the 64-sample context and
the samples not yet forming a 512-sample window.

The weights are Silero's own, read with `onnx` from the 16 kHz export in the silero-vad
package. The network (an STFT, four 1-D convolutions, an LSTM cell, a 1x1 convolution) runs as
two small onnxruntime graphs of matrix products that we build from those weights (`Network`),
not as Silero's own graph: its 1-D Conv runs one small GEMM per batch item (4 time steps
wide), so 32 windows in one run still cost ~75 us each on the 2-core box, and every run is
sequential in the windows of a stream. Here the STFT and the convolutions have no recurrence,
so every window of every session in a call is one product of (windows x 4 steps) rows; only
the LSTM cell steps window by window, every session's k-th window in one run. (Session 26 ran
the same products in numpy; each numpy call over more than ~500 numbers gives the interpreter
lock up, ~100 times a group, and beside a busy event loop each costs a wait to take it back.)
Probabilities equal onnxruntime's on Silero's own graph within 1e-5 (tested). Digital silence
(DTX packets decode to +-1) is probability 0 without the LSTM step once the model itself has
settled on silence, so the end of speech keeps its smoothing.

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

from conversations.providers.base import ProviderError, onnx_session

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

    def windows(self, pcm16k: bytes) -> tuple[bytes, int]:
        """The complete windows in `pcm16k` (plus earlier leftover): their s16 bytes and count.
        (Bytes, not arrays: a call joins every stream's into one array with one copy.)"""
        if len(pcm16k) % 2:
            raise ValueError(f"PCM length {len(pcm16k)} is not a whole number of s16 samples")
        samples = self.leftover + pcm16k if self.leftover else bytes(pcm16k)  # (no copy of bytes)
        count = len(samples) // _WINDOW_BYTES
        self.leftover = samples[count * _WINDOW_BYTES :]
        return (samples[: count * _WINDOW_BYTES] if self.leftover else samples), count

    def probabilities(self, pcm16k: bytes) -> list[float]:
        """This stream alone: a probability per complete window (blocking)."""
        return self._vad.probabilities([(self, pcm16k)])[0]


@dataclass(frozen=True)
class _Conv:
    weight: np.ndarray  # (3 * in channels, out channels): the kernel's taps side by side
    bias: np.ndarray
    stride: int


@dataclass(frozen=True)
class Weights:
    """Silero's weights, laid out for row-major matrix products on s16-scale samples."""

    stft: np.ndarray  # (256, 258): real parts then imaginary parts, times 1 / 32768
    encoder: tuple[_Conv, ...]
    lstm_input: np.ndarray  # (128, 512), gates reordered i, f, o, g (three sigmoids in one node)
    lstm_hidden: np.ndarray  # (128, 512), the same order
    lstm_bias: np.ndarray
    out: np.ndarray  # (128,)
    out_bias: float


class Network:
    """Silero's network as two small onnxruntime graphs of matrix products, built from `Weights`.

    - `features`: (n, 64 + 512) samples -> (n, 512), the STFT, the four convolutions and the
      LSTM's input half for every window at once (none of it is recurrent).
    - `step`: one LSTM step for a window per row, and the output layer.

    Each is one `run`, so a group of sessions gives the interpreter lock up once per graph, not
    at every numpy product and ufunc (~100 times for 24 packets): beside a busy event loop each
    give-up costs a wait for the lock (bench/hearing_gil.py). Sessions are safe to run from
    several pool threads at once."""

    def __init__(self, weights: Weights) -> None:
        self._features = onnx_session(_features_graph(weights), threads=1)
        self._step = onnx_session(_step_graph(weights), threads=1)
        # weights of other shapes raise here, not with the first session's audio
        probe = self.features(np.zeros((1, CONTEXT_SAMPLES + WINDOW_SAMPLES), dtype=np.float32))
        self.step(probe, np.zeros((1, 2, _HIDDEN), dtype=np.float32))

    def features(self, inputs: np.ndarray) -> np.ndarray:
        return self._features.run(None, {"inputs": inputs})[0]  # type: ignore[no-any-return]

    def step(self, projected: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(b, 512) features and (b, 2, 128) states (h, c) -> probabilities (b,), new states."""
        probability, new_states = self._step.run(None, {"projected": projected, "states": states})
        return probability, new_states


class _Graph:
    """A few helpers over onnx.helper: nodes get numbered outputs, constants become initializers."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper  # noqa: PLC0415 - loaded with the weights

        self._helper, self._numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(self._numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, kind: str, *inputs: str, out: str | None = None, **attributes: Any) -> str:
        name = out or f"t{len(self.nodes)}"
        self.nodes.append(self._helper.make_node(kind, list(inputs), [name], **attributes))
        return name

    def slice(self, x: str, start: int, end: int, axis: int, step: int = 1) -> str:
        ints = [self.const([v], np.int64) for v in (start, end, axis, step)]
        return self.op("Slice", x, *ints)

    def model(self, name: str, inputs: list[tuple[str, list[int | None]]],
              outputs: list[tuple[str, list[int | None]]]) -> bytes:
        from onnx import TensorProto  # noqa: PLC0415

        h = self._helper
        graph = h.make_graph(
            self.nodes, name, [h.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs],
            [h.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in outputs], self.initializers)
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()  # type: ignore[no-any-return]


_END = 2**62  # "to the end" in a Slice


def _features_graph(w: Weights) -> bytes:
    g = _Graph()
    x = "inputs"  # (n, 576)
    padded = g.op("Concat", x, g.slice(x, -2, -2 - _REFLECT, 1, -1), axis=1)  # torch's reflect
    hops = g.op("Reshape", padded, g.const([0, -1, _HOP], np.int64))
    frames = g.op("Concat", g.slice(hops, 0, -1, 1), g.slice(hops, 1, _END, 1), axis=2)  # (n, 4, 256)
    spectrum = g.op("MatMul", frames, g.const(w.stft))
    power = g.op("Mul", spectrum, spectrum)
    half = w.stft.shape[1] // 2
    features = g.op("Sqrt", g.op("Add", g.slice(power, 0, half, 2), g.slice(power, half, _END, 2)))
    steps = 4
    for conv in w.encoder:  # Conv1d (kernel 3, padding 1) + ReLU as one product over the taps
        padded = g.op("Pad", features, g.const([0, 1, 0, 0, 1, 0], np.int64))
        out_steps = (steps - 1) // conv.stride + 1
        span = conv.stride * (out_steps - 1) + 1
        taps = g.op("Concat", *(g.slice(padded, k, k + span, 1, conv.stride) for k in range(3)), axis=2)
        features = g.op("Relu", g.op("Add", g.op("MatMul", taps, g.const(conv.weight)), g.const(conv.bias)))
        steps = out_steps
    first = g.op("Squeeze", g.slice(features, 0, 1, 1), g.const([1], np.int64))
    g.op("Add", g.op("MatMul", first, g.const(w.lstm_input)), g.const(w.lstm_bias), out="projected")
    return g.model("silero_features", [("inputs", [None, CONTEXT_SAMPLES + WINDOW_SAMPLES])],
                   [("projected", [None, 4 * _HIDDEN])])


def _step_graph(w: Weights) -> bytes:
    g = _Graph()
    hidden_in, cell_in = (g.op("Squeeze", g.slice("states", k, k + 1, 1), g.const([1], np.int64)) for k in range(2))
    gates = g.op("Add", g.op("MatMul", hidden_in, g.const(w.lstm_hidden)), "projected")
    sigmoids = g.op("Sigmoid", g.slice(gates, 0, 3 * _HIDDEN, 1))
    i, f, o = (g.slice(sigmoids, k * _HIDDEN, (k + 1) * _HIDDEN, 1) for k in range(3))
    candidate = g.op("Tanh", g.slice(gates, 3 * _HIDDEN, 4 * _HIDDEN, 1))
    cell = g.op("Add", g.op("Mul", f, cell_in), g.op("Mul", i, candidate))
    hidden = g.op("Mul", o, g.op("Tanh", cell))
    logit = g.op("Add", g.op("MatMul", g.op("Relu", hidden), g.const(w.out)), g.const(w.out_bias))
    g.op("Sigmoid", logit, out="probability")
    axis = g.const([1], np.int64)
    g.op("Concat", g.op("Unsqueeze", hidden, axis), g.op("Unsqueeze", cell, axis), axis=1, out="new_states")
    return g.model("silero_step", [("projected", [None, 4 * _HIDDEN]), ("states", [None, 2, _HIDDEN])],
                   [("probability", [None]), ("new_states", [None, 2, _HIDDEN])])


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

        Every window that may need the model goes through the encoder in one run; then step k
        runs the LSTM for the k-th window of every stream that has one. Samples stay on the s16
        scale (the 1 / 32768 is in the STFT's weights). Few numpy calls over whole arrays: each
        over more than ~500 numbers gives the interpreter lock up (see `Network`).
        (Flat arrays and plain loops: this runs for every packet of every session.)"""
        streams = [stream for stream, _ in work]
        found = [stream.windows(pcm) for stream, pcm in work]
        counts = [count for _, count in found]
        probs: list[list[float]] = [[] for _ in work]
        total = sum(counts)
        if not total:
            return probs
        raw = np.frombuffer(b"".join(chunk for chunk, _ in found), dtype="<i2").reshape(total, WINDOW_SAMPLES)
        peak = self.SILENCE_PEAK * 32768
        quiet = ((raw.max(axis=1) < peak) & (raw.min(axis=1) > -peak)).tolist()
        inputs = np.empty((total, CONTEXT_SAMPLES + WINDOW_SAMPLES), dtype=np.float32)
        inputs[:, CONTEXT_SAMPLES:] = raw
        inputs[1:, :CONTEXT_SAMPLES] = inputs[:-1, -CONTEXT_SAMPLES:]  # the window before, mostly
        firsts = [0, *itertools.accumulate(counts)][:-1]  # each stream's first window in the flat array
        for stream, count, first in zip(streams, counts, firsts, strict=True):
            if count:
                inputs[first, :CONTEXT_SAMPLES] = stream.context  # its own context
                stream.context = inputs[first + count - 1, -CONTEXT_SAMPLES:].copy()
        encoded = self._needed(streams, counts, firsts, quiet)
        network = self.network()
        projected = None
        if encoded:
            projected = network.features(inputs if len(encoded) == total else inputs[encoded])
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
        network = Network(_weights(found))
    except Exception as exc:  # onnx and onnxruntime raise their own untyped errors for bad files
        raise ProviderError(f"cannot load Silero VAD model {path}: {exc}") from exc
    logger.info("silero vad model loaded", extra={"path": str(path)})
    return network


def _weights(w: dict[str, np.ndarray]) -> Weights:
    def conv(n: int) -> _Conv:
        weight = w[f"model.encoder.{n}.reparam_conv.weight"]  # (out, in, 3)
        taps = weight.transpose(2, 1, 0).reshape(-1, weight.shape[0])
        return _Conv(np.ascontiguousarray(taps), w[f"model.encoder.{n}.reparam_conv.bias"], _STRIDES[n])

    rnn = "model.decoder.rnn."
    out = w["model.decoder.decoder.2.weight"]
    return Weights(
        # the model was trained on full scale 1.0; the STFT is linear, so it takes s16 as is
        stft=np.ascontiguousarray(w["model.stft.forward_basis_buffer"][:, 0, :].T / np.float32(32768)),
        encoder=tuple(conv(n) for n in range(4)),
        lstm_input=np.ascontiguousarray(w[rnn + "weight_ih"][_GATES].T),
        lstm_hidden=np.ascontiguousarray(w[rnn + "weight_hh"][_GATES].T),
        lstm_bias=(w[rnn + "bias_ih"] + w[rnn + "bias_hh"])[_GATES],
        out=np.ascontiguousarray(out.reshape(-1)),
        out_bias=float(w["model.decoder.decoder.2.bias"][0]),
    )

