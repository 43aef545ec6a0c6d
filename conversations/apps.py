from __future__ import annotations

import logging
from importlib import import_module

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

logger = logging.getLogger(__name__)


class ConversationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "conversations"
    verbose_name = _("Conversations")

    def ready(self) -> None:
        from conversations import recording  # noqa: F401, PLC0415 - connects the file-deleting signal

        load_provider_plugins(getattr(settings, "XIAOZHI_PROVIDER_PLUGINS", []))
        connect_persona_config_clearing()


def connect_persona_config_clearing() -> None:
    """Any change a persona's configuration depends on clears the cache of built
    configurations (conversations/selectors.py) in this process at once."""
    from django.core.signals import setting_changed  # noqa: PLC0415
    from django.db.models.signals import m2m_changed, post_delete, post_save  # noqa: PLC0415

    from conversations.models import Persona, PersonaProvider, ProviderConfig  # noqa: PLC0415
    from conversations.selectors import persona_configs_clear  # noqa: PLC0415
    from tools.models import McpServer, McpTool  # noqa: PLC0415

    for model in (Persona, PersonaProvider, ProviderConfig, McpServer, McpTool):
        post_save.connect(persona_configs_clear, sender=model, dispatch_uid=f"persona-configs-saved-{model.__name__}")
        post_delete.connect(persona_configs_clear, sender=model,
                            dispatch_uid=f"persona-configs-deleted-{model.__name__}")
    m2m_changed.connect(persona_configs_clear, sender=Persona.mcp_servers.through,
                        dispatch_uid="persona-configs-mcp-servers")
    setting_changed.connect(persona_configs_clear, dispatch_uid="persona-configs-settings")


def load_provider_plugins(modules: list[str]) -> None:
    """Import each plugin module once at startup; importing it may add provider kinds to
    `conversations.providers.registry.REGISTRY` (e.g. `testing.fake_providers` for tests and
    benchmarks). A plugin that cannot be imported stops the start: a persona would otherwise
    silently fall back to other providers."""
    for name in modules:
        try:
            import_module(name)
        except ImportError as exc:
            raise ImproperlyConfigured(f"XIAOZHI_PROVIDER_PLUGINS: cannot import {name!r}: {exc}") from exc
        logger.info("provider plugin loaded", extra={"plugin": name})
