"""Admin for provider configurations and the ordered chains a persona runs over them.

API keys are write-only: the form has a password box that is never filled back in, a
"clear" tick box, and shows only whether a key is set (or which environment variable it is
read from). The stored key never reaches a page, the admin history (which records changed
field names only) or a log line. A configuration a persona uses cannot be deleted (PROTECT);
Django's delete page then lists the chains that hold it.

A persona's chains are four inlines over PersonaProvider, one per stage (vision may be empty), each ordered by
`position`; chain_order.js adds up/down buttons that move rows and renumber positions.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, cast

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseForbidden, JsonResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect

from conversations.models import CHAIN_STAGES, DEFAULT_CHAINS, LANGUAGES, Persona, PersonaProvider, ProviderConfig
from conversations.pipeline.config import persona_llm_model
from conversations.probes import ProbeResult, probe
from conversations.provider_configs import (
    default_config_name,
    env_provider_options,
    provider_config_default,
    provider_spec,
)
from conversations.providers import registry
from conversations.providers.options import option_names
from conversations.providers.tts.voices import list_voices

AsyncView = Callable[..., Awaitable[HttpResponseBase]]
MAX_VOICES = 1000  # per kind: a datalist is not a place for more
logger = logging.getLogger(__name__)

STAGE_LABELS = {"asr": "ASR", "llm": "LLM", "tts": "TTS", "vision": _("Vision")}


def kind_choices() -> list[tuple[str, list[tuple[str, str]]]]:
    """Every kind the registry knows, grouped by stage (the model checks the pair)."""
    stages = [stage for stage, _label in ProviderConfig.STAGES]
    return [(str(STAGE_LABELS[stage]), [(kind, kind) for kind in registry.REGISTRY.get(stage, {})]) for stage in stages]


def key_status(config: ProviderConfig) -> str:
    if not config.api_key:
        return gettext("not set")
    if name := config.key_env_name:
        return gettext("from the environment variable %(name)s") % {"name": name}
    return gettext("set")


class OptionsField(forms.JSONField):
    """The options object as indented JSON; `null` or nothing is an empty object."""

    widget = forms.Textarea(attrs={"rows": 4, "cols": 60, "spellcheck": "false"})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value or {}, indent=2, ensure_ascii=False)

    def to_python(self, value: Any) -> Any:
        return super().to_python(value) or {}


class ProviderConfigAdminForm(forms.ModelForm):
    kind = forms.ChoiceField(label=_("Kind"), help_text=_("The provider implementation; it must suit the stage."))
    new_api_key = forms.CharField(
        label=_("New API key"), required=False, strip=True, max_length=500,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text=_("Write-only: leave empty to keep the current key. Or env:NAME (e.g. env:DEEPSEEK_API_KEY) "
                    "to read it from the environment when a session starts; NAME must end in _API_KEY or _TOKEN."),
    )
    clear_api_key = forms.BooleanField(label=_("Clear the API key"), required=False)
    options = OptionsField(label=_("Options"), required=False)

    class Meta:
        model = ProviderConfig
        fields = ("name", "stage", "kind", "base_url", "model", "voice", "timeout", "options")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kind = self.fields["kind"]
        assert isinstance(kind, forms.ChoiceField)
        kind.choices = kind_choices()
        kind.initial = self.instance.kind or None

    def clean_new_api_key(self) -> str:
        key = self.cleaned_data.get("new_api_key", "")
        if key:
            ProviderConfig._meta.get_field("api_key").run_validators(key)
        return key

    def _post_clean(self) -> None:
        if self.cleaned_data.get("clear_api_key"):
            self.instance.api_key = ""
        elif self.cleaned_data.get("new_api_key"):
            self.instance.api_key = self.cleaned_data["new_api_key"]
        super()._post_clean()  # type: ignore[misc]  # Django's private ModelForm hook, not in django-stubs


# --- live tests ("Test" buttons) -----------------------------------------------------------------


def staff_async_view(permission: str, method: str = "POST") -> Callable[[AsyncView], AsyncView]:
    """An async admin view: one method, CSRF-checked, never cached, for active staff with
    `permission`. Async so a test waiting on a slow endpoint holds no worker thread."""

    def decorate(view: AsyncView) -> AsyncView:
        @wraps(view)
        async def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            user = await request.auser()
            if not (user.is_active and user.is_staff and await user.ahas_perm(permission)):
                return HttpResponseForbidden()
            if request.method != method:
                return JsonResponse({"error": f"{method} only"}, status=405)
            return await view(request, *args, **kwargs)

        return csrf_protect(never_cache(inner))

    return decorate


def probe_summary(result: ProbeResult) -> str:
    values = {"ms": round(result.ms), "text": result.text, "expected": result.expected,
              "first": round(result.first_token_ms) if result.first_token_ms is not None else "-",
              "error": result.error}
    if not result.ok:
        return gettext("Failed after %(ms)s ms: %(error)s") % values
    if result.stage in ("llm", "vision"):
        return gettext("Answered in %(ms)s ms, first token after %(first)s ms: “%(text)s”") % values
    if result.stage == "asr":
        return gettext("Transcribed in %(ms)s ms: “%(text)s” (the sample says “%(expected)s”)") % values
    return gettext("Synthesized in %(ms)s ms: “%(text)s”") % values


def probe_json(result: ProbeResult) -> dict[str, Any]:
    return {**result.as_json(), "summary": probe_summary(result)}


def probe_response(result: ProbeResult) -> HttpResponse:
    """TTS audio as WAV (played by the page's <audio>), anything else as JSON."""
    if result.ok and result.audio_wav:
        response = HttpResponse(result.audio_wav, content_type="audio/wav")
        response["X-Probe-Ms"] = str(round(result.ms))
        response["Cache-Control"] = "no-store"
        return response
    return JsonResponse(probe_json(result), status=200 if result.ok else 502)


def _language(value: str, default: str = "en") -> str:
    return value if value in dict(LANGUAGES) else default


async def config_test_view(request: HttpRequest, object_id: str) -> HttpResponseBase:
    config = await ProviderConfig.objects.filter(pk=object_id).afirst() if object_id.isdigit() else None
    if config is None:
        return JsonResponse({"error": gettext("No such configuration.")}, status=404)
    spec = provider_spec(config, env_provider_options())
    result = await probe(
        config.stage, spec, language=_language(request.POST.get("language", "")),
        voice=request.POST.get("voice", "")[:100], model=settings.LLM_MODEL, text=request.POST.get("text", ""),
    )
    return probe_response(result)


async def voices_view(request: HttpRequest) -> HttpResponseBase:
    """The voices of the TTS kinds asked for (`?kind=edge&kind=piper&language=zh`), for the
    voice pickers' <datalist>: each engine's own catalogue (voices.list_voices)."""
    kinds = [kind for kind in request.GET.getlist("kind")[:5] if kind in registry.REGISTRY["tts"]]
    asked = request.GET.get("language", "")
    language = asked if asked in dict(LANGUAGES) else None
    voices: list[dict[str, str]] = []
    for kind in dict.fromkeys(kinds):
        try:
            found = await list_voices(kind, language)
        except Exception:  # a catalogue that cannot be read offers nothing, the box stays free text
            logger.warning("voice catalogue unavailable", exc_info=True, extra={"kind": kind})
            continue
        voices += [{"kind": kind, "name": v.name, "language": v.language, "label": v.label, "gender": v.gender}
                   for v in found[:MAX_VOICES]]
    return JsonResponse({"voices": voices})


async def persona_test_view(request: HttpRequest, object_id: str) -> HttpResponseBase:
    """Every configuration of the persona's chains, at once (bounded by the slowest timeout)."""
    persona = await Persona.objects.filter(pk=object_id).afirst() if object_id.isdigit() else None
    if persona is None:
        return JsonResponse({"error": gettext("No such persona.")}, status=404)
    env = env_provider_options()
    stages = (*CHAIN_STAGES, "vision")
    links = [link async for link in PersonaProvider.objects.filter(persona=persona, config__stage__in=stages)
             .select_related("config").order_by("position", "pk")]
    chains = [(link.config, provider_spec(link.config, env)) for link in links]
    stages_with_links = {config.stage for config, _spec in chains}
    for stage in CHAIN_STAGES:  # a stage never set runs the default chain: test that
        if stage not in stages_with_links:
            for kind in DEFAULT_CHAINS[stage]:
                config = await ProviderConfig.objects.filter(name=default_config_name(stage, kind)).afirst()
                if config is not None:
                    chains.append((config, provider_spec(config, env)))
    order = {stage: n for n, stage in enumerate(stages)}
    chains.sort(key=lambda pair: order[pair[0].stage])
    results = await asyncio.gather(*(
        probe(config.stage, spec, language=persona.language, voice=persona.voice,
              model=persona_llm_model(persona.llm_model, settings.LLM_MODEL))
        for config, spec in chains
    ))
    rows = []
    for (config, _spec), result in zip(chains, results, strict=True):
        row = probe_json(result)
        row["config_id"] = config.pk
        rows.append(row)
    return JsonResponse({"persona": persona.name, "language": persona.language, "voice": persona.voice,
                         "results": rows})


@admin.register(ProviderConfig)
class ProviderConfigAdmin(admin.ModelAdmin):
    form = ProviderConfigAdminForm
    list_display = ("name", "stage", "kind", "test_button", "endpoint", "model", "key_column", "used_by")
    list_filter = ("stage", "kind")
    search_fields = ("name", "kind", "base_url", "model")
    readonly_fields = ("api_key_status", "option_help", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "stage", "kind")}),
        (_("Endpoint"), {"fields": ("base_url", "api_key_status", "new_api_key", "clear_api_key", "model", "voice",
                                    "timeout")}),
        (_("Options"), {"fields": ("options", "option_help")}),
        (_("Record"), {"classes": ("collapse",), "fields": ("created_at", "updated_at")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[ProviderConfig]:
        return super().get_queryset(request).annotate(persona_count=Count("persona_links__persona", distinct=True))

    def get_urls(self) -> list[URLPattern]:
        test = staff_async_view("conversations.change_providerconfig")(config_test_view)
        voices = staff_async_view("conversations.view_providerconfig", method="GET")(voices_view)
        # django-stubs' path() knows sync views only; Django serves async ones too.
        return [path("voices/", voices, name="conversations_providerconfig_voices"),  # type: ignore[arg-type]
                path("<path:object_id>/test/", test, name="conversations_providerconfig_test"),  # type: ignore[arg-type]
                *super().get_urls()]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any,
                           **kwargs: Any) -> HttpResponse:
        voice = context["adminform"].form.fields.get("voice")
        if voice is not None:
            obj = kwargs.get("obj")
            voice.widget.attrs.update(voice_picker_attrs(
                kind_source="id_kind", stage_source="id_stage", language_choices=True,
                preview_url=reverse("admin:conversations_providerconfig_test", args=[obj.pk]) if obj else ""))
        return super().render_change_form(request, context, *args, **kwargs)

    @admin.display(description=_("Stored API key"))
    def api_key_status(self, config: ProviderConfig) -> str:
        return key_status(config)

    @admin.display(description=_("API key"))
    def key_column(self, config: ProviderConfig) -> str:
        """The list's short form: an `env:` reference names no secret, so it is shown as is."""
        return f"env:{config.key_env_name}" if config.key_env_name else key_status(config)

    @admin.display(description=_("base URL"))
    def endpoint(self, config: ProviderConfig) -> str:
        return config.base_url or gettext("(environment)")

    @admin.display(description=_("used by personas"), ordering="persona_count")
    def used_by(self, config: ProviderConfig) -> int:
        return getattr(config, "persona_count", 0)

    @admin.display(description=_("Test"))
    def test_button(self, config: ProviderConfig) -> str:
        """A Test button per row (provider_test.js; the labels come with the list's template)."""
        return format_html(
            '<span data-probe-panel class="probe-cell"><button type="button" class="button" data-probe-url="{}">{}'
            '</button> <output data-probe-output aria-live="polite"></output>'
            '<audio data-probe-audio controls hidden></audio></span>',
            reverse("admin:conversations_providerconfig_test", args=[config.pk]), gettext("Test"))

    @admin.display(description=_("options this kind accepts"))
    def option_help(self, config: ProviderConfig) -> str:
        if not config.kind:
            return "-"
        return ", ".join(option_names(config.stage, config.kind)) or gettext("none")


def voice_picker_attrs(*, kinds: list[str] | None = None, kind_source: str = "", stage_source: str = "",
                       language_source: str = "", language_choices: bool = False,
                       preview_url: str = "") -> dict[str, str]:
    """Attributes that make voice_picker.js turn a voice box into a picker: a <datalist> of
    the engine's voices for the language, and a preview button (the config's Test endpoint)."""
    attrs = {"data-voice-picker": "1", "data-voices-url": reverse("admin:conversations_providerconfig_voices"),
             "data-preview-label": gettext("Preview"), "data-all-languages": gettext("all languages"),
             "autocomplete": "off"}
    if kinds is not None:
        attrs["data-kinds"] = ",".join(kinds)
    if kind_source:
        attrs["data-kind-source"] = kind_source
    if stage_source:
        attrs["data-stage-source"] = stage_source
    if language_source:
        attrs["data-language-source"] = language_source
    if language_choices:
        attrs["data-languages"] = json.dumps([[code, str(label)] for code, label in LANGUAGES], ensure_ascii=False)
    if preview_url:
        attrs["data-preview-url"] = preview_url
    return attrs


# --- a persona's chains -------------------------------------------------------------------------


class ChainFormSet(BaseInlineFormSet):
    """One stage's chain: at least one configuration (vision: may be empty), each once, in
    position order."""

    stage = ""
    required = True

    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        kept = [form for form in self.forms
                if form.cleaned_data.get("config") and not form.cleaned_data.get("DELETE")]
        if not kept and self.required:
            raise ValidationError(
                gettext("Add at least one %(stage)s provider configuration: the chain must not be empty.")
                % {"stage": STAGE_LABELS[self.stage]}, code="empty_chain")
        configs = [form.cleaned_data["config"].pk for form in kept]
        if len(set(configs)) != len(configs):
            raise ValidationError(gettext("Each configuration may appear only once in a chain."), code="repeated")


class ChainLinkForm(forms.ModelForm):
    class Meta:
        model = PersonaProvider
        fields = ("config", "position")
        widgets = {"position": forms.NumberInput(attrs={"class": "chain-position", "min": 0, "max": 999})}

    def has_changed(self) -> bool:
        # A new persona's chains start pre-filled with the default configurations: those
        # rows must be saved even though nobody touched them.
        return super().has_changed() or (self.instance.pk is None and bool(self.initial.get("config")))


class ChainInline(admin.TabularInline):
    model = PersonaProvider
    form = ChainLinkForm
    formset = ChainFormSet
    stage = ""
    extra = 0
    min_num = 0
    ordering = ("position", "pk")

    class Media:
        js = ("conversations/chain_order.js",)
        css = {"all": ("conversations/chain_order.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[PersonaProvider]:
        return super().get_queryset(request).filter(config__stage=self.stage).select_related("config")

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "config":
            kwargs["queryset"] = ProviderConfig.objects.filter(stage=self.stage).order_by("name")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = cast("type[ChainFormSet]", super().get_formset(request, obj, **kwargs))  # built on `formset`
        formset.stage = self.stage
        formset.required = self.stage in DEFAULT_CHAINS
        return formset

    def default_links(self) -> list[dict[str, Any]]:
        """The default chain's configurations (created if an operator deleted them)."""
        configs = [provider_config_default(stage=self.stage, kind=kind) for kind in DEFAULT_CHAINS.get(self.stage, [])]
        return [{"config": config.pk, "position": n} for n, config in enumerate(configs)
                if config.stage == self.stage]

    def runs_default(self, obj: Persona | None) -> bool:
        """A new persona, or one made in code without this stage's chain: it runs the
        default chain, so the form starts with it."""
        return obj is None or obj.pk is None or not obj.provider_links.filter(config__stage=self.stage).exists()

    def get_extra(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> int:
        return len(self.default_links()) if self.runs_default(obj) else 0


class AsrChainInline(ChainInline):
    stage = "asr"
    verbose_name = _("ASR provider")
    verbose_name_plural = _("ASR chain (speech recognition, in fallback order)")


class LlmChainInline(ChainInline):
    stage = "llm"
    verbose_name = _("LLM provider")
    verbose_name_plural = _("LLM chain (language model, in fallback order)")


class TtsChainInline(ChainInline):
    stage = "tts"
    verbose_name = _("TTS provider")
    verbose_name_plural = _("TTS chain (speech synthesis, in fallback order; espeak-ng is always the last resort)")


class VisionChainInline(ChainInline):
    stage = "vision"
    verbose_name = _("vision provider")
    verbose_name_plural = _("Vision chain (camera questions, in fallback order; empty: XIAOZHI_VISION_* settings)")


CHAIN_INLINES = (AsrChainInline, LlmChainInline, TtsChainInline, VisionChainInline)


def chain_formset_kwargs(inline: admin.options.InlineModelAdmin, obj: Persona | None) -> dict[str, Any]:
    """A new persona's chains (or a chain never set) start with the default configurations."""
    if isinstance(inline, ChainInline) and inline.runs_default(obj):
        return {"initial": inline.default_links()}
    return {}


def chains_summary(persona: Persona) -> str:
    links = sorted(persona.provider_links.all(), key=lambda link: (link.position, link.pk))
    stages = []
    for stage in ("asr", "llm", "tts"):
        names = [link.config.name for link in links if link.config.stage == stage]
        stages.append(" → ".join(names) or gettext("(default)"))
    return " / ".join(stages)
