"""Remote MCP servers and their cached tool catalogues."""
from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class McpServer(models.Model):
    TRANSPORT_STREAMABLE_HTTP = "streamable_http"
    TRANSPORT_SSE = "sse"
    TRANSPORTS = [(TRANSPORT_STREAMABLE_HTTP, "Streamable HTTP"), (TRANSPORT_SSE, "SSE")]

    name = models.SlugField(
        _("name"), max_length=50, unique=True,
        help_text=_("Short name shown in the admin and used in persona tool policies."),
    )
    url = models.URLField(_("URL"), max_length=500)
    transport = models.CharField(_("transport"), max_length=20, choices=TRANSPORTS, default=TRANSPORT_STREAMABLE_HTTP)
    headers = models.JSONField(
        _("headers"), default=dict, blank=True, help_text=_('Extra HTTP headers, e.g. {"Authorization": "Bearer …"}.')
    )
    enabled = models.BooleanField(_("enabled"), default=True)

    healthy = models.BooleanField(_("healthy"), default=False)
    last_refresh_at = models.DateTimeField(_("last refresh"), null=True, blank=True)
    last_error = models.CharField(_("last error"), max_length=500, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("MCP server")
        verbose_name_plural = _("MCP servers")

    def __str__(self) -> str:
        return self.name


class McpTool(models.Model):
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools", verbose_name=_("server"))
    name = models.CharField(_("name"), max_length=200)
    description = models.TextField(_("description"), blank=True)
    input_schema = models.JSONField(_("input schema"), default=dict)

    class Meta:
        ordering = ["server", "name"]
        verbose_name = _("MCP tool")
        verbose_name_plural = _("MCP tools")
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="unique_server_tool")]

    def __str__(self) -> str:
        return f"{self.server.name}:{self.name}"
