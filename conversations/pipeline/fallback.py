"""Ordered provider chains: the persona's fallback list for one stage.

Rules (product.md, "reliability"):
- ASR and TTS move to the next provider on ProviderError, on any other exception (a
  provider bug must not leave the device hanging) or on a timeout.
- The LLM falls over only before its first delta: once words are spoken, restarting the
  answer with another model would repeat them.
- espeak-ng is always the last TTS fallback: it is offline and takes ~15 ms a sentence.
- A provider that just failed is tried last for `cooldown` seconds, so a dead cloud TTS
  costs one connect timeout per session and not one per sentence.
- Bounded waits: the first item of a stream within the slot's timeout (the caller may ask
  for less: `first_wait`, the LLM's first-token bound), every later item within `gap`
  (the LLM's inter-token bound; ASR/TTS: the slot's timeout). A stream that goes quiet after
  its first item is `ProviderStalled`; it cannot fall over any more, so the caller ends the
  turn (the device's apology, the gateway's TIMEOUT).
The caller learns which provider served (`kind`) for the turn history, and may pass an
`AttemptLog` (conversations/capture.py) that gets every attempt: kind, configuration name,
outcome, time.

A chain is built from the persona's entries for the stage: `ProviderSpec`s (one per
ProviderConfig row: its name, kind and constructor options; several of one kind are
normal, e.g. a cloud LLM then a local one) or bare kinds whose options come from the
session's `providers` mapping (the environment's defaults).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from conversations.capture import AttemptLog, ProviderAttempt
from conversations.pipeline.config import ChainEntry, ProviderSpec, SessionConfig
from conversations.providers import registry
from conversations.providers.base import LLMDelta, PCMChunk, ProviderError

log = logging.getLogger(__name__)

T = TypeVar("T")
LAST_RESORT_TTS = "espeak"
DEFAULT_TIMEOUTS: dict[str, float] = {"asr": 15.0, "llm": 30.0, "tts": 10.0}
# An LLM's own `timeout` covers the whole completion; the wait for its first token is
# capped lower so a hung endpoint does not hold the user for two minutes.
MAX_FIRST_TOKEN_WAIT = 30.0


class ProviderBroke(ProviderError):
    """A provider raised something other than ProviderError after its first item: a bug in
    it. The original exception is the `__cause__`; callers that must tell a bug from an
    outage (the gateway answers INTERNAL_ERROR) look there."""


class ProviderStalled(ProviderError):
    """A stream sent nothing for longer than its gap timeout after its first item. The
    `__cause__` is the TimeoutError (the gateway reports TIMEOUT)."""


class AllProvidersFailed(ProviderError):
    """Every provider of a stage failed; `last` is the final error."""

    def __init__(self, stage: str, last: BaseException | None) -> None:
        super().__init__(f"all {stage} providers failed")
        self.stage = stage
        self.last = last


@dataclass
class Slot:
    kind: str
    provider: Any
    timeout: float
    failed_until: float = 0.0
    name: str = ""  # the configuration's name ("" for a chain of bare kinds)
    model: str = ""  # LLM: this endpoint's model, which wins over the caller's
    voice: str = ""  # TTS: this configuration's voice, when the caller has none

    @property
    def label(self) -> str:
        return self.name or self.kind


class ProviderChain:
    """The providers of one stage, tried in order (recently failed ones last)."""

    def __init__(
        self,
        stage: str,
        slots: list[Slot],
        *,
        cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stage = stage
        self.slots = slots
        self.cooldown = cooldown
        self._clock = clock

    @property
    def kinds(self) -> list[str]:
        return [slot.kind for slot in self.slots]

    def order(self) -> list[Slot]:
        now = self._clock()
        healthy = [s for s in self.slots if s.failed_until <= now]
        return healthy + [s for s in self.slots if s.failed_until > now]

    def slot(self, kind: str) -> Slot | None:
        return next((s for s in self.slots if s.kind == kind), None)

    def failed(self, slot: Slot, error: BaseException) -> None:
        slot.failed_until = self._clock() + self.cooldown
        # The class name only, never the message or a traceback's locals: SDK errors can
        # carry URLs, headers and keys (docs/security.md). A provider bug still gets its
        # traceback, which shows code, not values.
        log.warning(
            "provider failed, trying the next one",
            exc_info=not isinstance(error, (ProviderError, TimeoutError, OSError)),
            extra={"stage": self.stage, "provider": slot.kind, "config": slot.name, "error": type(error).__name__},
        )

    def succeeded(self, slot: Slot) -> None:
        slot.failed_until = 0.0

    async def aclose(self) -> None:
        for slot in self.slots:
            close = getattr(slot.provider, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:
                    log.warning("provider close failed", exc_info=True, extra={"provider": slot.kind})


def provider_kwargs(configs: Mapping[str, dict[str, Any]], stage: str, kind: str) -> dict[str, Any]:
    """Constructor options: "<stage>.<kind>" wins over plain "<kind>" ("openai" is in 3 stages)."""
    return dict(configs.get(f"{stage}.{kind}") or configs.get(kind) or {})


def chain_specs(
    stage: str, entries: list[ChainEntry] | tuple[ChainEntry, ...], configs: Mapping[str, dict[str, Any]],
) -> list[ProviderSpec]:
    """The entries as specs (bare kinds take their options from `configs`), duplicates
    dropped, with espeak-ng appended to a TTS chain that lacks it."""
    specs: list[ProviderSpec] = []
    seen: set[str] = set()
    for entry in entries:
        spec = (entry if isinstance(entry, ProviderSpec)
                else ProviderSpec("", entry, provider_kwargs(configs, stage, entry)))
        key = spec.name or f"kind:{spec.kind}"
        if key not in seen:
            seen.add(key)
            specs.append(spec)
    if stage == "tts" and all(spec.kind != LAST_RESORT_TTS for spec in specs):
        specs.append(ProviderSpec("", LAST_RESORT_TTS, provider_kwargs(configs, stage, LAST_RESORT_TTS)))
    return specs


def build_slot(stage: str, spec: ProviderSpec, max_first_token_wait: float | None = MAX_FIRST_TOKEN_WAIT) -> Slot:
    """One provider of `spec`; raises whatever its constructor raises."""
    provider = registry.build(stage, spec.kind, **spec.kwargs)
    return Slot(spec.kind, provider, _timeout(stage, spec.kwargs, max_first_token_wait),
                name=spec.name, model=spec.model, voice=spec.voice)


def build_chain(
    stage: str, entries: list[ChainEntry] | tuple[ChainEntry, ...], configs: Mapping[str, dict[str, Any]], *,
    max_first_token_wait: float | None = MAX_FIRST_TOKEN_WAIT,
) -> ProviderChain:
    """Instantiate the persona's list; entries that cannot be built are skipped and logged.

    An LLM slot waits for its first token at most `max_first_token_wait` seconds (None: its
    own `timeout`, for a caller with a deadline of its own)."""
    slots: list[Slot] = []
    for spec in chain_specs(stage, entries, configs):
        try:
            slots.append(build_slot(stage, spec, max_first_token_wait))
        except Exception as exc:  # unknown kind, missing option, missing binary/model
            # The exception's class only: a constructor's message may quote its arguments.
            log.warning("provider not available", extra={
                "stage": stage, "provider": spec.kind, "config": spec.name, "error": type(exc).__name__})
    return ProviderChain(stage, slots)


def _timeout(stage: str, kwargs: dict[str, Any], max_first_token_wait: float | None) -> float:
    value = float(kwargs.get("timeout") or DEFAULT_TIMEOUTS[stage])
    return min(value, max_first_token_wait) if stage == "llm" and max_first_token_wait is not None else value


async def transcribe(
    chain: ProviderChain, pcm: bytes, sample_rate: int, language: str | None, attempts: AttemptLog | None = None,
) -> tuple[str, str]:
    """(text, provider kind) from the first ASR that answers in time."""
    last: BaseException | None = None
    for slot in chain.order():
        started = _now()
        try:
            async with asyncio.timeout(slot.timeout):
                text = await slot.provider.transcribe(pcm, sample_rate, language)
        except Exception as exc:
            chain.failed(slot, exc)
            _failed(attempts, chain.stage, slot, exc, started)
            last = exc
            continue
        chain.succeeded(slot)
        _served(attempts, chain.stage, slot, started)
        return (text or "").strip(), slot.kind
    raise AllProvidersFailed(chain.stage, last)


async def stream_llm(
    chain: ProviderChain, messages: list[dict], *, attempts: AttemptLog | None = None,
    first_wait: float | None = None, gap: float | None = None, **params: Any,
) -> tuple[str, AsyncIterator[LLMDelta]]:
    """(provider kind, delta stream) from the first LLM that produces a first delta in time.

    `first_wait` caps each slot's wait for its first delta, `gap` the wait for every later
    one (None: unbounded, only the provider's own timeout). An LLM that ends without any
    delta counts as having answered (with nothing). A slot with a model of its own asks
    for that model instead of `params["model"]` (each endpoint names its models its way).
    """
    return await _first_of(
        chain, lambda slot: slot.provider.stream(messages, **_with_model(params, slot)), empty_ok=True,
        attempts=attempts, first_wait=first_wait, gap=gap,
    )


def _with_model(params: dict[str, Any], slot: Slot) -> dict[str, Any]:
    return {**params, "model": slot.model} if slot.model else params


async def synthesize(
    chain: ProviderChain, text: str, *, voice: str, language: str, attempts: AttemptLog | None = None,
) -> tuple[str, AsyncIterator[PCMChunk]]:
    """(provider kind, PCM stream) from the first TTS that yields audio in time. The
    caller's voice (the persona's) wins; without one, a slot speaks with its own."""
    return await _first_of(
        chain, lambda slot: slot.provider.synthesize(text, voice=voice or slot.voice, language=language),
        empty_ok=False, attempts=attempts,
    )


async def _first_of(
    chain: ProviderChain, open_stream: Callable[[Slot], AsyncIterator[T]], *, empty_ok: bool,
    attempts: AttemptLog | None = None, first_wait: float | None = None, gap: float | None = None,
) -> tuple[str, AsyncIterator[T]]:
    last: BaseException | None = None
    for slot in chain.order():
        started = _now()
        stream = open_stream(slot)
        try:
            async with asyncio.timeout(slot.timeout if first_wait is None else min(slot.timeout, first_wait)):
                first = await anext(stream)
        except StopAsyncIteration:
            if empty_ok:
                chain.succeeded(slot)
                _served(attempts, chain.stage, slot, started)
                return slot.kind, _empty()
            last = ProviderError(f"{slot.label} produced nothing")
            chain.failed(slot, last)
            _failed(attempts, chain.stage, slot, last, started)
            continue
        except Exception as exc:
            await _close(stream)
            chain.failed(slot, exc)
            _failed(attempts, chain.stage, slot, exc, started)
            last = exc
            continue
        chain.succeeded(slot)
        served = _served(attempts, chain.stage, slot, started)
        if gap is None and chain.stage != "llm":
            gap = slot.timeout
        outcome = _Outcome(chain, slot, attempts, served, started)
        return slot.kind, _rest(first, stream, gap, outcome)
    raise AllProvidersFailed(chain.stage, last)


@dataclass
class _Outcome:
    """Where a stream's late failure is reported: its chain and the turn's attempt log."""

    chain: ProviderChain
    slot: Slot
    attempts: AttemptLog | None
    served: ProviderAttempt | None
    started: float

    def broke(self, error: BaseException) -> None:
        if self.attempts is not None:
            self.attempts.broke(self.chain.stage, self.served, self.slot.kind, error, _ms_since(self.started),
                                config=self.slot.name)


async def _rest(first: T, stream: AsyncIterator[T], gap: float | None, outcome: _Outcome) -> AsyncIterator[T]:
    """The first item, then the rest, each within `gap` seconds (None: no bound); a failure
    or stall after the first item is a ProviderError for the caller (no fallback any more),
    and the stream is always closed."""
    kind = outcome.slot.kind
    try:
        yield first
        while True:
            try:
                async with asyncio.timeout(gap):
                    item = await anext(stream)
            except StopAsyncIteration:
                return
            except ProviderError as exc:
                outcome.broke(exc)
                raise
            except TimeoutError as exc:
                stalled = ProviderStalled(f"{kind} stalled: nothing for {gap:g} s after its first item")
                outcome.chain.failed(outcome.slot, stalled)  # the next turn tries another first
                outcome.broke(stalled)
                raise stalled from exc
            except Exception as exc:
                outcome.broke(exc)
                raise ProviderBroke(f"{kind} failed mid-stream: {type(exc).__name__}") from exc
            yield item
    finally:
        await _close(stream)


def _now() -> float:
    return asyncio.get_running_loop().time()


def _ms_since(started: float) -> float:
    return (_now() - started) * 1000


def _served(attempts: AttemptLog | None, stage: str, slot: Slot, started: float) -> ProviderAttempt | None:
    return attempts.served(stage, slot.kind, _ms_since(started), config=slot.name) if attempts is not None else None


def _failed(attempts: AttemptLog | None, stage: str, slot: Slot, error: BaseException, started: float) -> None:
    if attempts is not None:
        attempts.failed(stage, slot.kind, error, _ms_since(started), config=slot.name)


async def _empty() -> AsyncIterator[Any]:
    return
    yield  # pragma: no cover - makes this an async generator


async def _close(stream: AsyncIterator[Any]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            log.debug("provider stream close failed", exc_info=True)


@dataclass
class StageChains:
    asr: ProviderChain
    llm: ProviderChain
    tts: ProviderChain
    apology: ProviderChain  # espeak only: the voice that works when everything else failed


_warmed: set[str] = set()
_warm_lock = threading.Lock()


def _warm_up_once(chain: ProviderChain) -> None:
    """Load local models (faster-whisper: ~0.5 s) once per process, while the first session
    is still listening, instead of inside its first turn. Runs in the build thread."""
    for slot in chain.slots:
        warm_up = getattr(slot.provider, "warm_up", None)
        key = f"{slot.kind}:{slot.name}"  # two Whisper configs may load two models
        with _warm_lock:
            if warm_up is None or key in _warmed:
                continue
            _warmed.add(key)
        try:
            warm_up()
        except Exception:
            log.warning("provider warm-up failed", exc_info=True, extra={"stage": chain.stage, "provider": slot.kind})


def _warm_up_voices(chain: ProviderChain, voice: str, language: str) -> None:
    """Start loading local TTS voices (Piper: ~0.7 s) that the persona's sentences would use,
    in the provider's own threads; returns at once, the chain is ready meanwhile."""
    for slot in chain.slots:
        warm_up = getattr(slot.provider, "warm_up_voice", None)
        if warm_up is None:
            continue
        try:
            warm_up(voice=voice or slot.voice, language=language)
        except Exception:
            log.warning("provider warm-up failed", exc_info=True, extra={"stage": chain.stage, "provider": slot.kind})


class Chains:
    """A session's provider chains, built once on first need.

    Building imports provider SDKs (openai alone takes ~0.6 s the first time in a process)
    and loads local models, so it runs in a worker thread, and only for sessions that
    actually talk: thousands of idle devices never pay for it. (The SDK clients are the
    process's, one per endpoint: conversations/providers/llm/openai_compat.py.)
    """

    def __init__(self, config: SessionConfig) -> None:
        self._config = config
        self._task: asyncio.Task[StageChains] | None = None
        self.ready: StageChains | None = None

    def prepare(self) -> None:
        """Start building in the background (at `listen start`, before the first turn)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._build), name="provider-chains")
            self._task.add_done_callback(self._built)

    async def get(self) -> StageChains:
        self.prepare()
        assert self._task is not None
        return await asyncio.shield(self._task)

    def _built(self, task: asyncio.Task[StageChains]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.ready = task.result()

    def _build(self) -> StageChains:
        persona, configs = self._config.persona, self._config.providers
        asr = build_chain("asr", persona.asr, configs)
        _warm_up_once(asr)
        tts = build_chain("tts", persona.tts, configs)
        _warm_up_voices(tts, persona.voice, persona.language)
        espeak = tts.slot(LAST_RESORT_TTS)
        apology = ProviderChain("tts", [espeak]) if espeak is not None else tts
        return StageChains(
            asr=asr,
            llm=build_chain("llm", persona.llm, configs),
            tts=tts,
            apology=apology,
        )

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.ready is not None:
            for chain in (self.ready.asr, self.ready.llm, self.ready.tts):
                await chain.aclose()
            self.ready = None
