"""Turn rows with chosen timings and times, for the dashboard's tests."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from conversations.models import Conversation, Persona, Turn
from devices.models import Device


def conversation(*, device: Device | None = None, persona: Persona | None = None,
                 source: str = Conversation.SOURCE_DEVICE) -> Conversation:
    return Conversation.objects.create(session_id=f"s-{Conversation.objects.count() + 1}", source=source,
                                       device=device, persona=persona)


def turn(conv: Conversation, *, at: datetime, timings: dict[str, float] | None = None,
         providers: dict[str, str] | None = None, error: str = "", interrupted: bool = False,
         tool_calls: list[dict[str, Any]] | None = None, reply_text: str = "ok", user_text: str = "hi") -> Turn:
    """A stored turn created at `at` (created_at is auto_now_add, so it is set afterwards)."""
    index = conv.turns.count()
    row = Turn.objects.create(
        conversation=conv, index=index, user_text=user_text, reply_text=reply_text, error=error,
        interrupted=interrupted, timings=timings if timings is not None else {"speech_end": 0.0},
        providers=providers if providers is not None else {"asr": "faster_whisper", "llm": "openai", "tts": "edge"},
        tool_calls=tool_calls or [],
    )
    Turn.objects.filter(pk=row.pk).update(created_at=at)
    row.created_at = at
    return row


def tool_call(name: str, *, success: bool = True, error: str = "") -> dict[str, Any]:
    return {"name": name, "llm_name": name.replace(".", "_"), "source": "server", "arguments": {},
            "result": "done" if success else "it broke", "success": success, "duration_ms": 3.0, "error": error}
