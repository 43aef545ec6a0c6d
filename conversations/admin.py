"""Admin for personas (what a device is) and conversation history (what it said).

A persona's provider chains are ordered lists of provider configurations, edited inline
(conversations/admin_providers.py, which also holds the configurations' own admin). History is
read-only: it is evidence, edited by nobody. A conversation opens as a chat page
(templates/admin/conversations/conversation/review.html, data from conversations/review.py)
with its audio served by conversations/audio_views.py and a JSON export beside it.
"""
from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from conversations.admin_providers import (
    CHAIN_INLINES,
    chain_formset_kwargs,
    chains_summary,
    persona_test_view,
    staff_async_view,
    voice_picker_attrs,
)
from conversations.admin_filters import (
    HAS_ERROR,
    INTERRUPTED,
    DeviceFilter,
    EmotionFilter,
    HasErrorsFilter,
    InterruptedFilter,
    OwnerFilter,
    TurnsFilter,
    count_turns,
)
from conversations.audio_views import turn_audio
from conversations.gateway.keys import gateway_key_issue, gateway_keys_disconnect, gateway_keys_revoke
from conversations.models import DEFAULT_CHAINS, Conversation, GatewayKey, Persona, Turn
from conversations.review import (
    TURNS_PER_PAGE,
    conversation_export,
    conversation_title,
    conversation_turns_page,
)
from devices.auth import normalize_mac
from devices.models import Device
from tools.builtin import BUILTIN_TOOLS

_TRUNCATE = 80


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
    exit_phrases = LineListField(
        label=_("Exit phrases"), required=False, help_text=_("One per line; matched without case or punctuation.")
    )
    device_tool_exclusions = LineListField(
        label=_("Excluded device tools"), required=False, help_text=_("Device tool names to hide, one per line.")
    )
    # Tool names are identifiers the LLM sees; they are shown as they are.
    server_tools = forms.MultipleChoiceField(
        label=_("Server tools"), choices=[(name, name) for name in BUILTIN_TOOLS], required=False,
        widget=forms.CheckboxSelectMultiple, help_text=_("Built-in tools offered; none ticked offers all."),
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
            self.add_error("vad_threshold_low", gettext("Must not be above the speech threshold."))
        pause, longest = data.get("turn_pause_ms"), data.get("turn_max_silence_ms")
        if pause is not None and longest is not None and pause >= longest:
            self.add_error("turn_pause_ms", gettext("Must be shorter than the maximum silence."))
        return data


@admin.register(Persona)
class PersonaAdmin(admin.ModelAdmin):
    form = PersonaAdminForm
    inlines = CHAIN_INLINES
    list_display = ("name", "language", "llm_model", "providers", "is_default", "updated_at")
    list_filter = ("language", "is_default")
    search_fields = ("name", "description")
    filter_horizontal = ("mcp_servers",)
    readonly_fields = ("created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "description", "is_default")}),
        (_("Prompt and phrases"), {"fields": ("system_prompt", "language", "greeting", "farewell", "exit_phrases")}),
        (_("Voice and models"), {"fields": (
            "voice", "llm_model", "temperature",
            "max_tokens", "context_turns",
        )}),
        (_("Turn-taking (voice activity detection)"), {"fields": (
            "turn_detection", "turn_pause_ms", "turn_max_silence_ms", "early_reply",
            "vad_threshold", "vad_threshold_low", "vad_min_silence_ms",
        )}),
        (_("Interrupting a reply (barge-in)"), {
            "fields": ("barge_in_min_ms", "barge_in_min_probability"),
            "description": _(
                "Devices in realtime mode keep listening while they speak, so the user can interrupt the "
                "reply by talking. For devices that ask the server to cancel their echo, only the user's "
                "voice counts: the device's own voice never interrupts and never starts a turn."
            ),
        }),
        (_("Tools"), {"fields": ("server_tools", "mcp_servers", "device_tools_enabled", "device_tool_exclusions")}),
        (_("Conversation review"), {"fields": ("record_audio",)}),
        (_("Record"), {"classes": ("collapse",), "fields": ("created_at", "updated_at")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Persona]:
        return super().get_queryset(request).prefetch_related("provider_links__config")

    def get_urls(self) -> list[URLPattern]:
        view = staff_async_view("conversations.change_persona")(persona_test_view)
        # django-stubs' path() knows sync views only; Django serves async ones too.
        route = path("<path:object_id>/test/", view, name="conversations_persona_test")  # type: ignore[arg-type]
        return [route, *super().get_urls()]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any,
                           **kwargs: Any) -> HttpResponse:
        voice = context["adminform"].form.fields.get("voice")
        obj = kwargs.get("obj")
        if voice is not None and obj is not None and obj.pk:
            # The voices of the saved TTS chain's engines, for the persona's language; the
            # preview speaks through the chain's first configuration.
            chain = obj.chain("tts")
            voice.widget.attrs.update(voice_picker_attrs(
                kinds=[config.kind for config in chain] or DEFAULT_CHAINS["tts"], language_source="id_language",
                preview_url=reverse("admin:conversations_providerconfig_test", args=[chain[0].pk]) if chain else ""))
        return super().render_change_form(request, context, *args, **kwargs)

    def get_formset_kwargs(self, request: HttpRequest, obj: Any, inline: Any, prefix: str) -> dict[str, Any]:
        return {**super().get_formset_kwargs(request, obj, inline, prefix), **chain_formset_kwargs(inline, obj)}

    @admin.display(description="ASR / LLM / TTS")
    def providers(self, persona: Persona) -> str:
        return chains_summary(persona)


# --- Conversation review ------------------------------------------------------------------------


def _short(text: str) -> str:
    return text if len(text) <= _TRUNCATE else text[: _TRUNCATE - 1] + "…"


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    """Read-only review: the list finds conversations, the page reads each one like a chat."""

    list_display = ("conversation", "turn_count", "issues", "source")
    list_display_links = ("conversation",)
    list_filter = (TurnsFilter, "source", ("started_at", admin.DateFieldListFilter), OwnerFilter, DeviceFilter,
                   "persona", HasErrorsFilter, InterruptedFilter)
    search_fields = ("session_id", "device__mac", "device__name", "turns__user_text", "turns__reply_text")
    search_help_text = _("Searches what was said and replied, device names and MACs, session ids.")
    list_per_page = 50
    show_full_result_count = False  # one count of the filtered list is enough
    review_template = "admin/conversations/conversation/review.html"

    class Media:
        css = {"all": ("conversations/review.css",)}  # the list's issue marks

    def get_queryset(self, request: HttpRequest) -> QuerySet[Conversation]:
        return super().get_queryset(request).select_related("device__owner", "persona").annotate(
            turn_count=count_turns(), error_count=count_turns(HAS_ERROR),
            interrupted_count=count_turns(INTERRUPTED),
        )

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        """The whole term as one phrase, in what was said or replied (trigram-indexed on
        PostgreSQL), in device names and MACs (as printed on labels), or a session id.
        Each part is its own indexed query: one OR across joined tables would scan."""
        term = search_term.strip()
        if not term:
            return queryset, False
        mac = normalize_mac(term)
        devices = Device.objects.filter(Q(name__icontains=term) | (Q(mac=mac) if mac else Q(mac__icontains=term)))
        said = Turn.objects.filter(Q(user_text__icontains=term) | Q(reply_text__icontains=term))
        matches = Q(pk__in=said.values("conversation_id")) | Q(device__in=devices.values("pk")) | Q(session_id=term)
        return queryset.filter(matches), False

    @admin.display(description=_("conversation"), ordering="started_at")
    def conversation(self, conversation: Conversation) -> str:
        return conversation_title(conversation)

    @admin.display(description=_("turns"))  # not sortable: that would count every conversation's turns
    def turn_count(self, conversation: Conversation) -> int:
        return getattr(conversation, "turn_count", 0)

    @admin.display(description=_("issues"))
    def issues(self, conversation: Conversation) -> str:
        errors = getattr(conversation, "error_count", 0)
        interrupted = getattr(conversation, "interrupted_count", 0)
        parts = []
        if errors:
            text = ngettext("%(count)d error", "%(count)d errors", errors) % {"count": errors}
            parts.append(format_html('<span class="xz-issue xz-issue-error">{}</span>', text))
        if interrupted:
            text = ngettext("%(count)d interrupted", "%(count)d interrupted", interrupted) % {"count": interrupted}
            parts.append(format_html('<span class="xz-issue">{}</span>', text))
        return format_html(" ".join(["{}"] * len(parts)), *parts) if parts else "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("audio/<int:turn_id>/<str:track>/", view(turn_audio), name="conversations_turn_audio"),
            path("<path:object_id>/export/", view(self.export_view), name="conversations_conversation_export"),
            *super().get_urls(),
        ]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        conversation = self._viewable(request, object_id)
        if conversation is None:
            # A private ModelAdmin helper (not in django-stubs): the admin's own "not found" redirect.
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        page, turns = conversation_turns_page(conversation, request.GET.get("page"), _audio_url)
        title = conversation_title(conversation, getattr(conversation, "turn_count", page.paginator.count))
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "title": title,
            "subtitle": None, "conversation": conversation, "original": conversation, "page": page,
            "turns": turns, "has_delete_permission": self.has_delete_permission(request, conversation),
            "export_url": reverse("admin:conversations_conversation_export", args=[conversation.pk]),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.review_template, context)

    def export_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        conversation = self._viewable(request, object_id)
        if conversation is None:
            return HttpResponse(status=404)

        def absolute(turn_id: int, track: str) -> str:
            return request.build_absolute_uri(_audio_url(turn_id, track))

        response = JsonResponse(conversation_export(conversation, absolute),
                                json_dumps_params={"ensure_ascii": False, "indent": 2})
        response["Content-Disposition"] = f'attachment; filename="conversation-{conversation.pk}.json"'
        return response

    def _viewable(self, request: HttpRequest, object_id: str) -> Conversation | None:
        conversation = self.get_object(request, unquote(object_id))
        if conversation is not None and not self.has_view_permission(request, conversation):
            raise PermissionDenied
        return conversation


def _audio_url(turn_id: int, track: str) -> str:
    return reverse("admin:conversations_turn_audio", args=[turn_id, track])


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):
    """Every turn across conversations, newest first, for finding what people asked; a turn
    opens in its conversation's page."""

    list_display = ("created_at", "device", "said", "replied", "emotion", "interrupted", "has_error")
    list_filter = (("created_at", admin.DateFieldListFilter), "conversation__source", "interrupted", EmotionFilter)
    search_fields = ("user_text", "reply_text")
    search_help_text = _("Searches what was said and replied (the whole text as one phrase).")
    list_select_related = ("conversation__device",)
    ordering = ("-created_at",)
    list_per_page = 50
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Turn]:
        # The list shows two short texts; the JSON blobs stay in the database until opened.
        return super().get_queryset(request).defer("tool_calls", "timings", "providers", "provider_attempts")

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(user_text__icontains=term) | Q(reply_text__icontains=term)), False

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        turn = self.get_object(request, unquote(object_id))
        if turn is None:
            # A private ModelAdmin helper (not in django-stubs): the admin's own "not found" redirect.
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        if not self.has_view_permission(request, turn):
            raise PermissionDenied
        url = reverse("admin:conversations_conversation_change", args=[turn.conversation_id])
        before = Turn.objects.filter(conversation_id=turn.conversation_id, index__lt=turn.index).count()
        return redirect(f"{url}?page={before // TURNS_PER_PAGE + 1}#turn-{turn.index}")

    @admin.display(description=_("device"))
    def device(self, turn: Turn) -> Any:
        return turn.conversation.device or "—"

    @admin.display(description=_("user said"))
    def said(self, turn: Turn) -> str:
        return _short(turn.user_text)

    @admin.display(description=_("reply"))
    def replied(self, turn: Turn) -> str:
        return _short(turn.reply_text)

    @admin.display(description=_("error"), boolean=True)
    def has_error(self, turn: Turn) -> bool:
        return bool(turn.error)

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

    def get_fields(self, request: HttpRequest, obj: GatewayKey | None = None) -> tuple[str, ...]:
        fields = ("name", "persona", "requests_per_minute", "max_connections")
        return fields if obj is None else (*fields, "prefix", "created_at", "last_used_at", "revoked_at")

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
