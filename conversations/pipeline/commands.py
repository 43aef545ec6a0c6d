"""Channel-layer commands for a connected device, as the session sees them.

The event format (names, fields, the `device.mcp_result` reply) lives in
devices/protocol/commands.py, its one home; it is re-exported here for the session. What
stays here is what the session says itself.
"""
from __future__ import annotations

from devices.protocol.commands import (  # noqa: F401  (re-exported for the session)
    BadCommand,
    call_request,
    command_message,
    command_name,
    mcp_result,
    say_text,
)


def activation_text(code: str | None) -> str:
    """What an unbound device says; digits spaced so TTS reads them one by one."""
    if not code:
        return "This device is not bound yet. Please bind it in the admin."
    return f"Please bind this device in the admin with code {' '.join(code)}."
