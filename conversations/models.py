"""Personas and conversation history."""
from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

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
    name = models.CharField(max_length=100, unique=True)
    description = models.CharField(max_length=300, blank=True, help_text="Shown to the LLM when listing characters.")
    system_prompt = models.TextField(
        default=DEFAULT_SYSTEM_PROMPT,
        help_text="Placeholders: {persona_name} {current_time} {device_name} {location} {language}.",
    )
    language = models.CharField(max_length=8, choices=LANGUAGES, default="en")
    voice = models.CharField(max_length=100, blank=True, help_text="TTS voice; empty picks one for the language.")

    # Ordered fallback lists of provider kinds (see conversations/providers/registry.py).
    asr_providers = models.JSONField(default=_default_asr)
    llm_providers = models.JSONField(default=_default_llm)
    tts_providers = models.JSONField(default=_default_tts)

    llm_model = models.CharField(max_length=100, blank=True, help_text="Empty: LLM_MODEL from the environment.")
    temperature = models.FloatField(default=0.7, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)])
    max_tokens = models.PositiveIntegerField(default=512, validators=[MinValueValidator(1)])
    context_turns = models.PositiveSmallIntegerField(default=10, help_text="Past turns kept in the LLM context.")

    vad_threshold = models.FloatField(default=0.5, validators=[MinValueValidator(0.05), MaxValueValidator(0.99)])
    vad_threshold_low = models.FloatField(default=0.3, validators=[MinValueValidator(0.01), MaxValueValidator(0.99)])
    vad_min_silence_ms = models.PositiveIntegerField(default=600, validators=[MinValueValidator(100)])

    greeting = models.CharField(max_length=300, blank=True, help_text="Spoken when the wake word is detected.")
    exit_phrases = models.JSONField(default=list, blank=True, help_text='e.g. ["goodbye", "再见"]')
    farewell = models.CharField(max_length=300, default="Goodbye!", blank=True)

    server_tools = models.JSONField(
        null=True, blank=True, help_text="Allowed built-in tool names; empty/null allows all."
    )
    mcp_servers = models.ManyToManyField("tools.McpServer", blank=True, related_name="personas")
    device_tools_enabled = models.BooleanField(default=True)
    device_tool_exclusions = models.JSONField(default=list, blank=True)

    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def provider_choices(stage: str) -> list[tuple[str, str]]:
        return registry.choices(stage)


class Conversation(models.Model):
    SOURCE_DEVICE = "device"
    SOURCE_GATEWAY = "gateway"
    SOURCES = [(SOURCE_DEVICE, "Device"), (SOURCE_GATEWAY, "LLM Gateway")]

    session_id = models.CharField(max_length=64, db_index=True)
    source = models.CharField(max_length=10, choices=SOURCES, default=SOURCE_DEVICE)
    device = models.ForeignKey(
        "devices.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations"
    )
    persona = models.ForeignKey(Persona, null=True, blank=True, on_delete=models.SET_NULL)
    client_address = models.CharField(max_length=100, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["source", "started_at"], name="conversation_source_started")]

    def __str__(self) -> str:
        return f"{self.get_source_display()} {self.session_id}"


class Turn(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="turns")
    index = models.PositiveIntegerField()
    user_text = models.TextField(blank=True)
    reply_text = models.TextField(blank=True)
    emotion = models.CharField(max_length=20, blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    providers = models.JSONField(default=dict, blank=True, help_text="Provider used at each stage.")
    timings = models.JSONField(default=dict, blank=True, help_text="Milliseconds since speech end, per stage.")
    interrupted = models.BooleanField(default=False)
    error = models.CharField(max_length=200, blank=True)
    user_audio = models.FileField(upload_to="turns/%Y/%m/%d/", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "index"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "index"], name="unique_turn_index"),
        ]
        # Every dashboard figure reads turns by time range (dashboard/rows.py); its lists of
        # failed turns walk only the few rows with an error.
        indexes = [
            models.Index(fields=["created_at"], name="turn_created_at"),
            models.Index(fields=["created_at"], condition=~models.Q(error=""), name="turn_error_created_at"),
        ]

    def __str__(self) -> str:
        return f"turn {self.index} of {self.conversation_id}"
