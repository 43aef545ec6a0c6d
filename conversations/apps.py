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
