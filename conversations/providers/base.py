"""Contracts for the pluggable pipeline stages: VAD, end of turn, ASR, LLM, TTS, and echo
cancellation.

Providers are plain async Python: no ORM, no Django settings. They receive their
configuration as keyword arguments from `registry.build` and fail with ProviderError, which
the pipeline answers by moving to the next provider in the persona's fallback list.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable


class ProviderError(Exception):
    """A provider could not do its job (network, timeout, bad reply, missing model)."""


def onnx_session(model: str | bytes, threads: int) -> Any:
    """An onnxruntime session on the CPU, `threads` for one run's operators and none between
    runs: every caller runs it from a pool thread beside others (VAD, Smart Turn, Piper).
    Sessions are safe to run from several threads at once. Raises onnxruntime's own errors."""
    import onnxruntime as ort  # noqa: PLC0415 - loaded with the first model

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


class TurnVerdict(NamedTuple):
    """An end-of-turn model's answer for one pause."""

    complete: bool
    probability: float
    elapsed_ms: float  # the model's own time (features + inference), not the wait for a slot


@dataclass(frozen=True)
class PCMChunk:
    """Signed 16-bit little-endian mono PCM."""

    pcm: bytes
    sample_rate: int


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text, as the model produced it


@dataclass(frozen=True)
class LLMDelta:
    """A piece of a streamed completion. `tool_calls` is set only on the final delta."""

    text: str = ""
    tool_calls: list[ToolCall] | None = field(default=None)


class VADStream(Protocol):
    """One session's VAD state (recurrent state, samples short of a window)."""

    def reset(self) -> None:
        """Forget the audio so far (a new `listen start`)."""


@runtime_checkable
class VAD(Protocol):
    """Voice activity: a speech probability per window of 16 kHz s16 mono audio.

    Batched by contract: one `probabilities` call carries the new audio of many streams
    (sessions), so a model can serve them in shared runs. It is blocking CPU work, called
    from the pipeline's CPU pool (never the event loop), for a stream by one job at a time.
    One provider serves the whole process (`registry.shared`).
    """

    name: str
    window_ms: float

    def stream(self) -> VADStream:
        """State for one more stream."""

    def probabilities(self, work: list[tuple[Any, bytes]]) -> list[list[float]]:
        """For each (stream, pcm): a probability per window completed by `pcm`, in order."""


class AECStream(Protocol):
    """One session's echo canceller state (adaptive filter, delay estimate)."""

    def process(self, mic: bytes, reference: bytes) -> bytes:
        """Cancel `reference` (what the device played) from `mic`; both 16 kHz s16 mono of
        the same length, a multiple of 10 ms. Returns the residual, same length."""


@runtime_checkable
class AEC(Protocol):
    """Acoustic echo cancellation of device uplinks (devices announcing `features.aec`).

    Blocking CPU work, called from the hearing's pool job (never the event loop), for a
    stream by one job at a time. One provider per process (`registry.shared`).
    """

    name: str

    def stream(self) -> AECStream:
        """State for one more session."""


@runtime_checkable
class TurnModel(Protocol):
    """End of turn: does the utterance heard so far sound finished? One per process
    (`registry.shared`); `predict` runs the model off the event loop and may raise
    ProviderError (then the pause is judged by the fixed silence window)."""

    name: str

    async def predict(self, pcm16k: bytes) -> TurnVerdict:
        """The utterance so far (16 kHz s16 mono, ending now)."""


@runtime_checkable
class ASR(Protocol):
    name: str

    async def transcribe(self, pcm: bytes, sample_rate: int, language: str | None) -> str:
        """Transcribe one utterance; an empty string means nothing was said."""


@runtime_checkable
class LLM(Protocol):
    name: str

    def stream(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None,
        model: str,
        temperature: float,
        max_tokens: int,
    ) -> AsyncIterator[LLMDelta]:
        """Stream a chat completion; raises ProviderError on failure."""


@runtime_checkable
class TTS(Protocol):
    name: str

    def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        """Stream speech for one sentence; raises ProviderError on failure."""
