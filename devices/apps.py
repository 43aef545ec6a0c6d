from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DevicesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "devices"
    verbose_name = _("Devices")

    def ready(self) -> None:
        from devices import checks  # noqa: F401  (registers the start-up checks)
