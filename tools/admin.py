from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from tools.models import McpServer, McpTool
from tools.services import mcp_server_refresh_tools


class McpToolInline(admin.TabularInline):
    model = McpTool
    fields = ("name", "description")
    readonly_fields = ("name", "description")
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: McpServer | None = None) -> bool:
        return False


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    list_display = ("name", "url", "transport", "enabled", "healthy", "tool_count", "last_refresh_at", "last_error")
    list_filter = ("enabled", "healthy", "transport")
    search_fields = ("name", "url")
    readonly_fields = ("healthy", "last_refresh_at", "last_error", "created_at")
    actions = ["refresh_tools"]
    inlines = [McpToolInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[McpServer]:
        return super().get_queryset(request).annotate(_tool_count=Count("tools"))

    @admin.display(description="tools", ordering="_tool_count")
    def tool_count(self, obj: McpServer) -> int:
        return obj._tool_count

    @admin.action(description="Refresh tool catalogue now")
    def refresh_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            count = mcp_server_refresh_tools(server=server)
            if count < 0:
                self.message_user(request, f"{server.name}: {server.last_error}", messages.ERROR)
            else:
                self.message_user(request, f"{server.name}: {count} tools")
