"""Read-side queries of the conversations app: what a device session is configured with.

`session_config_for` turns settings, the Device and its Persona into the plain
`SessionConfig` the pipeline runs on, so nothing under conversations/pipeline/ touches the
ORM or django.conf. Called once per connection, inside the consumer's single
`database_sync_to_async` hop, before the socket is accepted.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

from conversations.models import Persona
from conversations.pipeline.config import DeviceInfo, PersonaConfig, SessionConfig
from conversations.provider_configs import env_provider_options, persona_chain_specs
from conversations.recording import recording_mode
from devices.addresses import header_value, scope_client_address  # noqa: F401  (re-exported)
from devices.auth import DeviceAuthResult
from devices.models import Device
from devices.vision import vision_token_issue
from tools.selectors import mcp_catalogue_clear, mcp_tool_sources
from xiaozhi_site.expiring import Expiring

DEFAULT_PERSONA_NAME = "Xiaozhi"
VISION_PATH = "/mcp/vision/explain"
MAX_CHARACTERS = 20  # other personas offered to the role-play tool


def persona_default() -> Persona:
    """The persona flagged default; created on first use so a fresh install just works."""
    persona = Persona.objects.filter(is_default=True).order_by("pk").first()
    if persona is None:
        persona, _ = Persona.objects.get_or_create(name=DEFAULT_PERSONA_NAME, defaults={"is_default": True})
    return persona


def persona_for_device(device: Device | None) -> Persona:
    if device is not None and device.persona_id is not None:
        persona = Persona.objects.filter(pk=device.persona_id).first()
        if persona is not None:
            return persona
    return persona_default()


# What a connecting device's session is set up from, kept briefly: a reboot storm connects
# thousands of devices with the same persona within seconds, and reading the persona row
# (~1 ms of CPU, most of it the ORM building the query), building its configuration (three
# queries) and reading the MCP catalogue would be repeated for each. Every cache here lives
# PERSONA_CONFIG_TTL_SECONDS; an edit of a persona or of what it refers to (provider
# configurations, MCP servers and their tools, the other personas offered as characters)
# clears them all in this process at once (conversations/apps.py) and reaches the other
# workers within that second. A persona's own edits also change its `updated_at`, part of
# the configuration's key.
PERSONA_CONFIG_TTL_SECONDS = 1.0
_persona_configs: Expiring[tuple[int, object, str], PersonaConfig] = Expiring()
_device_personas: Expiring[int | None, Persona] = Expiring()


def persona_configs_clear(**_: object) -> None:
    """Forget every cached session set-up (a signal receiver: any arguments)."""
    _persona_configs.clear()
    _device_personas.clear()
    mcp_catalogue_clear()


def persona_for_device_cached(device: Device) -> Persona:
    """`persona_for_device`, shared by the devices of one persona connecting within
    PERSONA_CONFIG_TTL_SECONDS (read only: the instance is shared)."""
    # Keyed by persona (None: the default persona).
    return _device_personas.get(device.persona_id, lambda: persona_for_device(device), PERSONA_CONFIG_TTL_SECONDS)


def persona_config_cached(persona: Persona, env_options: dict[str, dict[str, Any]]) -> PersonaConfig:
    """`persona_config`, reused for PERSONA_CONFIG_TTL_SECONDS (PersonaConfig is immutable)."""
    key = (persona.pk, persona.updated_at, json.dumps(env_options, sort_keys=True, default=str))
    return _persona_configs.get(key, lambda: persona_config(persona, env_options), PERSONA_CONFIG_TTL_SECONDS)


def persona_config(persona: Persona, env_options: dict[str, dict[str, Any]] | None = None) -> PersonaConfig:
    characters = Persona.objects.exclude(pk=persona.pk).values("name", "description")[:MAX_CHARACTERS]
    chains = persona_chain_specs(persona, env_provider_options() if env_options is None else env_options)
    return PersonaConfig(
        name=persona.name, system_prompt=persona.system_prompt, language=persona.language,
        voice=persona.voice, asr=chains["asr"], llm=chains["llm"], tts=chains["tts"], llm_model=persona.llm_model,
        temperature=persona.temperature, max_tokens=persona.max_tokens,
        context_turns=persona.context_turns, vad_threshold=persona.vad_threshold,
        vad_threshold_low=persona.vad_threshold_low, vad_min_silence_ms=persona.vad_min_silence_ms,
        turn_detection=persona.turn_detection, turn_pause_ms=persona.turn_pause_ms,
        turn_max_silence_ms=persona.turn_max_silence_ms, early_reply=persona.early_reply,
        barge_in_min_ms=persona.barge_in_min_ms, barge_in_min_probability=persona.barge_in_min_probability,
        greeting=persona.greeting, exit_phrases=_strings(persona.exit_phrases),
        farewell=persona.farewell,
        # Empty or null means "all built-in tools" (the admin's help text says so).
        server_tools=_strings(persona.server_tools) or None,
        mcp_servers=tuple(persona.mcp_servers.filter(enabled=True).values_list("name", flat=True)),
        device_tools_enabled=persona.device_tools_enabled,
        device_tool_exclusions=_strings(persona.device_tool_exclusions),
        characters=tuple({"name": c["name"], "description": c["description"]} for c in characters),
    )


def provider_settings() -> dict[str, dict[str, Any]]:
    """The environment's options per "<stage>.<kind>" (conversations/provider_configs.py)."""
    return env_provider_options()


def device_info(device: Device, auth: DeviceAuthResult) -> DeviceInfo:
    return DeviceInfo(
        id=device.pk, mac=device.mac, name=device.name, location=device.location,
        timezone=device.timezone or settings.TIME_ZONE, bound=auth.bound,
        activation_code=auth.activation_code,
    )


def session_config_for(
    device: Device, auth: DeviceAuthResult, *, persona: Persona | None = None, request_base_url: str = "",
) -> SessionConfig:
    """Everything one device session needs, read once at connect."""
    persona = persona or persona_for_device(device)
    env_options = env_provider_options()
    persona_cfg = persona_config_cached(persona, env_options)
    base_url = (settings.XIAOZHI_PUBLIC_BASE_URL or request_base_url).rstrip("/")
    return SessionConfig(
        session_id=str(uuid.uuid4()),
        device=device_info(device, auth),
        persona=persona_cfg,
        providers=env_options,
        llm_model=settings.LLM_MODEL,
        downlink_sample_rate=int(settings.XIAOZHI_DOWNLINK_SAMPLE_RATE),
        downlink_opus_complexity=settings.XIAOZHI_OPUS_COMPLEXITY,
        hello_timeout=settings.XIAOZHI_HELLO_TIMEOUT_SECONDS,
        idle_timeout=settings.XIAOZHI_IDLE_TIMEOUT_SECONDS,
        hard_timeout=settings.XIAOZHI_HARD_TIMEOUT_SECONDS,
        max_text_bytes=settings.XIAOZHI_MAX_TEXT_BYTES,
        max_binary_bytes=settings.XIAOZHI_MAX_BINARY_BYTES,
        max_messages_per_second=settings.XIAOZHI_MAX_MESSAGES_PER_SECOND,
        device_tool_timeout=settings.TOOLS_DEVICE_TIMEOUT,
        server_tool_timeout=settings.TOOLS_SERVER_TIMEOUT,
        llm_first_token_timeout=settings.LLM_FIRST_TOKEN_TIMEOUT,
        llm_inter_token_timeout=settings.LLM_INTER_TOKEN_TIMEOUT,
        filler_after=settings.XIAOZHI_FILLER_SECONDS,
        aec="webrtc" if settings.XIAOZHI_SERVER_AEC == "on" else "",
        recording=recording_mode(persona_records=persona.record_audio),
        vision_url=f"{base_url}{VISION_PATH}" if base_url else "",
        vision_token=vision_token_issue(device=device),
        unbound_policy=settings.XIAOZHI_UNBOUND_POLICY,
        weather_base_url=settings.WEATHER_BASE_URL,
        geocoding_url=settings.WEATHER_GEOCODING_URL,
        tool_sources=tuple(mcp_tool_sources(server_names=persona_cfg.mcp_servers, max_age=PERSONA_CONFIG_TTL_SECONDS)),
    )


def request_base_url(scope: Mapping[str, Any]) -> str:
    """http(s)://host[:port] the device reached us at, from a WebSocket scope.

    The firmware's Host header has no port (protocol-reference §2.1), so the listening port
    is added from the scope unless it is the scheme's default. Behind a reverse proxy set
    XIAOZHI_PUBLIC_BASE_URL instead: the proxy's port is not visible here.
    """
    secure = scope.get("scheme") in ("wss", "https")
    host = header_value(scope, b"host")
    server = scope.get("server") or (None, None)
    port = server[1] if isinstance(server, (list, tuple)) and len(server) == 2 else None
    if not host and server[0]:
        host = str(server[0])
    if not host:
        return ""
    has_port = host.rsplit("]", 1)[-1].count(":") == 1
    if not has_port and port and port != (443 if secure else 80):
        host = f"{host}:{port}"
    return f"{'https' if secure else 'http'}://{host}"


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, Iterable) or isinstance(value, (str, bytes)):
        return ()
    return tuple(str(item) for item in value if isinstance(item, str) and item)
