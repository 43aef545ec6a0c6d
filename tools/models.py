"""Remote MCP servers and their cached tool catalogues."""
from __future__ import annotations

from django.db import models


class McpServer(models.Model):
    TRANSPORT_STREAMABLE_HTTP = "streamable_http"
    TRANSPORT_SSE = "sse"
    TRANSPORTS = [(TRANSPORT_STREAMABLE_HTTP, "Streamable HTTP"), (TRANSPORT_SSE, "SSE")]

    name = models.SlugField(max_length=50, unique=True, help_text="Short name shown in the admin and used in persona tool policies.")
    url = models.URLField(max_length=500)
    transport = models.CharField(max_length=20, choices=TRANSPORTS, default=TRANSPORT_STREAMABLE_HTTP)
    headers = models.JSONField(default=dict, blank=True, help_text='Extra HTTP headers, e.g. {"Authorization": "Bearer …"}.')
    enabled = models.BooleanField(default=True)

    healthy = models.BooleanField(default=False)
    last_refresh_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class McpTool(models.Model):
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)

    class Meta:
        ordering = ["server", "name"]
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="unique_server_tool")]

    def __str__(self) -> str:
        return f"{self.server.name}:{self.name}"
