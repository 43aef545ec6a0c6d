"""Django side of the gateway: what a session is built from (the personas offered to the
role-play tools, the LLM chain from settings). Its history goes through the process's one
writer (conversations/services.py `HISTORY`), like the devices'."""
from __future__ import annotations

from django.conf import settings

from conversations.models import Persona
from conversations.pipeline.fallback import ProviderChain, build_chain
from conversations.selectors import provider_settings

LLM_PROVIDERS = ("openai",)  # the OpenAI-compatible LLM of the LLM_* settings
_LLM_TIMEOUT_MARGIN = 5.0  # the session's own LLM deadline (LLM_TIMEOUT) must fire first (→ TIMEOUT)


def gateway_characters() -> list[dict[str, str]]:
    """Personas offered to the role-play tools (`list_available_characters`)."""
    return [
        {"name": name, "description": description}
        for name, description in Persona.objects.order_by("name").values_list("name", "description")
    ]


def gateway_llm_chain() -> ProviderChain:
    """The gateway's LLM, built through the same fallback chain as a device's. Its slots wait
    for the first token as long as the provider's own timeout, so the session's per-round
    LLM_TIMEOUT decides when a silent LLM is a TIMEOUT, as the seed documents."""
    configs = provider_settings()
    configs["llm.openai"] = {**configs["llm.openai"], "timeout": settings.LLM_TIMEOUT + _LLM_TIMEOUT_MARGIN}
    return build_chain("llm", LLM_PROVIDERS, configs, max_first_token_wait=None)
