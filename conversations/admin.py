"""Admin for personas (what a device is) and conversation history (what it said).

Provider lists are edited as ordered, comma-separated kinds checked against the provider
registry, so a persona can never name a provider the code does not know. History is
read-only: it is evidence, edited by nobody.
"""
from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from conversations.gateway.keys import gateway_key_issue, gateway_keys_disconnect, gateway_keys_revoke
from conversations.models import Conversation, GatewayKey, Persona, Turn
from conversations.providers import registry
from tools.builtin import BUILTIN_TOOLS

_TRUNCATE = 80


class KindListField(forms.CharField):
    """An ordered list of provider kinds, typed as "edge, espeak" (first = preferred)."""

    def __init__(self, stage: str, **kwargs: Any) -> None:
        self.stage = stage
        known = ", ".join(registry.REGISTRY[stage])
        kwargs.setdefault("help_text", f"In fallback order, comma-separated. Known: {known}.")
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("["):
            value = json.loads(value)  # a re-rendered bound form gives the JSON text back
        return ", ".join(value) if isinstance(value, (list, tuple)) else value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value)
        return [kind.strip() for kind in text.replace("\n", ",").split(",") if kind.strip()]

    def validate(self, value: list[str]) -> None:  # type: ignore[override]
        if not value:
            raise forms.ValidationError("Name at least one provider.")
        unknown = [kind for kind in value if kind not in registry.REGISTRY[self.stage]]
        if unknown:
            raise forms.ValidationError(f"Unknown {self.stage} provider(s): {', '.join(unknown)}.")
        if len(set(value)) != len(value):
            raise forms.ValidationError("Each provider may appear only once.")


class LineListField(forms.CharField):
    """A list of strings, one per line (exit phrases, excluded device tools)."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("["):
            value = json.loads(value)
        return "\n".join(value) if isinstance(value, (list, tuple)) else value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        return [line.strip() for line in (super().to_python(value) or "").splitlines() if line.strip()]


class PersonaAdminForm(forms.ModelForm):
    asr_providers = KindListField("asr", label="ASR providers")
    llm_providers = KindListField("llm", label="LLM providers")
    tts_providers = KindListField("tts", label="TTS providers")
    exit_phrases = LineListField(required=False, help_text="One per line; matched without case or punctuation.")
    device_tool_exclusions = LineListField(required=False, help_text="Device tool names to hide, one per line.")
    server_tools = forms.MultipleChoiceField(
        choices=[(name, name) for name in BUILTIN_TOOLS], required=False,
        widget=forms.CheckboxSelectMultiple, help_text="Built-in tools offered; none ticked offers all.",
    )

    class Meta:
        model = Persona
        fields = "__all__"

    def clean_server_tools(self) -> list[str] | None:
        return list(self.cleaned_data["server_tools"]) or None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        high, low = data.get("vad_threshold"), data.get("vad_threshold_low")
        if high is not None and low is not None and low > high:
            self.add_error("vad_threshold_low", "Must not be above the speech threshold.")
        return data


@admin.register(Persona)
class PersonaAdmin(admin.ModelAdmin):
    form = PersonaAdminForm
    list_display = ("name", "language", "llm_model", "providers", "is_default", "updated_at")
    list_filter = ("language", "is_default")
    search_fields = ("name", "description")
    filter_horizontal = ("mcp_servers",)
    readonly_fields = ("created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "description", "is_default")}),
        ("Prompt and phrases", {"fields": ("system_prompt", "language", "greeting", "farewell", "exit_phrases")}),
        ("Voice and models", {"fields": (
            "voice", "asr_providers", "llm_providers", "tts_providers", "llm_model", "temperature",
            "max_tokens", "context_turns",
        )}),
        ("Turn-taking (voice activity detection)", {"fields": (
            "vad_threshold", "vad_threshold_low", "vad_min_silence_ms",
        )}),
        ("Tools", {"fields": ("server_tools", "mcp_servers", "device_tools_enabled", "device_tool_exclusions")}),
        ("Record", {"classes": ("collapse",), "fields": ("created_at", "updated_at")}),
    )

    @admin.display(description="ASR / LLM / TTS")
    def providers(self, persona: Persona) -> str:
        stages = (persona.asr_providers, persona.llm_providers, persona.tts_providers)
        return " / ".join(" → ".join(kinds or []) for kinds in stages)


def _short(text: str) -> str:
    return text if len(text) <= _TRUNCATE else text[: _TRUNCATE - 1] + "…"


class TurnInline(admin.TabularInline):
    model = Turn
    extra = 0
    can_delete = False
    show_change_link = False
    fields = ("index", "user_text", "reply_text", "emotion", "tools", "stage_providers", "stage_timings",
              "interrupted", "error", "audio")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="tool calls")
    def tools(self, turn: Turn) -> str:
        calls = turn.tool_calls or []
        return format_html_join(
            "\n", "<div>{} {} <small>{} ms</small></div>",
            ((("✔" if c.get("success") else "✘"), c.get("name", "?"), c.get("duration_ms", "")) for c in calls),
        ) or "—"

    @admin.display(description="providers")
    def stage_providers(self, turn: Turn) -> str:
        return ", ".join(f"{stage}: {kind}" for stage, kind in (turn.providers or {}).items()) or "—"

    @admin.display(description="timings (ms after speech end)")
    def stage_timings(self, turn: Turn) -> str:
        return ", ".join(f"{key} {value:g}" for key, value in (turn.timings or {}).items()) or "—"

    @admin.display(description="user audio")
    def audio(self, turn: Turn) -> str:
        if not turn.user_audio:
            return "—"
        return format_html('<audio controls preload="none" src="{}"></audio>', turn.user_audio.url)


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("started_at", "source", "device", "persona", "turn_count", "ended_at", "session_id")
    list_filter = ("source", ("device", admin.RelatedOnlyFieldListFilter), "persona")
    search_fields = ("session_id", "device__mac", "device__name")
    list_select_related = ("device", "persona")
    date_hierarchy = "started_at"
    inlines = (TurnInline,)
    readonly_fields = ("session_id", "source", "device", "persona", "client_address", "started_at", "ended_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Conversation]:
        return super().get_queryset(request).annotate(turn_count=Count("turns"))

    @admin.display(description="turns", ordering="turn_count")
    def turn_count(self, conversation: Conversation) -> int:
        return getattr(conversation, "turn_count", 0)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):
    """All turns across conversations, for searching what people asked."""

    list_display = ("created_at", "device", "said", "replied", "emotion", "interrupted", "error")
    list_filter = ("conversation__source", ("conversation__device", admin.RelatedOnlyFieldListFilter),
                   "interrupted", "emotion")
    search_fields = ("user_text", "reply_text", "conversation__session_id")
    list_select_related = ("conversation__device",)
    date_hierarchy = "created_at"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Turn]:
        # The list shows two short texts; the JSON blobs stay in the database until opened.
        return super().get_queryset(request).defer("tool_calls", "timings", "providers")

    @admin.display(description="device", ordering="conversation__device")
    def device(self, turn: Turn) -> Any:
        return turn.conversation.device

    @admin.display(description="user said")
    def said(self, turn: Turn) -> str:
        return _short(turn.user_text)

    @admin.display(description="reply")
    def replied(self, turn: Turn) -> str:
        return _short(turn.reply_text)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class GatewayKeyStatusFilter(admin.SimpleListFilter):
    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("active", _("active")), ("revoked", _("revoked"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[GatewayKey]) -> QuerySet[GatewayKey]:
        if self.value() in ("active", "revoked"):
            return queryset.filter(revoked_at__isnull=self.value() == "active")
        return queryset


@admin.register(GatewayKey)
class GatewayKeyAdmin(admin.ModelAdmin):
    """LLM Gateway API keys (docs/security.md). The key is shown once, on the page after
    "Save" of a new key; only its hash is stored. Revoking is final and closes the key's live
    connections; edit the limits or the persona at any time (they apply to new connections)."""

    list_display = ("name", "prefix", "persona", "requests_per_minute", "max_connections", "active", "last_used_at")
    list_filter = (GatewayKeyStatusFilter, "persona")
    search_fields = ("name", "prefix")
    list_select_related = ("persona",)
    actions = ("revoke",)

    def get_fields(self, request: HttpRequest, obj: GatewayKey | None = None) -> list[str]:
        fields = ["name", "persona", "requests_per_minute", "max_connections"]
        return fields if obj is None else fields + ["prefix", "created_at", "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: GatewayKey | None = None) -> list[str]:
        return [] if obj is None else ["prefix", "created_at", "last_used_at", "revoked_at"]

    @admin.display(description=_("active"), boolean=True, ordering="revoked_at")
    def active(self, key: GatewayKey) -> bool:
        return key.is_active

    def save_model(self, request: HttpRequest, obj: GatewayKey, form: Any, change: bool) -> None:
        if not change:
            obj.issued_secret = gateway_key_issue(obj)  # type: ignore[attr-defined]  # for response_add only
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: GatewayKey, post_url_continue: str | None = None) -> Any:
        """The one page that shows the key: rendered here, never stored or redirected."""
        context = {
            **self.admin_site.each_context(request),
            "title": _("Gateway API key created"),
            "opts": self.opts,
            "key": obj,
            "secret": obj.issued_secret,  # type: ignore[attr-defined]
        }
        return TemplateResponse(request, "admin/conversations/gatewaykey/created.html", context)

    @admin.action(description=_("Revoke selected keys (final; closes their connections)"))
    def revoke(self, request: HttpRequest, queryset: QuerySet[GatewayKey]) -> None:
        count = gateway_keys_revoke(queryset)
        message = ngettext("%(count)d key revoked.", "%(count)d keys revoked.", count) % {"count": count}
        self.message_user(request, message)

    def delete_model(self, request: HttpRequest, obj: GatewayKey) -> None:
        key_id = obj.pk
        super().delete_model(request, obj)
        gateway_keys_disconnect([key_id])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[GatewayKey]) -> None:
        key_ids = list(queryset.values_list("pk", flat=True))
        super().delete_queryset(request, queryset)
        gateway_keys_disconnect(key_ids)
