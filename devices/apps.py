from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DevicesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "devices"
    verbose_name = _("Devices")

    def ready(self) -> None:
        from django.db.models.signals import m2m_changed, post_delete, post_save

        from devices import checks  # noqa: F401  (registers the start-up checks)
        from devices.models import FirmwareRelease
        from devices.selectors import releases_cache_clear

        # The OTA check's cache of active releases (devices/selectors.py) forgets a change at once.
        post_save.connect(releases_cache_clear, sender=FirmwareRelease, dispatch_uid="releases-saved")
        post_delete.connect(releases_cache_clear, sender=FirmwareRelease, dispatch_uid="releases-deleted")
        m2m_changed.connect(releases_cache_clear, sender=FirmwareRelease.allowlist.through,
                            dispatch_uid="releases-allowlist")
