from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ToolsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tools"
    verbose_name = _("Tools")

    def ready(self) -> None:
        from django.conf import settings

        from tools import limits

        # The tools code is Django-free: it gets its caps once, here.
        limits.configure(limits.ToolLimits(
            device_max_tools=settings.TOOLS_DEVICE_MAX_COUNT,
            device_max_pages=settings.TOOLS_DEVICE_MAX_PAGES,
            mcp_max_tools=settings.TOOLS_MCP_MAX_COUNT,
            schema_max_bytes=settings.TOOLS_SCHEMA_MAX_BYTES,
            schema_max_depth=settings.TOOLS_SCHEMA_MAX_DEPTH,
            description_max_chars=settings.TOOLS_DESCRIPTION_MAX_CHARS,
        ))  # fmt: skip
