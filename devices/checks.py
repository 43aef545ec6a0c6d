"""Start-up checks of the device edge (shown by `manage.py migrate`, which `make run` runs
first, and by `manage.py check --deploy`)."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security)
def public_url_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """With ALLOWED_HOSTS=* and no public URL, the OTA reply copies any request's Host header
    into the WebSocket URL a device stores: whoever can send a device's check-in (or answer
    for the server) can point it elsewhere."""
    public = settings.XIAOZHI_PUBLIC_WS_URL or settings.XIAOZHI_PUBLIC_BASE_URL
    if settings.DEBUG or public or "*" not in settings.ALLOWED_HOSTS:
        return []
    return [Warning(
        "DJANGO_ALLOWED_HOSTS is '*' and no public URL is set: the OTA reply hands devices a "
        "WebSocket URL built from whatever Host header the request carried.",
        hint="Set DJANGO_ALLOWED_HOSTS to this server's names, or XIAOZHI_PUBLIC_WS_URL "
             "(and XIAOZHI_PUBLIC_BASE_URL) to the addresses devices should use. See docs/security.md.",
        id="devices.W001",
    )]
