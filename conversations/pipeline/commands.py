"""Channel-layer commands for a connected device, as the session sees them.

The event format (names, fields, the `device.mcp_result` reply) lives in
devices/protocol/commands.py, its one home; it is re-exported here for the session. What
stays here is what the session says itself.
"""
from __future__ import annotations

from conversations.pipeline import phrases
from devices.protocol.commands import (  # noqa: F401  (re-exported for the session)
    BadCommand,
    call_request,
    command_message,
    command_name,
    mcp_result,
    say_text,
)


def activation_text(code: str | None, language: str = "en") -> str:
    """What an unbound device says, in `language`; digits spaced so TTS reads them one by one."""
    return phrases.activation_prompt(code, language)
