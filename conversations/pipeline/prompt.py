"""The system prompt of a voice turn, rendered from the persona's template.

Placeholders (the Persona admin documents them): {persona_name} {current_time}
{device_name} {location} {language}. Rendering is plain substitution, not `str.format`, so
a prompt containing other braces (JSON examples, "{like this}") never breaks a turn.
"""
from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from conversations.pipeline.config import DeviceInfo, PersonaConfig
from tools.builtin import SUPPORTED_LANGUAGES, SessionToolState

_WEEKDAY_TIME = "%A %Y-%m-%d %H:%M"


def language_name(code: str) -> str:
    base = (code or "").replace("_", "-").split("-")[0].lower()
    return SUPPORTED_LANGUAGES.get(base, code or "English")


def local_time(timezone: str, now: dt.datetime | None = None) -> str:
    try:
        zone = ZoneInfo(timezone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo("UTC")
    moment = (now or dt.datetime.now(dt.UTC)).astimezone(zone)
    return f"{moment.strftime(_WEEKDAY_TIME)} ({zone.key})"


def render_system_prompt(
    persona: PersonaConfig,
    device: DeviceInfo,
    state: SessionToolState | None = None,
    now: dt.datetime | None = None,
    language: str | None = None,
) -> str:
    """The persona's prompt with the session's facts filled in.

    `language` is the reply language when a tool changed it (else the persona's); `state`
    carries the active role-play character.
    """
    language = language or persona.language
    values = {
        "persona_name": persona.name,
        "current_time": local_time(device.timezone, now),
        "device_name": device.name or device.mac,
        "location": device.location or "unknown",
        "language": language_name(language),
    }
    text = persona.system_prompt
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text + _roleplay_note(state)


def _roleplay_note(state: SessionToolState | None) -> str:
    if state is None or not state.roleplay:
        return ""
    character = next((c for c in state.characters if c.get("name") == state.roleplay), None)
    description = (character or {}).get("description", "")
    note = f"\n\nYou are now role-playing {state.roleplay}. Stay in character."
    return note + (f" Character: {description}" if description else "")
