"""Personas, their provider configurations, conversation history and LLM Gateway API keys."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.providers import registry
from conversations.providers.options import OptionsError, validate_options

DEFAULT_SYSTEM_PROMPT = (
    "You are {persona_name}, a friendly voice assistant on a small device. "
    "Answer briefly in plain spoken language, without markdown or lists. "
    "Start every reply with one emoji that shows your mood. "
    "Reply in {language}. Current time: {current_time}. Device: {device_name}. "
    "Location: {location}."
)

LANGUAGES = [
    ("zh", "中文"), ("en", "English"), ("ja", "日本語"), ("ko", "한국어"), ("de", "Deutsch"),
    ("fr", "Français"), ("ru", "Русский"), ("pt", "Português"), ("es", "Español"), ("it", "Italiano"),
]


# Defaults of the kind lists personas had before ProviderConfig (migrations 0001-0011 use them).
def _default_asr() -> list[str]:
    return ["faster_whisper"]


def _default_llm() -> list[str]:
    return ["openai"]


def _default_tts() -> list[str]:
    return ["edge", "piper", "espeak"]  # Piper: the natural offline voice (English bundled)


# What a stage's chain is when a persona has none configured (a persona made in code).
DEFAULT_CHAINS: dict[str, list[str]] = {"asr": ["faster_whisper"], "llm": ["openai"], "tts": _default_tts()}
CHAIN_STAGES = ("asr", "llm", "tts")
KIND_LIST_NAMES = frozenset({"asr_providers", "llm_providers", "tts_providers"})
ENV_KEY = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]{0,99})$")
MIN_TIMEOUT, MAX_TIMEOUT = 0.5, 600.0


def validate_base_url(value: str) -> None:
    """http(s) with a host; no credentials in the URL (they belong in the API key, which is
    never shown). Docker service names ("http://ollama:11434/v1") are fine."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValidationError(_("Enter a valid URL."), code="invalid") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise ValidationError(_("Enter an http:// or https:// URL with a host name."), code="invalid")
    if parts.username or parts.password:
        raise ValidationError(_("Put the key in the API key field, not in the URL."), code="credentials")


KEY_NAME_SUFFIXES = ("_API_KEY", "_TOKEN")


def validate_api_key(value: str) -> None:
    """`env:NAME` must name a key variable: the server's own secrets (DJANGO_SECRET_KEY,
    DATABASE_URL) must not be sendable to an endpoint an operator typed in."""
    if not value.startswith("env:"):
        return
    match = ENV_KEY.match(value)
    if match is None:
        raise ValidationError(_("An environment reference looks like env:DEEPSEEK_API_KEY."), code="env")
    if not match.group(1).upper().endswith(KEY_NAME_SUFFIXES):
        raise ValidationError(_("Only variables whose names end in _API_KEY or _TOKEN can be referenced."),
                              code="env_name")


class ProviderConfig(models.Model):
    """One endpoint (or local engine) of a stage: what `registry.build` gets to make a
    provider. Personas list configs per stage in order (PersonaProvider); the fallback chain
    tries them in that order. Empty fields take the environment's defaults for the kind
    (LLM_BASE_URL, TTS_TIMEOUT, …), so the configs seeded from the environment stay in step
    with it. The API key is stored as given, or as `env:NAME` to be read from the
    environment when a session starts; it is never shown back (admin: "set / not set")."""

    STAGES = [("asr", _("Speech recognition (ASR)")), ("llm", _("Language model (LLM)")),
              ("tts", _("Speech synthesis (TTS)")), ("vision", _("Vision"))]

    name = models.CharField(_("name"), max_length=100, unique=True)
    stage = models.CharField(_("stage"), max_length=10, choices=STAGES)
    kind = models.CharField(_("kind"), max_length=40, help_text=_("The provider implementation."))
    base_url = models.CharField(
        _("base URL"), max_length=300, blank=True, validators=[validate_base_url],
        help_text=_("e.g. https://api.deepseek.com/v1. Empty: the environment's default for this kind."),
    )
    api_key = models.CharField(_("API key"), max_length=500, blank=True, validators=[validate_api_key])
    model = models.CharField(
        _("model"), max_length=200, blank=True,
        help_text=_(
            "LLM: the model name, asked of this endpoint even when the persona names another; empty: "
            "the persona's LLM model, else LLM_MODEL. ASR faster_whisper: a model directory; empty: the default."
        ),
    )
    voice = models.CharField(
        _("voice"), max_length=100, blank=True, help_text=_("TTS: used when the persona names no voice."),
    )
    timeout = models.FloatField(
        _("timeout (seconds)"), null=True, blank=True,
        validators=[MinValueValidator(MIN_TIMEOUT), MaxValueValidator(MAX_TIMEOUT)],
        help_text=_("Empty: the stage's default (ASR_TIMEOUT, LLM_TIMEOUT, TTS_TIMEOUT)."),
    )
    options = models.JSONField(_("options"), default=dict, blank=True,
                               help_text=_("Options only this kind understands, as a JSON object."))
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["stage", "name"]
        verbose_name = _("provider configuration")
        verbose_name_plural = _("provider configurations")

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<ProviderConfig {self.pk}: {self.stage}.{self.kind} {self.name!r}>"  # never the key

    def clean(self) -> None:
        errors: dict[str, Any] = {}
        if self.stage and self.kind not in registry.REGISTRY.get(self.stage, {}):
            known = ", ".join(registry.REGISTRY.get(self.stage, {})) or "-"
            errors["kind"] = gettext("Unknown %(stage)s provider %(kind)r. Known: %(known)s.") % {
                "stage": self.stage.upper(), "kind": self.kind, "known": known}
        elif self.stage:
            try:
                self.options = validate_options(self.stage, self.kind, self.options)
            except OptionsError as exc:
                errors["options"] = gettext("Options do not fit %(kind)s: %(problems)s") % {
                    "kind": self.kind, "problems": "; ".join(exc.problems)}
        if errors:
            raise ValidationError(errors)

    @property
    def key_env_name(self) -> str:
        """The environment variable the key is read from ("" when stored or empty)."""
        match = ENV_KEY.match(self.api_key)
        return match.group(1) if match else ""


class Persona(models.Model):
    name = models.CharField(_("name"), max_length=100, unique=True)
    description = models.CharField(
        _("description"), max_length=300, blank=True, help_text=_("Shown to the LLM when listing characters.")
    )
    system_prompt = models.TextField(
        _("system prompt"), default=DEFAULT_SYSTEM_PROMPT,
        help_text=_(
            "Placeholders: {persona_name} the persona's name, {current_time} the device's local date and "
            "time, {device_name} the device's name, {location} the device's city, {language} the reply "
            "language."
        ),
    )
    language = models.CharField(_("language"), max_length=8, choices=LANGUAGES, default="en")
    voice = models.CharField(
        _("voice"), max_length=100, blank=True, help_text=_("TTS voice; empty picks one for the language.")
    )

    # Ordered fallback lists of provider configurations: PersonaProvider rows.

    llm_model = models.CharField(
        _("LLM model"), max_length=100, blank=True,
        help_text=_("Asked of the LLM configurations that name no model of their own (a configuration's "
                    "model wins for its endpoint). Empty: LLM_MODEL from the environment."),
    )
    temperature = models.FloatField(
        _("temperature"), default=0.7, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)]
    )
    max_tokens = models.PositiveIntegerField(_("max tokens"), default=512, validators=[MinValueValidator(1)])
    context_turns = models.PositiveSmallIntegerField(
        _("context turns"), default=10, help_text=_("Past turns kept in the LLM context.")
    )

    vad_threshold = models.FloatField(
        _("speech threshold"), default=0.5, validators=[MinValueValidator(0.05), MaxValueValidator(0.99)]
    )
    vad_threshold_low = models.FloatField(
        _("silence threshold"), default=0.3, validators=[MinValueValidator(0.01), MaxValueValidator(0.99)]
    )
    vad_min_silence_ms = models.PositiveIntegerField(
        _("end-of-speech silence (ms)"), default=600, validators=[MinValueValidator(100)],
        help_text=_("Silence turn detection: the quiet that ends an utterance."),
    )
    TURN_SMART = "smart"
    TURN_SILENCE = "silence"
    TURN_DETECTION_CHOICES = (
        (TURN_SMART, _("Smart: ask the end-of-turn model on each pause")),
        (TURN_SILENCE, _("Silence: a fixed silence window")),
    )
    turn_detection = models.CharField(
        _("turn detection"), max_length=10, choices=TURN_DETECTION_CHOICES, default=TURN_SMART,
        help_text=_(
            "Smart ends a turn as soon as a short pause sounds like the end of a sentence, and waits "
            "through pauses in the middle of one; silence waits for the end-of-speech silence."
        ),
    )
    turn_pause_ms = models.PositiveIntegerField(
        _("pause before asking (ms)"), default=100, validators=[MinValueValidator(60), MaxValueValidator(2000)],
        help_text=_("Smart turn detection: the quiet after which the end-of-turn model is asked."),
    )
    turn_max_silence_ms = models.PositiveIntegerField(
        _("maximum silence (ms)"), default=1500, validators=[MinValueValidator(200), MaxValueValidator(10000)],
        help_text=_("Smart turn detection: a turn ends after this much quiet, whatever the model says."),
    )
    early_reply = models.BooleanField(
        _("answer early"), default=True,
        help_text=_(
            "Ask the language model as soon as a pause has been transcribed, while the end of the turn is "
            "still being decided: the reply starts sooner. Nothing is said or done before the turn ends; "
            "if the user goes on speaking the request is cancelled, which can still cost its prompt tokens."
        ),
    )
    barge_in_min_ms = models.PositiveIntegerField(
        _("speech needed to interrupt (ms)"), default=180,
        validators=[MinValueValidator(60), MaxValueValidator(2000)],
        help_text=_(
            "How much confident speech the user must say over a reply before it stops (devices that "
            "keep listening while speaking). Shorter sounds, such as a cough or a short “mm”, are ignored."
        ),
    )
    barge_in_min_probability = models.FloatField(
        _("speech certainty to interrupt"), default=0.8,
        validators=[MinValueValidator(0.3), MaxValueValidator(0.99)],
        help_text=_("Voice activity probability (0-1) a moment of sound needs to count towards an interruption."),
    )

    greeting = models.CharField(
        _("greeting"), max_length=300, blank=True, help_text=_("Spoken when the wake word is detected.")
    )
    exit_phrases = models.JSONField(_("exit phrases"), default=list, blank=True,
                                    help_text=_('e.g. ["goodbye", "再见"]'))
    farewell = models.CharField(
        _("farewell"), max_length=300, default="Goodbye!", blank=True,
        help_text=_(
            "Said before the device hangs up after a silence, an exit phrase or the end of a conversation. "
            "The stock “Goodbye!” is said in the persona's language. Empty: no farewell after a silence."
        ),
    )

    server_tools = models.JSONField(
        _("server tools"), null=True, blank=True, help_text=_("Allowed built-in tool names; empty/null allows all.")
    )
    mcp_servers = models.ManyToManyField(
        "tools.McpServer", blank=True, related_name="personas", verbose_name=_("MCP servers")
    )
    device_tools_enabled = models.BooleanField(_("device tools enabled"), default=True)
    device_tool_exclusions = models.JSONField(_("excluded device tools"), default=list, blank=True)

    record_audio = models.BooleanField(
        _("record audio"), default=True,
        help_text=_("Keep the audio of this persona's turns for review (as far as XIAOZHI_RECORDING allows)."),
    )

    is_default = models.BooleanField(_("default"), default=False)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("persona")
        verbose_name_plural = _("personas")

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def provider_choices(stage: str) -> list[tuple[str, str]]:
        return registry.choices(stage)

    def chain(self, stage: str) -> list[ProviderConfig]:
        """The stage's configurations, in fallback order."""
        links = self.provider_links.filter(config__stage=stage).select_related("config").order_by("position", "pk")
        return [link.config for link in links]

    # Kind lists, as personas had them before ProviderConfig: read as the kinds of the
    # chain; set (Persona(tts_providers=["espeak"]), factories, benchmarks, old data
    # migrations) to point the chain at each kind's default configuration when saved.
    def _kinds(self, stage: str) -> list[str]:
        pending = getattr(self, "_pending_kinds", {})
        if stage in pending:
            return list(pending[stage])
        kinds = [config.kind for config in self.chain(stage)] if self.pk else []
        return kinds or list(DEFAULT_CHAINS[stage])  # no chain: the defaults run

    def _set_kinds(self, stage: str, kinds: list[str]) -> None:
        self.__dict__.setdefault("_pending_kinds", {})[stage] = list(kinds)

    asr_providers = property(lambda self: self._kinds("asr"), lambda self, v: self._set_kinds("asr", v))
    llm_providers = property(lambda self: self._kinds("llm"), lambda self, v: self._set_kinds("llm", v))
    tts_providers = property(lambda self: self._kinds("tts"), lambda self, v: self._set_kinds("tts", v))

    def save(self, *args: Any, **kwargs: Any) -> None:
        fields = kwargs.get("update_fields")
        if fields is not None:  # save(update_fields=["tts_providers"]): the chain, no column
            kwargs["update_fields"] = [f for f in fields if f not in KIND_LIST_NAMES]
        if fields is None or kwargs["update_fields"]:
            super().save(*args, **kwargs)
        pending = self.__dict__.pop("_pending_kinds", None)
        if pending:
            from conversations.provider_configs import persona_chain_set_kinds  # noqa: PLC0415 - it imports models

            for stage, kinds in pending.items():
                persona_chain_set_kinds(persona=self, stage=stage, kinds=kinds)


class PersonaProvider(models.Model):
    """A persona's use of a provider configuration: its place in the stage's chain (the
    stage is the configuration's). A configuration in use cannot be deleted."""

    persona = models.ForeignKey(Persona, on_delete=models.CASCADE, related_name="provider_links",
                                verbose_name=_("persona"))
    config = models.ForeignKey(ProviderConfig, on_delete=models.PROTECT, related_name="persona_links",
                               verbose_name=_("provider configuration"))
    position = models.PositiveSmallIntegerField(_("position"), default=0)

    class Meta:
        ordering = ["persona", "position", "pk"]
        verbose_name = _("provider in the chain")
        verbose_name_plural = _("providers in the chain")
        constraints = [
            models.UniqueConstraint(fields=["persona", "config"], name="persona_provider_once"),
        ]

    def __str__(self) -> str:
        # Listed by the delete page of a protected configuration: say where it is used.
        return gettext("the %(stage)s chain of the persona “%(persona)s”") % {
            "stage": self.config.stage.upper(), "persona": self.persona.name}


AUDIO_UPLOAD_TO = "turns/%Y/%m/%d/"
HAS_AUDIO = ~Q(user_audio="") | ~Q(reply_audio="")


class Conversation(models.Model):
    SOURCE_DEVICE = "device"
    SOURCE_GATEWAY = "gateway"
    SOURCES = [(SOURCE_DEVICE, _("Device")), (SOURCE_GATEWAY, _("LLM Gateway"))]

    session_id = models.CharField(_("session ID"), max_length=64, db_index=True)
    source = models.CharField(_("source"), max_length=10, choices=SOURCES, default=SOURCE_DEVICE)
    device = models.ForeignKey(
        "devices.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations",
        verbose_name=_("device"),
    )
    persona = models.ForeignKey(
        Persona, null=True, blank=True, on_delete=models.SET_NULL, verbose_name=_("persona")
    )
    client_address = models.CharField(_("client address"), max_length=100, blank=True)
    started_at = models.DateTimeField(_("started at"), auto_now_add=True)
    ended_at = models.DateTimeField(_("ended at"), null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            # The review list is newest first, overall and per device (the device page's link).
            models.Index(fields=["-started_at"], name="conversation_started"),
            models.Index(fields=["device", "-started_at"], name="conversation_device_started"),
            # The dashboard's figures per source (device / gateway) over a time range.
            models.Index(fields=["source", "started_at"], name="conversation_source_started"),
        ]
        verbose_name = _("conversation")
        verbose_name_plural = _("conversations")

    def __str__(self) -> str:
        return f"{self.get_source_display()} {self.session_id}"


class Turn(models.Model):
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="turns", verbose_name=_("conversation")
    )
    index = models.PositiveIntegerField(_("index"))
    user_text = models.TextField(_("user said"), blank=True)
    reply_text = models.TextField(_("reply"), blank=True)
    emotion = models.CharField(_("emotion"), max_length=20, blank=True)
    tool_calls = models.JSONField(_("tool calls"), default=list, blank=True)
    providers = models.JSONField(_("providers"), default=dict, blank=True, help_text=_("Provider used at each stage."))
    # Every provider tried per stage, in order, failures included (conversations/capture.py):
    # {"tts": [{"kind": "edge", "ok": false, "error": "ClientConnectorDNSError", "ms": 12.0},
    #          {"kind": "espeak", "ok": true, "ms": 15.0}]}
    provider_attempts = models.JSONField(_("provider attempts"), default=dict, blank=True)
    timings = models.JSONField(
        _("timings"), default=dict, blank=True, help_text=_("Milliseconds since speech end, per stage.")
    )
    interrupted = models.BooleanField(_("interrupted"), default=False)
    error = models.CharField(_("error"), max_length=200, blank=True)
    # Ogg/Opus files in STORAGES["default"], written after the turn (conversations/recording.py)
    # and served only through the staff audio view; durations in milliseconds.
    user_audio = models.FileField(_("user audio"), upload_to=AUDIO_UPLOAD_TO, blank=True)
    reply_audio = models.FileField(_("reply audio"), upload_to=AUDIO_UPLOAD_TO, blank=True)
    user_audio_ms = models.PositiveIntegerField(_("user audio duration (ms)"), null=True, blank=True)
    reply_audio_ms = models.PositiveIntegerField(_("reply audio duration (ms)"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        ordering = ["conversation", "index"]
        verbose_name = _("turn")
        verbose_name_plural = _("turns")
        constraints = [
            models.UniqueConstraint(fields=["conversation", "index"], name="unique_turn_index"),
        ]
        indexes = [
            # Time ranges (review lists, every dashboard figure: dashboard/rows.py).
            models.Index(fields=["-created_at"], name="turn_created"),
            # Small partial indexes: the review filters ("has errors", "interrupted"), the
            # dashboard's lists of failed turns and the audio retention sweep touch only the
            # few rows that match.
            models.Index(fields=["conversation"], condition=~Q(error=""), name="turn_with_error"),
            models.Index(fields=["created_at"], condition=~Q(error=""), name="turn_error_created_at"),
            models.Index(fields=["conversation"], condition=Q(interrupted=True), name="turn_interrupted"),
            models.Index(fields=["created_at"], condition=HAS_AUDIO, name="turn_with_audio"),
        ]

    def __str__(self) -> str:
        return gettext("turn %(index)d of conversation %(conversation)s") % {
            "index": self.index, "conversation": self.conversation_id}


class GatewayKey(models.Model):
    """An API key for the LLM Gateway (docs/security.md). Only the SHA-256 of the key is
    stored: the key itself is shown once, when it is created (admin or `manage.py
    gateway_key_create`); `prefix` is its first characters, to tell keys apart."""

    name = models.CharField(_("name"), max_length=100, help_text=_("Who or what uses this key."))
    prefix = models.CharField(_("prefix"), max_length=16, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    persona = models.ForeignKey(
        Persona, null=True, blank=True, on_delete=models.SET_NULL, related_name="gateway_keys",
        verbose_name=_("persona"),
        help_text=_("Optional: its name and prompt replace the gateway's default system prompt."),
    )
    requests_per_minute = models.PositiveIntegerField(
        _("requests per minute"), default=60, validators=[MinValueValidator(1)],
        help_text=_("text_input messages over all of this key's connections; bursts up to this many."),
    )
    max_connections = models.PositiveIntegerField(
        _("concurrent connections"), default=5, validators=[MinValueValidator(1)],
        help_text=_("Connections this key may hold open at once."),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used"), null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name", "pk"]
        verbose_name = _("gateway API key")
        verbose_name_plural = _("gateway API keys")

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
