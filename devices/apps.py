from __future__ import annotations

from django.apps import AppConfig


class DevicesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "devices"

    def ready(self) -> None:
        from devices import checks  # noqa: F401  (registers the start-up checks)
