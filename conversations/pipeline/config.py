"""Plain configuration types shared by the session, the engine and the consumer.

Built by the consumer from settings, the Device and its Persona; the pipeline never reads
Django settings or models itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DeviceInfo:
    id: int | None
    mac: str
    name: str = ""
    location: str = ""
    timezone: str = "UTC"
    bound: bool = True
    activation_code: str | None = None


@dataclass(frozen=True)
class ProviderSpec:
    """One provider configuration of a persona's chain, as plain values (loaded from a
    ProviderConfig row by conversations/selectors.py): `kwargs` go to `registry.build`.

    `kwargs` may hold an API key: it is left out of repr() so a logged config never shows it.
    """

    name: str
    kind: str
    kwargs: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)
    model: str = ""  # LLM: the model asked of this endpoint (empty: `persona_llm_model`)
    voice: str = ""  # TTS: the voice when the persona names none


def persona_llm_model(persona_model: str, env_model: str) -> str:
    """The model asked of an LLM configuration that names none: the persona's "LLM model",
    else LLM_MODEL. A configuration's own model wins for its endpoint (`fallback.stream_llm`):
    a fallback to another vendor needs that vendor's name for the model. Device sessions,
    the LLM Gateway, the admin's try-out and Test all follow this one rule."""
    return persona_model or env_model


# A chain entry: a configuration, or a bare kind whose options come from
# SessionConfig.providers (the environment's defaults; tests and benchmarks use kinds).
ChainEntry = ProviderSpec | str


@dataclass(frozen=True)
class PersonaConfig:
    name: str = "Xiaozhi"
    system_prompt: str = "You are {persona_name}, a helpful voice assistant. Reply in {language}."
    language: str = "en"
    voice: str = ""
    asr: tuple[ChainEntry, ...] = ("faster_whisper",)
    llm: tuple[ChainEntry, ...] = ("openai",)
    tts: tuple[ChainEntry, ...] = ("espeak",)
    llm_model: str = ""
    temperature: float = 0.7
    max_tokens: int = 512
    context_turns: int = 10
    vad_threshold: float = 0.5
    vad_threshold_low: float = 0.3
    vad_min_silence_ms: int = 600
    # End of turn: "silence" ends an utterance after vad_min_silence_ms of quiet; "smart" asks
    # the end-of-turn model after turn_pause_ms and waits at most turn_max_silence_ms. The
    # pipeline's default stays "silence" (no model to load); the Persona model defaults to smart.
    turn_detection: str = "silence"
    turn_pause_ms: int = 100
    turn_max_silence_ms: int = 1500
    # Ask the LLM on a pause's transcript before the turn is certain (pipeline/early.py); the
    # pipeline's default is off, the Persona model's on.
    early_reply: bool = False
    barge_in_min_ms: int = 180  # speech over a reply needed to interrupt it (realtime mode)
    barge_in_min_probability: float = 0.8  # VAD probability a window needs to count for it
    greeting: str = ""
    exit_phrases: tuple[str, ...] = ()
    farewell: str = "Goodbye!"
    server_tools: tuple[str, ...] | None = None  # None allows every built-in tool
    mcp_servers: tuple[str, ...] = ()
    device_tools_enabled: bool = True
    device_tool_exclusions: tuple[str, ...] = ()
    characters: tuple[dict[str, str], ...] = ()  # other personas, for role-play tools


@dataclass(frozen=True)
class SessionConfig:
    session_id: str
    device: DeviceInfo
    persona: PersonaConfig = field(default_factory=PersonaConfig)
    # "stage.kind" -> constructor keyword arguments (URLs, keys, model paths) from settings
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    vad: str = "silero"  # the VAD provider kind (one per process, shared by every session)
    turn_model: str = "smart_turn"  # the end-of-turn model kind, for "smart" personas (one per process)
    aec: str = "webrtc"  # server-side echo canceller for `features.aec` devices ("": none)
    llm_model: str = ""  # LLM_MODEL; the persona's own wins (`persona_llm_model`)
    downlink_sample_rate: int = 24000
    downlink_opus_complexity: int = 5  # XIAOZHI_OPUS_COMPLEXITY: the reply encoder's CPU against quality
    hello_timeout: float = 10.0
    idle_timeout: float = 120.0
    hard_timeout: float = 180.0
    max_text_bytes: int = 64 * 1024
    max_binary_bytes: int = 4096
    max_messages_per_second: int = 100
    device_tool_timeout: float = 30.0
    server_tool_timeout: float = 10.0
    # Bounded waits (docs/security.md): the LLM's first token (else the next provider), every
    # later token (else the apology), and the filler said once per turn when the user has
    # waited this long for the first words or a tool (0: never).
    llm_first_token_timeout: float = 15.0
    llm_inter_token_timeout: float = 10.0
    filler_after: float = 2.0
    # What the session keeps for review: "on" (utterance and reply), "reply-only", "off"
    # (XIAOZHI_RECORDING and the persona's switch: conversations.recording.recording_mode).
    recording: str = "on"
    vision_url: str = ""
    vision_token: str = ""
    unbound_policy: str = "speak_code"
    weather_base_url: str = ""
    geocoding_url: str = ""
    # Remote MCP sources (tools.mcp.client.McpToolSource) of the persona's servers, built
    # from the catalogue cached in the DB; plain objects, no ORM.
    tool_sources: tuple[Any, ...] = ()

    @property
    def model(self) -> str:
        """The model asked of the persona's LLM configurations that name none."""
        return persona_llm_model(self.persona.llm_model, self.llm_model)


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    device_id: int | None
    protocol_version: int = 1
    listen_mode: str = "auto"
