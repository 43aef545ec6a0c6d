"""The channel-layer format between the rest of the server and a connected device's consumer.

A device's consumer listens on its own channel; the live one's name is stored on the Device
row (`Device.channel_name`, written when the socket connects), so senders address it
directly: no group membership to lose when Redis restarts. Two event types travel there:

`device.command` — from services in devices/commands.py (admin, manage.py, Celery):

| command  | fields                                   | effect on the device                |
|----------|------------------------------------------|-------------------------------------|
| reboot   | —                                        | `{"type":"system","command":"reboot"}` |
| alert    | status, message, emotion (strings)       | alert UI + sound                    |
| custom   | payload (object)                         | shown if built with custom messages |
| say      | text                                     | spoken through TTS (interrupts a reply) |
| mcp_call | name, arguments, timeout, reply_channel  | tools/call; `device.mcp_result` back |

`device.replaced` — from the consumer of a newer connection of the same device, in any
process: `{"type": "device.replaced", "session_id": <new session>}`; the old socket closes
with CloseCode.REPLACED.

Pure: no Django, so the session (conversations/pipeline/) and the services share it.
"""
from __future__ import annotations

import math
from typing import Any

from devices.protocol.messages import Alert, Custom, Message, System

COMMAND_EVENT = "device.command"
REPLACED_EVENT = "device.replaced"
MCP_RESULT_TYPE = "device.mcp_result"
MIN_CALL_TIMEOUT = 0.1
MAX_CALL_TIMEOUT = 300.0
DEFAULT_CALL_TIMEOUT = 30.0


class BadCommand(ValueError):
    """A command event with missing or mistyped fields (a caller bug, logged and dropped)."""


def command_event(command: str, **data: Any) -> dict[str, Any]:
    """The event a service sends for `command` (fields as in the table above)."""
    return {**data, "type": COMMAND_EVENT, "command": command}


def replaced_event(session_id: str) -> dict[str, Any]:
    return {"type": REPLACED_EVENT, "session_id": session_id}


def command_name(event: dict[str, Any]) -> str:
    """The command of an event; a bare `device.<command>` type is read as that command."""
    name = event.get("command")
    if isinstance(name, str) and name:
        return name
    kind = event.get("type")
    return kind.removeprefix("device.") if isinstance(kind, str) else ""


def command_message(command: str, event: dict[str, Any]) -> Message:
    """The protocol message for reboot / alert / custom; BadCommand if fields are wrong."""
    if command == "reboot":
        return System(command="reboot")
    if command == "alert":
        # The firmware ignores an alert unless all three are strings (reference §2.3).
        return Alert(
            status=_text(event, "status", "Notice"),
            message=_text(event, "message", ""),
            emotion=_text(event, "emotion", "neutral"),
        )
    if command == "custom":
        payload = event.get("payload")
        if not isinstance(payload, dict):
            raise BadCommand("custom payload must be an object")
        return Custom(payload=payload)
    raise BadCommand("not a message command")


def say_text(event: dict[str, Any]) -> str:
    text = event.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadCommand("say needs a non-empty text")
    return text.strip()


def call_request(event: dict[str, Any]) -> tuple[str, dict[str, Any], float]:
    """(tool name, arguments, timeout) of an mcp_call event; BadCommand if unusable."""
    name = event.get("name")
    if not isinstance(name, str) or not name:
        raise BadCommand("the tool name is missing")
    arguments = event.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise BadCommand("the tool arguments must be a JSON object")
    return name, arguments, call_timeout(event.get("timeout"))


def call_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return DEFAULT_CALL_TIMEOUT
    return min(MAX_CALL_TIMEOUT, max(MIN_CALL_TIMEOUT, float(value)))


def mcp_result(*, result: str | None = None, error: str | None = None, offline: bool = False) -> dict[str, Any]:
    """The event sent back to the caller's reply channel.

    `offline` marks errors that mean "no device to ask" (not connected, disconnected
    mid-call), so the caller can say so instead of blaming the tool.
    """
    if error is not None:
        reply: dict[str, Any] = {"type": MCP_RESULT_TYPE, "ok": False, "error": error}
        if offline:
            reply["offline"] = True
        return reply
    return {"type": MCP_RESULT_TYPE, "ok": True, "result": result or ""}


def _text(event: dict[str, Any], key: str, default: str) -> str:
    value = event.get(key)
    if value is None:
        return default
    return value if isinstance(value, str) else str(value)
