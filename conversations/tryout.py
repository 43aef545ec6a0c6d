""""Try this persona" in the admin: a text chat with a persona before any device talks to it.

A message goes through the same turn code a device's does: the persona's system prompt and
context window (pipeline/think.py `Thinker`), its LLM fallback chain and tools (the LLM ↔
tools loop of conversations/turns/, the built-in tools and the persona's MCP servers; there
is no device, so no device tools). The reply is then spoken by the persona's TTS chain
sentence by sentence as a device would hear it (the same sentence splitter, speech cleaning,
fallback and 60 ms Opus frames at the downlink rate) and handed back as an Ogg/Opus file for
an <audio> element. Nothing is stored: no conversation, no turn.

Bounds (docs/security.md): the request body, the message and the history sent back by the
page are capped; the LLM has LLM_TIMEOUT for the whole answer (tools included) and each TTS
provider its own timeout; at most MAX_SPOKEN_CHARS of the reply are spoken; a few try-outs
run at once per process, more are told to wait.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from conversations.models import Persona
from conversations.oggopus import OggOpusError, ogg_opus
from conversations.pipeline import fallback
from conversations.pipeline.config import DeviceInfo, SessionConfig
from conversations.pipeline.cpu_pool import speech_executor
from conversations.pipeline.fallback import ProviderChain, build_chain
from conversations.pipeline.speak import ENCODER_COMPLEXITY, FrameEncoder
from conversations.pipeline.text import SentenceSplitter, clean_for_speech, is_speakable, split_emotion
from conversations.pipeline.think import Thinker
from conversations.pipeline.toolset import build_toolset
from conversations.providers.base import ProviderError
from conversations.selectors import persona_config, provider_settings
from conversations.turns.tool_loop import Thought
from tools.selectors import mcp_tool_sources

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024
MAX_MESSAGE_CHARS = 1000
MAX_HISTORY_CHARS = 4000  # per message of the history the page sends back
MAX_SPOKEN_CHARS = 1200  # ~80 s of speech: longer replies are shown whole, spoken in part
MAX_CONCURRENT = 4
_running = 0


@dataclass
class Reply:
    text: str
    emotion: str | None
    thought: Thought
    audio: bytes = b""
    audio_seconds: float = 0.0
    audio_error: str = ""
    spoken_in_part: bool = False
    tts: list[str] = field(default_factory=list)


def page(request: HttpRequest, persona_id: int) -> HttpResponse:
    """The chat page (GET), wrapped by the admin's login and staff check."""
    persona = get_object_or_404(Persona, pk=persona_id)
    viewer: Any = request.user  # the admin wrapper let only active staff in
    if not viewer.has_perm("conversations.change_persona"):
        return HttpResponse(status=403)
    context = {
        **admin.site.each_context(request), "opts": Persona._meta, "persona": persona, "original": persona,
        "title": _("Try %(name)s") % {"name": persona.name},
        "reply_url": reverse("conversations_persona_try_reply", args=[persona.pk]),
        "llm_chain": chain_names(persona, "llm"), "tts_chain": chain_names(persona, "tts"),
        "max_message_chars": MAX_MESSAGE_CHARS, "llm_timeout": settings.LLM_TIMEOUT,
    }
    return TemplateResponse(request, "admin/conversations/persona/try.html", context)


def chain_names(persona: Persona, stage: str) -> str:
    """The stage's provider configurations by name, in order (the kinds when none is set)."""
    names = [config.name for config in persona.chain(stage)]
    return ", ".join(names or getattr(persona, f"{stage}_providers"))


@require_POST
async def reply(request: HttpRequest, persona_id: int) -> HttpResponse:
    """One message in, the persona's reply (text, tools used, audio) out, as JSON."""
    user: Any = await request.auser()
    if not (user.is_active and user.is_staff):
        return _error(_("Log in as staff to try personas."), 403)
    if not await sync_to_async(user.has_perm)("conversations.change_persona"):
        return _error(_("You may not change personas."), 403)
    if len(request.body) > MAX_BODY_BYTES:
        return _error(_("The message is too long."), 413)
    try:
        message, history = parse_request(request.body)
    except ValueError as exc:
        return _error(str(exc), 400)
    persona = await Persona.objects.filter(pk=persona_id).afirst()
    if persona is None:
        return _error(_("This persona no longer exists."), 404)
    global _running
    if _running >= MAX_CONCURRENT:
        return _error(_("Too many try-outs at once; try again in a moment."), 429)
    _running += 1
    try:
        config = await sync_to_async(session_config)(persona)
        result = await run(config, message, history)
    except TimeoutError:
        return _error(_("No answer within %(seconds)s s (LLM_TIMEOUT).") % {"seconds": f"{settings.LLM_TIMEOUT:g}"},
                      504)
    except ProviderError as exc:
        logger.warning("try-out: no LLM answered", extra={"persona": persona.pk, "error": type(exc).__name__})
        return _error(_("No LLM answered: %(reason)s") % {"reason": _reason(exc)}, 502)
    finally:
        _running -= 1
    return JsonResponse(as_json(result))


def parse_request(body: bytes) -> tuple[str, list[tuple[str, str]]]:
    """{"message": str, "history": [[user, reply], ...]} → checked values; ValueError with a
    readable reason otherwise."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(_("The request is not JSON.")) from None
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, str) or not message.strip():
        raise ValueError(_("Type a message first."))
    if len(message) > MAX_MESSAGE_CHARS:
        raise ValueError(_("The message is too long."))
    history: list[tuple[str, str]] = []
    for pair in data.get("history") or []:
        if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(p, str) for p in pair)
                or any(len(p) > MAX_HISTORY_CHARS for p in pair)):
            raise ValueError(_("The conversation so far is malformed."))
        history.append((pair[0], pair[1]))
    return message.strip(), history


def session_config(persona: Persona) -> SessionConfig:
    """What a device session with this persona would get, for a device that is not there."""
    persona_cfg = persona_config(persona)
    device = DeviceInfo(id=None, mac="00:00:00:00:00:00", name=_("Admin try-out"), timezone=settings.TIME_ZONE)
    return SessionConfig(
        session_id=f"try-{uuid.uuid4()}", device=device, persona=persona_cfg, providers=provider_settings(),
        llm_model=settings.LLM_MODEL, downlink_sample_rate=int(settings.XIAOZHI_DOWNLINK_SAMPLE_RATE),
        downlink_opus_complexity=settings.XIAOZHI_OPUS_COMPLEXITY,
        server_tool_timeout=settings.TOOLS_SERVER_TIMEOUT, llm_first_token_timeout=settings.LLM_FIRST_TOKEN_TIMEOUT,
        llm_inter_token_timeout=settings.LLM_INTER_TOKEN_TIMEOUT, weather_base_url=settings.WEATHER_BASE_URL,
        geocoding_url=settings.WEATHER_GEOCODING_URL,
        tool_sources=tuple(mcp_tool_sources(server_names=persona_cfg.mcp_servers)),
    )


async def run(config: SessionConfig, message: str, history: list[tuple[str, str]]) -> Reply:
    """Think (within LLM_TIMEOUT), then speak the reply; raises TimeoutError / ProviderError
    when no LLM answered."""
    persona = config.persona
    llm, tts = await asyncio.to_thread(_chains, config)
    try:
        toolset, state = build_toolset(config)
        thinker = Thinker(
            persona=persona, device=config.device, toolset=toolset, model=config.model,
            tool_state=state, first_token_timeout=config.llm_first_token_timeout,
            inter_token_timeout=config.llm_inter_token_timeout,
        )
        for user_text, reply_text in history[-max(0, persona.context_turns):]:
            thinker.remember(user_text, reply_text)
        thought = Thought()
        async with asyncio.timeout(settings.LLM_TIMEOUT):
            await toolset.refresh()  # list the built-in and MCP tools, as a session does at hello
            await thinker.think(llm, message, thought)
        emotion, text = split_emotion(thought.reply_text.strip())
        result = Reply(text=text.strip(), emotion=emotion, thought=thought)
        await speak(result, tts, voice=persona.voice, language=state.language or persona.language,
                    rate=config.downlink_sample_rate, complexity=config.downlink_opus_complexity)
        return result
    finally:
        await llm.aclose()
        await tts.aclose()


def _chains(config: SessionConfig) -> tuple[ProviderChain, ProviderChain]:
    persona = config.persona
    return build_chain("llm", persona.llm, config.providers), build_chain("tts", persona.tts, config.providers)


async def speak(result: Reply, tts: ProviderChain, *, voice: str, language: str, rate: int,
                complexity: int = ENCODER_COMPLEXITY) -> None:
    """The reply as the device would hear it, into `result.audio` (Ogg/Opus); a TTS failure
    leaves the text standing and says why in `audio_error`."""
    spoken = result.text[:MAX_SPOKEN_CHARS]
    result.spoken_in_part = len(spoken) < len(result.text)
    splitter = SentenceSplitter(first_clause=False)
    sentences = [clean_for_speech(s) for s in [*splitter.push(spoken), *splitter.flush()]]
    encoder = FrameEncoder(rate, complexity)
    packets: list[bytes] = []
    loop = asyncio.get_running_loop()
    try:
        for sentence in filter(is_speakable, sentences):
            kind, stream = await fallback.synthesize(tts, sentence, voice=voice, language=language)
            result.tts.append(kind)
            async for chunk in stream:
                packets += await loop.run_in_executor(speech_executor(), encoder.feed, chunk.pcm, chunk.sample_rate,
                                                      1_000_000)
            packets += await loop.run_in_executor(speech_executor(), encoder.finish)
    except ProviderError as exc:
        result.audio_error = _("No voice could speak the reply: %(reason)s") % {"reason": _reason(exc)}
        return
    if not packets:
        return
    try:
        ogg = await loop.run_in_executor(speech_executor(), ogg_opus, packets)
    except OggOpusError as exc:
        result.audio_error = str(exc)
        return
    result.audio, result.audio_seconds = ogg.data, ogg.duration_ms / 1000


def as_json(result: Reply) -> dict[str, Any]:
    tools = [{"name": r.name, "success": r.success} for r in result.thought.tool_calls]
    audio = f"data:audio/ogg;base64,{base64.b64encode(result.audio).decode('ascii')}" if result.audio else ""
    return {
        "reply": result.text, "emotion": result.emotion or "", "tools": tools,
        "llm": ", ".join(result.thought.providers), "tts": ", ".join(dict.fromkeys(result.tts)),
        "audio": audio, "audio_seconds": round(result.audio_seconds, 2), "audio_error": result.audio_error,
        "spoken_in_part": result.spoken_in_part,
    }


def _reason(exc: BaseException) -> str:
    last = getattr(exc, "last", None) or exc
    return f"{type(last).__name__}: {str(last)[:200]}"


def _error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


urlpatterns = [
    path("admin/conversations/persona/<int:persona_id>/try/", admin.site.admin_view(page),
         name="conversations_persona_try"),
    path("admin/conversations/persona/<int:persona_id>/try/reply/", reply, name="conversations_persona_try_reply"),
]
