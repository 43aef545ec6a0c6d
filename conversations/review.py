"""Read side of conversation review: turns as a reader sees them, and the JSON export.

Stored rows keep what the pipeline measured (raw timing keys, provider attempts, tool-call
records); this module turns them into plain objects for the admin's chat page (labelled
waterfall, fallback summary, pretty-printed tool calls) and into the export. Queries live in
`conversation_turns_page` and are bounded: one page of turns, the big JSON fields fetched
only for that page.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.files.storage import default_storage
from django.core.paginator import Page, Paginator
from django.utils import formats, timezone
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from conversations.capture import STAGES, attempts_from_json
from conversations.models import Conversation, Turn
from conversations.pipeline.text import EMOJI_EMOTIONS

TURNS_PER_PAGE = 50
MAX_SHOWN_CHARS = 20_000  # tool arguments/results beyond this are cut on the page (not in the export)

# Device turns: milliseconds after the end of the user's speech, in pipeline order.
DEVICE_TIMINGS: tuple[tuple[str, Promise], ...] = (
    ("speech_end", _("End of speech")),
    ("asr_done", _("Speech recognised")),
    ("filler", _("Filler said (a long wait)")),
    ("llm_first_token", _("First LLM token")),
    ("tts_first_audio", _("First synthesized audio")),
    ("first_frame_sent", _("First audio frame sent")),
    ("last_frame_sent", _("Last audio frame sent")),
)
# How the end of a device turn was decided (listen.Utterance.turn): facts, not moments, so
# they are shown beside the waterfall rather than in it.
END_OF_TURN_PREFIX = "turn_"
# Gateway turns: durations, each measured from the moment the text arrived.
GATEWAY_TIMINGS: tuple[tuple[str, Promise], ...] = (
    ("llm_ms", _("Language model (all rounds)")),
    ("total_ms", _("Whole turn")),
)
STAGE_LABELS: dict[str, Promise] = {
    "asr": _("Speech recognition"), "llm": _("Language model"), "tts": _("Speech synthesis"),
    "model": _("Model"),
}
TOOL_SOURCES: dict[str, Promise] = {
    "server": _("built-in"), "device": _("device"), "mcp": _("MCP server"), "client": _("gateway client"),
}
TOOL_ERRORS: dict[str, Promise] = {
    "unknown_tool": _("unknown tool"), "invalid_json": _("arguments were not valid JSON"),
    "invalid_arguments": _("arguments did not match the schema"), "timeout": _("timed out"),
    "tool_error": _("the tool reported an error"), "exception": _("the tool crashed"),
}
EMOTION_EMOJI: dict[str, str] = {}
for _emoji, _emotion in EMOJI_EMOTIONS.items():
    EMOTION_EMOJI.setdefault(_emotion, _emoji)


@dataclass(frozen=True)
class TimingRow:
    key: str
    label: str
    at_ms: float  # device: ms after speech end; gateway: the duration itself
    delta_ms: float  # time since the previous stage (device) or the duration (gateway)
    offset_pct: float  # where the bar starts, in % of the turn's span
    width_pct: float


@dataclass(frozen=True)
class KindAttempts:
    kind: str
    ok: int
    failed: int
    errors: tuple[str, ...]
    lost_ms: float  # time spent on failed attempts
    served_ms: float  # time of the successful attempts


@dataclass(frozen=True)
class StageAttempts:
    stage: str
    label: str
    kinds: tuple[KindAttempts, ...]

    @property
    def fell_back(self) -> bool:
        """A provider failed and another one (or a retry) served."""
        return self.had_failures and any(k.ok for k in self.kinds)

    @property
    def had_failures(self) -> bool:
        return any(k.failed for k in self.kinds)

    @property
    def lost_ms(self) -> float:
        return sum(k.lost_ms for k in self.kinds)


@dataclass(frozen=True)
class ToolCallView:
    name: str
    source: str
    success: bool
    duration_ms: float | None
    error: str
    arguments: str
    result: str


@dataclass(frozen=True)
class AudioLink:
    url: str
    available: bool
    duration_ms: int | None

    @property
    def seconds(self) -> float | None:
        return None if self.duration_ms is None else self.duration_ms / 1000


@dataclass
class TurnView:
    turn: Turn
    emoji: str
    timings: list[TimingRow]
    attempts: list[StageAttempts]
    served: list[tuple[str, str]]  # (stage label, provider) when no attempts were recorded
    tool_calls: list[ToolCallView]
    user_audio: AudioLink | None = None
    reply_audio: AudioLink | None = None
    total_ms: float | None = None
    flags: list[str] = field(default_factory=list)
    end_of_turn: str = ""

    @property
    def fell_back(self) -> bool:
        return any(stage.fell_back for stage in self.attempts)


# --- titles -----------------------------------------------------------------------------------


def conversation_title(conversation: Conversation, turn_count: int | None = None) -> str:
    """Device name or MAC (or "LLM Gateway"), persona, start time, turn count."""
    parts = [conversation_subject(conversation)]
    if conversation.persona_id is not None and conversation.persona is not None:
        parts.append(conversation.persona.name)
    parts.append(formats.date_format(timezone.localtime(conversation.started_at), "SHORT_DATETIME_FORMAT"))
    if turn_count is not None:
        parts.append(ngettext("%(count)d turn", "%(count)d turns", turn_count) % {"count": turn_count})
    return " · ".join(str(part) for part in parts)


def conversation_subject(conversation: Conversation) -> str:
    if conversation.device_id is not None and conversation.device is not None:
        return conversation.device.name or conversation.device.mac
    if conversation.source == Conversation.SOURCE_GATEWAY:
        return str(_("LLM Gateway client"))
    return str(_("Unknown device"))


# --- the conversation page --------------------------------------------------------------------


def conversation_turns_page(conversation: Conversation, page_number: str | None, audio_url: Callable[[int, str], str]
                            ) -> tuple[Page, list[TurnView]]:
    turns = Turn.objects.filter(conversation=conversation).order_by("index")
    page = Paginator(turns, TURNS_PER_PAGE).get_page(page_number)
    gateway = conversation.source == Conversation.SOURCE_GATEWAY
    return page, [turn_view(turn, audio_url, gateway=gateway) for turn in page.object_list]


def turn_view(turn: Turn, audio_url: Callable[[int, str], str], *, gateway: bool = False) -> TurnView:
    rows = timing_rows(turn.timings, gateway=gateway)
    view = TurnView(
        turn=turn,
        emoji=EMOTION_EMOJI.get(turn.emotion, ""),
        timings=rows,
        attempts=stage_attempts(turn.provider_attempts),
        served=served_providers(turn.providers),
        tool_calls=[tool_call_view(call) for call in turn.tool_calls or [] if isinstance(call, dict)],
        user_audio=_audio(turn, "user", audio_url),
        reply_audio=_audio(turn, "reply", audio_url),
        total_ms=max((row.at_ms for row in rows), default=None),
        end_of_turn="" if gateway else end_of_turn(turn.timings),
    )
    if turn.interrupted:
        view.flags.append(str(_("interrupted")))
    if turn.error:
        view.flags.append(str(_("error")))
    if view.fell_back:
        view.flags.append(str(_("fallback")))
    return view


def _audio(turn: Turn, track: str, audio_url: Callable[[int, str], str]) -> AudioLink | None:
    name = getattr(turn, f"{track}_audio").name
    if not name:
        return None
    try:
        available = default_storage.exists(name)
    except Exception:  # a storage that is down: shown as unavailable, the page still renders
        available = False
    return AudioLink(url=audio_url(turn.pk, track), available=available,
                     duration_ms=getattr(turn, f"{track}_audio_ms"))


def timing_rows(timings: object, *, gateway: bool = False) -> list[TimingRow]:
    """Labelled rows in pipeline order; unknown keys follow under their own names."""
    if not isinstance(timings, dict):
        return []
    values = {str(k): float(v) for k, v in timings.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
              and not str(k).startswith(END_OF_TURN_PREFIX)}
    known = GATEWAY_TIMINGS if gateway else DEVICE_TIMINGS
    labels = dict(known)
    order = [key for key, _ in known if key in values] + sorted(set(values) - set(labels))
    span = max(values.values(), default=0.0) or 1.0
    rows: list[TimingRow] = []
    previous = 0.0
    for key in order:
        at = values[key]
        if gateway:
            start, delta = 0.0, at
        else:
            start = min(previous, at)
            delta = at - start
            previous = max(previous, at)
        rows.append(TimingRow(key=key, label=str(labels.get(key, key)), at_ms=at, delta_ms=delta,
                              offset_pct=round(100 * start / span, 2), width_pct=round(100 * delta / span, 2)))
    return rows


def end_of_turn(timings: object) -> str:
    """One line on how the turn's end was decided, e.g. "Ended by the end-of-turn model
    (probability 0.93, 81 ms) after 212 ms of silence"; empty for turns that did not say."""
    if not isinstance(timings, dict):
        return ""

    def number(key: str) -> float | None:
        value = timings.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    silence, complete = number("turn_silence_ms"), number("turn_complete")
    if silence is None:
        return ""
    values = {"silence": f"{silence:.0f}"}
    if complete is None:
        return _("Ended after %(silence)s ms of silence") % values
    values.update(probability=f"{number('turn_probability') or 0.0:.2f}", model=f"{number('turn_model_ms') or 0.0:.0f}",
                  checks=f"{number('turn_checks') or 0.0:.0f}")
    if complete:
        return _("Ended by the end-of-turn model (probability %(probability)s, %(model)s ms) after %(silence)s ms "
                 "of silence") % values
    return _("Ended by the silence limit after %(silence)s ms; the end-of-turn model heard an unfinished sentence "
             "(probability %(probability)s, %(checks)s checks)") % values


def stage_attempts(data: object) -> list[StageAttempts]:
    """Per stage, each provider tried (first-try order) with its successes, failures, time lost."""
    stages = attempts_from_json(data)
    ordered = [s for s in STAGES if s in stages] + sorted(set(stages) - set(STAGES))
    result = []
    for stage in ordered:
        kinds: dict[str, list[Any]] = {}
        for attempt in stages[stage]:
            # Two configurations of one kind (two OpenAI-compatible endpoints) are told apart.
            label = f"{attempt.config} · {attempt.kind}" if attempt.config else attempt.kind
            kinds.setdefault(label, []).append(attempt)
        result.append(StageAttempts(stage=stage, label=str(STAGE_LABELS.get(stage, stage)), kinds=tuple(
            KindAttempts(
                kind=kind, ok=sum(a.ok for a in tried), failed=sum(not a.ok for a in tried),
                errors=tuple(dict.fromkeys(a.error for a in tried if not a.ok)),
                lost_ms=sum(a.ms for a in tried if not a.ok), served_ms=sum(a.ms for a in tried if a.ok),
            ) for kind, tried in kinds.items()
        )))
    return result


def served_providers(providers: object) -> list[tuple[str, str]]:
    if not isinstance(providers, dict):
        return []
    return [(str(STAGE_LABELS.get(str(stage), stage)), str(kind)) for stage, kind in providers.items() if kind]


def tool_call_view(call: dict[str, Any]) -> ToolCallView:
    duration = call.get("duration_ms")
    error = str(call.get("error") or "")
    return ToolCallView(
        name=str(call.get("name") or call.get("llm_name") or "?"),
        source=str(TOOL_SOURCES.get(str(call.get("source")), call.get("source") or "")),
        success=call.get("success") is True,
        duration_ms=float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) else None,
        error=str(TOOL_ERRORS.get(error, error)),
        arguments=_shown(pretty_json(call.get("arguments", {}))),
        result=_shown(pretty_json(call.get("result", ""))),
    )


def pretty_json(value: object) -> str:
    """Indented JSON; a string holding JSON (tool results usually do) is unpacked first."""
    if isinstance(value, str):
        raw = value
        text = raw.strip()
        if text[:1] not in ("{", "["):
            return raw
        try:
            value = json.loads(text)
        except ValueError:
            return raw
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _shown(text: str) -> str:
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return text[:MAX_SHOWN_CHARS] + "\n… " + str(_("(cut here; the export has all of it)"))


# --- export -----------------------------------------------------------------------------------


def conversation_export(conversation: Conversation, audio_url: Callable[[int, str], str]) -> dict[str, Any]:
    """One conversation as plain JSON: transcripts, timings, tool calls, provider attempts,
    and links to the (staff-only) audio view. No secrets are stored on these rows."""
    device = conversation.device
    return {
        "conversation": {
            "id": conversation.pk, "session_id": conversation.session_id, "source": conversation.source,
            "device": {"mac": device.mac, "name": device.name} if device else None,
            "persona": conversation.persona.name if conversation.persona else None,
            "started_at": conversation.started_at.isoformat(),
            "ended_at": conversation.ended_at.isoformat() if conversation.ended_at else None,
        },
        "turns": [_turn_export(turn, audio_url)
                  for turn in Turn.objects.filter(conversation=conversation).order_by("index").iterator()],
    }


def _turn_export(turn: Turn, audio_url: Callable[[int, str], str]) -> dict[str, Any]:
    return {
        "index": turn.index, "created_at": turn.created_at.isoformat(),
        "user_text": turn.user_text, "reply_text": turn.reply_text, "emotion": turn.emotion,
        "interrupted": turn.interrupted, "error": turn.error,
        "timings_ms": turn.timings, "providers": turn.providers, "provider_attempts": turn.provider_attempts,
        "tool_calls": turn.tool_calls,
        "audio": {
            track: ({"url": audio_url(turn.pk, track), "duration_ms": getattr(turn, f"{track}_audio_ms")}
                    if getattr(turn, f"{track}_audio").name else None)
            for track in ("user", "reply")
        },
    }
