"""Personas, conversation history and LLM Gateway API keys."""
from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.providers import registry

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


def _default_asr() -> list[str]:
    return ["faster_whisper"]


def _default_llm() -> list[str]:
    return ["openai"]


def _default_tts() -> list[str]:
    return ["edge", "espeak"]


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

    # Ordered fallback lists of provider kinds (see conversations/providers/registry.py).
    asr_providers = models.JSONField(_("ASR providers"), default=_default_asr)
    llm_providers = models.JSONField(_("LLM providers"), default=_default_llm)
    tts_providers = models.JSONField(_("TTS providers"), default=_default_tts)

    llm_model = models.CharField(
        _("LLM model"), max_length=100, blank=True, help_text=_("Empty: LLM_MODEL from the environment.")
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
        _("end-of-speech silence (ms)"), default=600, validators=[MinValueValidator(100)]
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
    exit_phrases = models.JSONField(_("exit phrases"), default=list, blank=True, help_text=_('e.g. ["goodbye", "再见"]'))
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
