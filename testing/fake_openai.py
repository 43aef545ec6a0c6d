"""A real OpenAI-compatible HTTP server for tests: the only fake in the test suite.

The paid cloud (chat completions, speech, transcriptions) is replaced by this server, not by
mocks, so the real `openai` client, its SSE parser, timeouts and error mapping all run. The
server is aiohttp on 127.0.0.1 (random port) in its own thread and event loop, so sync
tests, async tests and other processes (via `base_url`) can all use it.

    with FakeOpenAI() as fake:
        fake.script(Reply(text="你好！"), Reply(tool_calls=[Call("get_weather", {"city": "北京"})]))
        fake.on(r"天气", Reply(text="晴天。"))           # by regex on the last user message
        fake.on_tool_result(Reply(text="查到了。"))       # when the last message is a tool result
        client = openai.OpenAI(base_url=fake.base_url, api_key="x")
        ...
        assert fake.chat_requests[0].messages[-1]["content"] == "hi"

Replies are chosen in order: scripted steps (one per request), then the first matching
rule, then `fake.default`.
"""
from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import tempfile
import threading
import time
import uuid
import wave
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

SPEECH_SAMPLE_RATE = 24000  # OpenAI's "pcm" format: 24 kHz s16le mono


@dataclass(frozen=True)
class Call:
    """A tool call the fake model makes; `arguments` is a dict or raw JSON text."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Reply:
    """One scripted answer. For chat: text and/or tool calls; for transcriptions: the text.

    `chunks` overrides how text is split into stream deltas. `drop_after=N` cuts the
    connection after N stream events (SSE chunks or audio chunks); `stall_after=N` stops
    sending after N events and never finishes; `hang` never even sends headers.
    `finish_reason` "auto" is "tool_calls" or "stop"; None ends the stream without one.
    """

    text: str = ""
    chunks: Sequence[str] | None = None
    tool_calls: Sequence[Call] = ()
    first_token_delay: float = 0.0
    chunk_delay: float = 0.0
    status: int = 200
    error: str | None = None
    hang: bool = False
    drop_after: int | None = None
    stall_after: int | None = None
    finish_reason: str | None = "auto"

    def finish(self) -> str | None:
        if self.finish_reason != "auto":
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


@dataclass(frozen=True)
class RecordedRequest:
    """A request as the fake received it (JSON body, or form fields for transcriptions)."""

    endpoint: str  # "chat" | "speech" | "transcriptions" | "models"
    body: dict[str, Any]
    headers: dict[str, str]
    file: bytes | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.body.get("tools")

    @property
    def model(self) -> str | None:
        return self.body.get("model")

    @property
    def temperature(self) -> float | None:
        return self.body.get("temperature")

    @property
    def max_tokens(self) -> int | None:
        return self.body.get("max_tokens", self.body.get("max_completion_tokens"))

    @property
    def last_role(self) -> str | None:
        return self.messages[-1].get("role") if self.messages else None

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.messages if m.get("role") == "user"]
        return _content_text(users[-1].get("content")) if users else ""


ReplySource = Reply | Callable[[RecordedRequest], Reply]


@dataclass(frozen=True)
class Rule:
    """Answer `reply` when the conversation's last message is from `role` and matches."""

    reply: ReplySource
    pattern: re.Pattern[str] | None = None
    role: str = "user"  # "user": last message is the user's; "tool": it is a tool result

    def matches(self, request: RecordedRequest) -> bool:
        if request.endpoint != "chat" or request.last_role != self.role:
            return False
        text = _content_text(request.messages[-1].get("content"))
        return self.pattern is None or bool(self.pattern.search(text))


def _content_text(content: Any) -> str:
    """Message content is a string or a list of parts (text, image_url)."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


class FakeOpenAI:
    """OpenAI-compatible server on loopback; see the module docstring for usage."""

    def __init__(
        self,
        *,
        default: Reply | None = None,
        transcript: str = "",
        api_key: str | None = None,
        speech_chunk_bytes: int = 4001,
    ) -> None:
        self.default: ReplySource = default or Reply(text="好的。")
        self.transcript = transcript  # answer when no transcription is scripted
        self.api_key = api_key  # when set, other bearer tokens get a 401
        # Odd on purpose: clients must re-align PCM to whole samples themselves.
        self.speech_chunk_bytes = speech_chunk_bytes
        self.rules: list[Rule] = []
        self._lock = threading.Lock()
        endpoints = ("chat", "speech", "transcriptions")
        self._queues: dict[str, deque[ReplySource]] = {name: deque() for name in endpoints}
        self._requests: list[RecordedRequest] = []
        # time.monotonic() when each `stall_after` stream stopped sending: timeouts are measured
        # from here (an early reply can stall before the device has heard anything).
        self.stalled_at: list[float] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/"

    def start(self) -> FakeOpenAI:
        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(sock, ready), name="fake-openai")
        self._thread.daemon = True  # a test that forgets stop() must not hang the run
        self._thread.start()
        if not ready.wait(10) or self._runner is None:
            raise RuntimeError("fake OpenAI server did not start")
        return self

    def stop(self) -> None:
        thread, loop, runner = self._thread, self._loop, self._runner
        if thread is None or loop is None or runner is None:
            return
        if self._closing is not None:
            loop.call_soon_threadsafe(self._closing.set)  # releases hanging handlers
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._thread = self._loop = self._runner = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._open(sock))
        finally:
            ready.set()
        if self._runner is None:
            loop.close()
            return
        loop.run_forever()
        loop.run_until_complete(_cancel_all())
        loop.close()

    async def _open(self, sock: socket.socket) -> None:
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/audio/speech", self._speech)
        app.router.add_post("/v1/audio/transcriptions", self._transcriptions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        # handler_cancellation: a client that gives up (timeout test) frees its handler.
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner

    # -- scripting ------------------------------------------------------------------------

    def script(self, *steps: ReplySource) -> None:
        """Queue chat replies, consumed one per chat request in order."""
        self._enqueue("chat", steps)

    def script_speech(self, *steps: ReplySource) -> None:
        """Queue speech outcomes (status/error/hang/delays/drop_after); default is success."""
        self._enqueue("speech", steps)

    def script_transcriptions(self, *steps: ReplySource) -> None:
        """Queue transcription results (`Reply.text`) or failures."""
        self._enqueue("transcriptions", steps)

    def on(self, pattern: str | re.Pattern[str], reply: ReplySource) -> Rule:
        """Answer `reply` whenever the last message is a user message matching `pattern`."""
        return self._add_rule(Rule(reply, re.compile(pattern), "user"))

    def on_tool_result(self, reply: ReplySource, pattern: str | re.Pattern[str] | None = None) -> Rule:
        """Answer `reply` whenever the last message is a tool result (matching `pattern`)."""
        return self._add_rule(Rule(reply, re.compile(pattern) if pattern is not None else None, "tool"))

    def reset(self) -> None:
        """Forget scripts, rules, recorded requests and stalls (for a server shared across tests)."""
        with self._lock:
            for queue in self._queues.values():
                queue.clear()
            self.rules.clear()
            self._requests.clear()
            self.stalled_at.clear()

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.endpoint == "chat"]

    def _enqueue(self, endpoint: str, steps: Sequence[ReplySource]) -> None:
        with self._lock:
            self._queues[endpoint].extend(steps)

    def _add_rule(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _choose(self, request: RecordedRequest, fallback: ReplySource) -> Reply:
        with self._lock:
            queue = self._queues[request.endpoint]
            source: ReplySource | None = queue.popleft() if queue else None
            rules = list(self.rules)
        if source is None:
            source = next((rule.reply for rule in rules if rule.matches(request)), fallback)
        return source if isinstance(source, Reply) else source(request)

    # -- handlers -------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        if body is None:
            return _error(400, "We could not parse the JSON body of your request.")
        recorded = RecordedRequest("chat", body, dict(request.headers))
        self._record(recorded)
        if (denied := self._check_auth(request)) is not None:
            return denied
        reply = self._choose(recorded, self.default)
        if reply.hang or reply.status != 200:
            return await self._fail(reply)
        if not body.get("stream"):
            await asyncio.sleep(reply.first_token_delay)
            return web.json_response(_completion(body, reply))
        return await self._send_events(request, reply, _sse_events(body, reply), "text/event-stream")

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        if body is None:
            return _error(400, "We could not parse the JSON body of your request.")
        recorded = RecordedRequest("speech", body, dict(request.headers))
        self._record(recorded)
        if (denied := self._check_auth(request)) is not None:
            return denied
        reply = self._choose(recorded, Reply())
        if reply.hang or reply.status != 200:
            return await self._fail(reply)
        fmt = body.get("response_format", "mp3")
        if fmt not in _AUDIO_TYPES or not str(body.get("input", "")).strip():
            return _error(400, "Unsupported response_format or empty input.")
        try:
            audio = await _synthesize(str(body["input"]), float(body.get("speed") or 1.0), fmt)
        except (OSError, RuntimeError) as exc:
            return _error(500, f"speech synthesis failed: {exc}")
        size = self.speech_chunk_bytes
        chunks = [audio[k : k + size] for k in range(0, len(audio), size)]
        return await self._send_events(request, reply, chunks, _AUDIO_TYPES[fmt])

    async def _transcriptions(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        upload = form.get("file")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        audio = upload.file.read() if isinstance(upload, web.FileField) else None
        recorded = RecordedRequest("transcriptions", fields, dict(request.headers), file=audio)
        self._record(recorded)
        if (denied := self._check_auth(request)) is not None:
            return denied
        if audio is None:
            return _error(400, "Missing required parameter: 'file'.")
        reply = self._choose(recorded, Reply(text=self.transcript))
        if reply.hang or reply.status != 200:
            return await self._fail(reply)
        await asyncio.sleep(reply.first_token_delay)
        return _transcription_response(fields, reply.text, len(audio))

    async def _models(self, request: web.Request) -> web.Response:
        self._record(RecordedRequest("models", {}, dict(request.headers)))
        model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}
        return web.json_response({"object": "list", "data": [model]})

    async def _not_found(self, request: web.Request) -> web.Response:
        return _error(404, f"Invalid URL ({request.method} {request.path})")

    def _check_auth(self, request: web.Request) -> web.Response | None:
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        return _error(401, "Incorrect API key provided.", code="invalid_api_key")

    async def _fail(self, reply: Reply) -> web.Response:
        if reply.hang:
            await self._hang()
        await asyncio.sleep(reply.first_token_delay)
        return _error(reply.status, reply.error)

    async def _hang(self) -> None:
        assert self._closing is not None
        await self._closing.wait()
        raise web.HTTPServiceUnavailable()

    async def _send_events(
        self, request: web.Request, reply: Reply, events: Sequence[bytes], content_type: str
    ) -> web.StreamResponse:
        """Stream `events`, applying the reply's delays, stall and dropped connection."""
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        await asyncio.sleep(reply.first_token_delay)
        for n, event in enumerate(events):
            if reply.stall_after is not None and n >= reply.stall_after:
                self.stalled_at.append(time.monotonic())
                await self._hang()
            if reply.drop_after is not None and n >= reply.drop_after:
                _drop_connection(request)
                return response
            if n and reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            await response.write(event)
        await response.write_eof()
        return response


async def _cancel_all() -> None:
    """Handlers still running at stop (stalled streams) end with the loop, not after it."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _drop_connection(request: web.Request) -> None:
    """Cut the socket mid-body, so the client sees an incomplete chunked response."""
    if request.transport is not None:
        request.transport.abort()


async def _json_body(request: web.Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                429: "rate_limit_exceeded"}  # fmt: skip


def _error(status: int, message: str | None, code: str | None = None) -> web.Response:
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
    error = {
        "message": message or f"The server had an error processing your request (HTTP {status}).",
        "type": _ERROR_TYPES.get(status, "server_error"),
        "param": None,
        "code": code,
    }
    return web.json_response({"error": error}, status=status)


# -- chat completions ---------------------------------------------------------------------


def _pieces(text: str, size: int = 4) -> list[str]:
    """Token-like pieces: words with their trailing space, long runs cut every `size` chars."""
    words = re.findall(r"\S+\s*|\s+", text)
    return [w[k : k + size] for w in words for k in range(0, len(w), size)]


def _thirds(text: str) -> list[str]:
    """Split tool arguments into up to three parts, as real models stream them."""
    step = max(1, -(-len(text) // 3))
    return [text[k : k + step] for k in range(0, len(text), step)] or [""]


def _call_id(call: Call, index: int) -> str:
    return call.id or f"call_{index}_{uuid.uuid4().hex[:16]}"


def _sse_events(body: dict[str, Any], reply: Reply) -> list[bytes]:
    """The chat.completion.chunk sequence OpenAI sends for `reply`, as SSE frames."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": body.get("model") or "fake-model",
            "system_fingerprint": "fp_fake"}  # fmt: skip
    usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice], **({"usage": None} if usage else {})}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in (reply.chunks or _pieces(reply.text))]
    for index, call in enumerate(reply.tool_calls):
        head = {"index": index, "id": _call_id(call, index), "type": "function",
                "function": {"name": call.name, "arguments": ""}}  # fmt: skip
        chunks.append(chunk({"tool_calls": [head]}))
        for part in _thirds(call.arguments_json()):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
    if reply.finish() is not None:
        chunks.append(chunk({}, reply.finish()))
    if usage:
        chunks.append({**base, "choices": [], "usage": _usage(body, reply)})
    frames = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode() for c in chunks]
    return [*frames, b"data: [DONE]\n\n"]


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """A non-streamed chat.completion object (vision uses these)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": _call_id(c, i), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments_json()}}
            for i, c in enumerate(reply.tool_calls)
        ]  # fmt: skip
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish() or "stop"}
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model") or "fake-model",
            "choices": [choice], "usage": _usage(body, reply)}  # fmt: skip


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    prompt = len(json.dumps(body.get("messages", []), ensure_ascii=False)) // 4
    completion = len(reply.text) // 2 + 10 * len(reply.tool_calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# -- audio ----------------------------------------------------------------------------------

_AUDIO_TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "pcm": "audio/pcm"}
_CJK = re.compile(r"[\u3400-\u9fff]")


async def _synthesize(text: str, speed: float, fmt: str) -> bytes:
    """Real speech from espeak-ng, so tests can transcribe what the 'cloud' said."""
    voice = "cmn" if _CJK.search(text) else "en"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        process = await asyncio.create_subprocess_exec(
            "espeak-ng", "-v", voice, "-s", str(int(175 * speed)), "-w", str(path), "--stdin",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await process.communicate(text.encode())
        if process.returncode != 0:
            raise RuntimeError(stderr.decode(errors="replace").strip() or "espeak-ng failed")
        samples, rate = _read_wav(path)
    pcm = _resample(samples, rate, SPEECH_SAMPLE_RATE)
    return await asyncio.get_running_loop().run_in_executor(None, _encode, pcm, fmt)


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as wav:
        frames = wav.readframes(wav.getnframes())
        return np.frombuffer(frames, dtype="<i2"), wav.getframerate()


def _resample(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Linear interpolation is plenty for a test double's 22.05 → 24 kHz."""
    if src_rate == dst_rate or not len(samples):
        return samples.astype("<i2")
    count = int(round(len(samples) * dst_rate / src_rate))
    positions = np.arange(count) * (src_rate / dst_rate)
    resampled = np.interp(positions, np.arange(len(samples)), samples.astype(np.float64))
    return np.clip(np.round(resampled), -32768, 32767).astype("<i2")


def _encode(samples: np.ndarray, fmt: str) -> bytes:
    if fmt == "pcm":
        return samples.tobytes()
    if fmt == "wav":
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(SPEECH_SAMPLE_RATE)
            wav.writeframes(samples.tobytes())
        return buffer.getvalue()
    return _encode_mp3(samples)


def _encode_mp3(samples: np.ndarray) -> bytes:
    import av  # heavy import, only when a test asks for mp3

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp3") as container:
        stream = container.add_stream("libmp3lame", rate=SPEECH_SAMPLE_RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SPEECH_SAMPLE_RATE
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def _transcription_response(fields: dict[str, str], text: str, audio_bytes: int) -> web.Response:
    fmt = fields.get("response_format", "json")
    if fmt in ("text", "srt", "vtt"):
        return web.Response(text=text, content_type="text/plain")
    if fmt == "verbose_json":
        duration = max(0.0, (audio_bytes - 44) / 32000)  # assume 16 kHz s16 WAV
        return web.json_response({"task": "transcribe", "language": fields.get("language", "english"),
                                  "duration": duration, "text": text, "segments": []})  # fmt: skip
    return web.json_response({"text": text})
