from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

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

    @admin.display(description=_("tools"), ordering="_tool_count")
    def tool_count(self, obj: McpServer) -> int:
        return obj._tool_count  # type: ignore[attr-defined]  # annotated by get_queryset

    @admin.action(description=_("Refresh tool catalogue now"))
    def refresh_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            count = mcp_server_refresh_tools(server=server)
            if count < 0:
                text = gettext("%(server)s: refresh failed: %(error)s") % {"server": server.name,
                                                                          "error": server.last_error}
                self.message_user(request, text, messages.ERROR)
            else:
                text = ngettext("%(server)s: %(count)d tool", "%(server)s: %(count)d tools", count)
                self.message_user(request, text % {"server": server.name, "count": count})
