"""Django side of the gateway: what a session is built from (the personas offered to the
role-play tools, the LLM chain of its persona's configurations and the model asked of them).
Its history goes through the process's one writer (conversations/services.py `HISTORY`), like
the devices'."""
from __future__ import annotations

from dataclasses import dataclass, replace

from django.conf import settings

from conversations.models import Persona
from conversations.pipeline.config import ChainEntry, ProviderSpec, persona_llm_model
from conversations.pipeline.fallback import ProviderChain, build_chain, chain_specs
from conversations.provider_configs import env_provider_options, persona_chain_specs
from conversations.selectors import persona_default

_LLM_TIMEOUT_MARGIN = 5.0  # the session's own LLM deadline (LLM_TIMEOUT) must fire first (→ TIMEOUT)


def gateway_characters() -> list[dict[str, str]]:
    """Personas offered to the role-play tools (`list_available_characters`)."""
    return [
        {"name": name, "description": description}
        for name, description in Persona.objects.order_by("name").values_list("name", "description")
    ]


@dataclass(frozen=True)
class GatewayLLM:
    """What a gateway session asks its LLM with: the chain's configurations, and the model
    asked of those that name none (the rule of `persona_llm_model`, as for a device)."""

    specs: tuple[ProviderSpec, ...]
    model: str


def gateway_persona(persona_id: int | None = None) -> Persona:
    """The key's persona (None, or gone: the default persona)."""
    persona = Persona.objects.filter(pk=persona_id).first() if persona_id is not None else None
    return persona or persona_default()


def gateway_llm(persona_id: int | None = None) -> GatewayLLM:
    """The LLM chain and model of the key's persona (None, or gone: the default persona's)."""
    persona = gateway_persona(persona_id)
    return GatewayLLM(_llm_specs(persona), persona_llm_model(persona.llm_model, settings.LLM_MODEL))


def gateway_llm_specs(persona_id: int | None = None) -> tuple[ProviderSpec, ...]:
    """The LLM chain of the key's persona (None, or gone: the default persona's), as specs."""
    return _llm_specs(gateway_persona(persona_id))


def _llm_specs(persona: Persona) -> tuple[ProviderSpec, ...]:
    """A configuration's own timeout shorter than LLM_TIMEOUT is kept, so a slow first endpoint
    falls over to the next in time; otherwise the session's per-round LLM_TIMEOUT must fire
    first (→ TIMEOUT, as the seed documents), so the SDK's timeout is set a little longer."""
    env_options = env_provider_options()
    entries: tuple[ChainEntry, ...] = persona_chain_specs(persona, env_options, stages=("llm",))["llm"]
    session_limit = settings.LLM_TIMEOUT + _LLM_TIMEOUT_MARGIN
    specs = []
    for spec in chain_specs("llm", entries, env_options):
        timeout = float(spec.kwargs.get("timeout") or session_limit)
        kwargs = {**spec.kwargs, "timeout": timeout if timeout < settings.LLM_TIMEOUT else session_limit}
        specs.append(replace(spec, kwargs=kwargs))
    return tuple(specs)


def gateway_llm_chain(specs: tuple[ProviderSpec, ...] | None = None) -> ProviderChain:
    """The gateway's LLM, built through the same fallback chain as a device's. Its slots wait
    for the first token as long as the provider's own timeout (see `gateway_llm_specs`)."""
    return build_chain("llm", gateway_llm_specs() if specs is None else specs, {}, max_first_token_wait=None)
