"""Provider configurations: the defaults seeded from the environment, personas' chains, and
the plain `ProviderSpec`s the pipeline builds its providers from.

Services write (`provider_config_default`, `persona_chain_set_kinds`); selectors read
(`persona_chain_specs`, `provider_spec`). Nothing under conversations/pipeline/ sees a
ProviderConfig row: a session gets ProviderSpecs, read once at connect.

API keys: a config stores its key as given, or `env:NAME`, resolved here when a session
starts (`api_key_resolve`). Only names ending in _API_KEY or _TOKEN may be referenced, so a
config cannot send the server's own secrets (DJANGO_SECRET_KEY, DATABASE_URL) to an
endpoint. Resolved keys live only in ProviderSpec.kwargs, which repr() leaves out.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from conversations.models import (
    CHAIN_STAGES,
    DEFAULT_CHAINS,
    ENV_KEY,
    KEY_NAME_SUFFIXES,
    Persona,
    PersonaProvider,
    ProviderConfig,
)
from conversations.pipeline.config import ChainEntry, ProviderSpec
from xiaozhi_site.env import envsecret

log = logging.getLogger(__name__)

# The configurations the environment used to describe, one per kind: name and key reference.
# Their other fields stay empty, so they keep following LLM_BASE_URL, LLM_MODEL, TTS_TIMEOUT…
# The data migration 0011 seeds the same table (a frozen copy).
ENV_DEFAULTS: dict[tuple[str, str], tuple[str, str]] = {
    ("asr", "faster_whisper"): ("Whisper (local)", ""),
    ("asr", "openai"): ("ASR OpenAI-compatible (environment)", "env:ASR_OPENAI_API_KEY"),
    ("llm", "openai"): ("LLM (environment)", "env:LLM_API_KEY"),
    ("tts", "edge"): ("Edge TTS", ""),
    ("tts", "openai"): ("TTS OpenAI-compatible (environment)", "env:TTS_OPENAI_API_KEY"),
    ("tts", "piper"): ("Piper (offline)", ""),
    ("tts", "espeak"): ("espeak-ng (offline)", ""),
}


# Key variables the settings already read (with a default, or NAME_FILE): the seeded
# configurations refer to these, and an unset one is not a mistake ("not-needed").
SETTINGS_KEYS = frozenset({"LLM_API_KEY", "ASR_OPENAI_API_KEY", "TTS_OPENAI_API_KEY", "XIAOZHI_VISION_API_KEY"})


def default_config_name(stage: str, kind: str) -> str:
    return ENV_DEFAULTS.get((stage, kind), (f"{stage.upper()} {kind}", ""))[0]


# -- services ------------------------------------------------------------------------------------


def provider_config_default(*, stage: str, kind: str) -> ProviderConfig:
    """The default configuration of a kind (created on first use, empty fields = environment)."""
    name, key = ENV_DEFAULTS.get((stage, kind), (default_config_name(stage, kind), ""))
    config, _ = ProviderConfig.objects.get_or_create(name=name, defaults={"stage": stage, "kind": kind, "api_key": key})
    return config


@transaction.atomic
def persona_chain_set_kinds(*, persona: Persona, stage: str, kinds: list[str]) -> None:
    """Point a stage's chain at the default configuration of each kind, in order."""
    PersonaProvider.objects.filter(persona=persona, config__stage=stage).delete()
    configs = [provider_config_default(stage=stage, kind=kind) for kind in dict.fromkeys(kinds)]
    persona_chain_set(persona=persona, configs=configs)


@transaction.atomic
def persona_chain_set(*, persona: Persona, configs: list[ProviderConfig]) -> None:
    """Replace the chains of the stages of `configs` with `configs`, in order."""
    stages = {config.stage for config in configs}
    PersonaProvider.objects.filter(persona=persona, config__stage__in=stages).delete()
    PersonaProvider.objects.bulk_create(
        PersonaProvider(persona=persona, config=config, position=position) for position, config in enumerate(configs)
    )


# -- selectors -----------------------------------------------------------------------------------


def env_key_allowed(name: str) -> bool:
    return name.upper().endswith(KEY_NAME_SUFFIXES)


def api_key_resolve(stored: str) -> str:
    """The key to send: the stored text, or the environment variable an `env:` names
    (NAME_FILE first, as for the settings). Missing: "" (the provider sends none)."""
    match = ENV_KEY.match(stored)
    if match is None:
        return stored
    name = match.group(1)
    if name in SETTINGS_KEYS:  # read at start-up with their defaults and NAME_FILE
        return str(getattr(settings, name))
    if not env_key_allowed(name):
        log.warning("provider key refers to a variable that is not a key", extra={"variable": name})
        return ""
    try:
        value = envsecret(name, "")
    except ImproperlyConfigured:
        log.warning("provider key file unreadable", extra={"variable": name})
        return ""
    if not value:
        log.warning("provider key variable not set", extra={"variable": name})
    return value


def provider_spec(config: ProviderConfig, env_options: Mapping[str, dict[str, Any]]) -> ProviderSpec:
    """What the pipeline builds this config's provider from: the environment's options for
    the kind, overlaid by the fields the config sets.

    A config with a base URL of its own never inherits the environment's key: a second
    endpoint must not receive the first one's credentials."""
    kwargs = dict(env_options.get(f"{config.stage}.{config.kind}") or {})
    if config.base_url:
        kwargs.pop("api_key", None)
        kwargs["base_url"] = config.base_url
    kwargs.update(config.options or {})
    if config.api_key:
        kwargs["api_key"] = api_key_resolve(config.api_key)
    if config.model:
        kwargs["model"] = config.model
    if config.voice:
        kwargs["voice"] = config.voice
    if config.timeout:
        kwargs["timeout"] = float(config.timeout)
    return ProviderSpec(
        name=config.name, kind=config.kind, kwargs=kwargs,
        model=config.model if config.stage in ("llm", "vision") else "", voice=config.voice,
    )


def persona_chain_specs(
    persona: Persona, env_options: Mapping[str, dict[str, Any]], stages: tuple[str, ...] = CHAIN_STAGES,
) -> dict[str, tuple[ChainEntry, ...]]:
    """Each stage's chain as specs, in one query. A stage without configs (a persona made in
    code, never edited) gets the default kinds with the environment's options."""
    chains: dict[str, list[ChainEntry]] = {stage: [] for stage in stages}
    links = (PersonaProvider.objects.filter(persona=persona, config__stage__in=stages)
             .select_related("config").order_by("position", "pk"))
    for link in links:
        chains[link.config.stage].append(provider_spec(link.config, env_options))
    return {stage: tuple(entries) or tuple(DEFAULT_CHAINS.get(stage, ())) for stage, entries in chains.items()}


def persona_first_kinds(persona_ids: Iterable[int] | None = None) -> dict[int, dict[str, str]]:
    """Each persona's first provider kind per stage (the head of its chain; a stage without
    configs runs the default chain). None: every persona."""
    personas = Persona.objects.all() if persona_ids is None else Persona.objects.filter(pk__in=list(persona_ids))
    firsts = {pk: dict.fromkeys(CHAIN_STAGES, "") for pk in personas.values_list("pk", flat=True)}
    links = (PersonaProvider.objects.filter(persona_id__in=list(firsts), config__stage__in=CHAIN_STAGES)
             .order_by("persona_id", "position", "pk").values_list("persona_id", "config__stage", "config__kind"))
    for pk, stage, kind in links:
        firsts[pk][stage] = firsts[pk][stage] or kind
    for stages in firsts.values():
        for stage in CHAIN_STAGES:
            stages[stage] = stages[stage] or DEFAULT_CHAINS[stage][0]
    return firsts


def env_provider_options() -> dict[str, dict[str, Any]]:
    """Constructor options per provider from the environment, keyed "<stage>.<kind>" (kinds
    repeat across stages): the defaults a config's empty fields fall back to.

    OpenAI-compatible ASR/TTS appear only when their base URL is set: without one they
    cannot work, and leaving them out makes the fallback chain skip them with a log line.
    """
    options: dict[str, dict[str, Any]] = {
        "llm.openai": {"base_url": settings.LLM_BASE_URL, "api_key": settings.LLM_API_KEY,
                       "timeout": settings.LLM_TIMEOUT},
        "asr.faster_whisper": {"model": settings.ASR_WHISPER_MODEL,
                               "compute_type": settings.ASR_WHISPER_COMPUTE_TYPE,
                               "threads": settings.ASR_WHISPER_THREADS,
                               "max_concurrency": settings.ASR_MAX_CONCURRENCY,
                               "fast_pass": settings.ASR_WHISPER_FAST_PASS,
                               "timeout": settings.ASR_TIMEOUT},
        "turn.smart_turn": {"threads": settings.XIAOZHI_TURN_MODEL_THREADS,
                            "concurrency": settings.XIAOZHI_TURN_MODEL_CONCURRENCY},
        "tts.edge": {"connect_timeout": settings.TTS_EDGE_CONNECT_TIMEOUT, "timeout": settings.TTS_TIMEOUT},
        "tts.piper": {"voices_dir": str(settings.XIAOZHI_PIPER_VOICES_DIR), "timeout": settings.TTS_TIMEOUT},
        "tts.espeak": {"binary": settings.ESPEAK_BINARY, "timeout": settings.TTS_TIMEOUT},
        "vision.openai": {"base_url": settings.XIAOZHI_VISION_BASE_URL or settings.LLM_BASE_URL,
                          "api_key": settings.XIAOZHI_VISION_API_KEY or settings.LLM_API_KEY,
                          "timeout": settings.LLM_TIMEOUT},
    }
    if settings.ASR_OPENAI_BASE_URL:
        options["asr.openai"] = {"base_url": settings.ASR_OPENAI_BASE_URL, "api_key": settings.ASR_OPENAI_API_KEY,
                                 "model": settings.ASR_OPENAI_MODEL, "timeout": settings.ASR_TIMEOUT}
    if settings.TTS_OPENAI_BASE_URL:
        options["tts.openai"] = {"base_url": settings.TTS_OPENAI_BASE_URL, "api_key": settings.TTS_OPENAI_API_KEY,
                                 "model": settings.TTS_OPENAI_MODEL, "timeout": settings.TTS_TIMEOUT}
    return options
