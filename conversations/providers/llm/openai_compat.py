"""Chat completions from any OpenAI-compatible server (OpenAI, DeepSeek, Qwen, Ollama, vLLM).

Also home of the helpers the OpenAI-compatible ASR and TTS providers share: the SDK clients,
one per endpoint and event loop in the process, and one error mapping, so every failure of
the SDK or the network under it becomes a ProviderError without the API key in its message.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from conversations.providers.base import LLMDelta, ProviderError, ToolCall

logger = logging.getLogger(__name__)

# What the SDK, its HTTP layer and the socket under it raise. Anything else is our bug and
# should surface as such rather than as "the provider failed".
CLIENT_ERRORS: tuple[type[BaseException], ...] = (openai.OpenAIError, httpx2.HTTPError, OSError, TimeoutError)

_KEY_LIKE = re.compile(r"\b(?:sk|pk|key)-[A-Za-z0-9_*\-]{4,}|(?i:bearer)\s+\S+")


@dataclass(frozen=True)
class Endpoint:
    """What an SDK client is made for: providers with equal endpoints share one client."""

    base_url: str
    api_key: str = field(repr=False)
    timeout: float
    max_retries: int = 0  # the pipeline has a fallback list and a user waiting: no retries

    def client(self) -> openai.AsyncOpenAI:
        """The process's client for this endpoint on the running event loop."""
        return _clients.get(self, asyncio.get_running_loop())


class SharedClients:
    """One SDK client per endpoint and event loop.

    A client costs ~17 ms of CPU (its TLS context loads the CA bundle) and ~0.85 MB of memory;
    every talking session used to build one per OpenAI-compatible stage. Shared, the sessions
    of a worker also share its connection pool: a session's first request reuses a warm
    connection instead of a new TCP and TLS handshake. Per loop, because the HTTP pool belongs
    to the loop that uses it; a closed loop's clients (a one-off `asyncio.run`) are dropped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # loops of other threads (probes, Celery) ask too
        self._by_loop: dict[asyncio.AbstractEventLoop, dict[Endpoint, openai.AsyncOpenAI]] = {}

    def get(self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop) -> openai.AsyncOpenAI:
        with self._lock:
            for closed in [other for other in self._by_loop if other.is_closed()]:
                del self._by_loop[closed]
            clients = self._by_loop.setdefault(loop, {})
            if endpoint not in clients:
                clients[endpoint] = openai.AsyncOpenAI(
                    base_url=endpoint.base_url, api_key=endpoint.api_key or "not-needed",
                    timeout=endpoint.timeout, max_retries=endpoint.max_retries,
                )
            return clients[endpoint]


_clients = SharedClients()


def provider_error(what: str, exc: BaseException, secret: str = "") -> ProviderError:
    """ProviderError("LLM stream failed: InternalServerError (HTTP 500): boom"), key redacted."""
    status = getattr(exc, "status_code", None)
    detail = str(getattr(exc, "message", "") or exc or "").strip()
    text = f"{what} failed: {type(exc).__name__}" + (f" (HTTP {status})" if status else "")
    if detail:
        text += f": {detail[:300]}"
    if len(secret) >= 4:
        text = text.replace(secret, "***")
    return ProviderError(_KEY_LIKE.sub("***", text))


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _ToolCallAssembler:
    """Rebuild tool calls from streamed fragments keyed by `index`.

    Some compatible servers omit `index` or reuse index 0 for parallel calls; a new `id`
    therefore always starts a new call, and fragments without an id extend the latest call
    with that index.
    """

    def __init__(self) -> None:
        self._calls: list[_PartialCall] = []
        self._latest: dict[int, int] = {}  # stream index -> position in _calls

    def add(self, fragments: Iterable[ChoiceDeltaToolCall]) -> None:
        for fragment in fragments:
            call = self._calls[self._position(fragment)]
            if fragment.id and not call.id:
                call.id = fragment.id
            function = fragment.function
            if function is not None and function.name and not call.name:
                call.name = function.name
            if function is not None and function.arguments:
                call.arguments.append(function.arguments)

    def _position(self, fragment: ChoiceDeltaToolCall) -> int:
        index = fragment.index if fragment.index is not None else -1
        position = self._latest.get(index)
        if position is None or (fragment.id and self._calls[position].id not in ("", fragment.id)):
            position = len(self._calls)
            self._calls.append(_PartialCall())
            self._latest[index] = position
        return position

    def result(self) -> list[ToolCall]:
        calls = []
        for call in self._calls:
            if not call.name:
                logger.warning("dropping streamed tool call without a name")
                continue
            call_id = call.id or f"call_{uuid.uuid4().hex[:24]}"
            calls.append(ToolCall(id=call_id, name=call.name, arguments="".join(call.arguments) or "{}"))
        return calls


class OpenAILLM:
    """Streaming chat completions with tool calls over the OpenAI wire format."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: str = "not-needed",
        timeout: float = 120.0,
        max_retries: int = 0,
        **_: Any,
    ) -> None:
        self._secret = api_key
        self._endpoint = Endpoint(base_url, api_key, timeout, max_retries)

    async def stream(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None,
        model: str,
        temperature: float,
        max_tokens: int,
    ) -> AsyncIterator[LLMDelta]:
        """Yield text deltas as they arrive, then one delta with the tool calls, if any."""
        calls = _ToolCallAssembler()
        finish_reason: str | None = None
        try:
            response = await self._endpoint.client().chat.completions.create(
                **self._params(messages, tools, model, temperature, max_tokens)
            )
            async with response:
                async for chunk in response:
                    # Usage-only chunks have no choices; some servers omit an empty delta.
                    choice = chunk.choices[0] if chunk.choices else None
                    delta = getattr(choice, "delta", None)
                    if delta is not None and delta.content:
                        yield LLMDelta(text=delta.content)
                    if delta is not None and delta.tool_calls:
                        calls.add(delta.tool_calls)
                    finish_reason = getattr(choice, "finish_reason", None) or finish_reason
        except CLIENT_ERRORS as exc:
            logger.warning("llm stream failed", extra={"model": model, "error": type(exc).__name__})
            raise provider_error("LLM stream", exc, self._secret) from exc
        if finish_reason is None:
            # A clean end without finish_reason is a cut stream: speaking half an answer as
            # if it were whole is worse than falling back.
            raise ProviderError("LLM stream ended before the model finished")
        if finish_reason == "length":
            logger.warning("llm reply cut by max_tokens", extra={"model": model, "max_tokens": max_tokens})
        tool_calls = calls.result()
        if tool_calls:
            yield LLMDelta(tool_calls=tool_calls)

    @staticmethod
    def _params(
        messages: list[dict], tools: list[dict] | None, model: str, temperature: float, max_tokens: int
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if tools:  # an empty "tools" array is rejected by OpenAI and several compatibles
            params["tools"] = tools
        return params
