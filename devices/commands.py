"""Commands to a connected device from anywhere: admin actions, manage.py, Celery tasks.

A connected device's consumer listens on its own channel, whose name presence stores on the
Device row (`channel_name`); these services send it a small `device.command` event (never
audio; format in devices/protocol/commands.py) and, for tool calls, wait on a fresh reply
channel for the `device.mcp_result`. Addressing the channel rather than a group means
nothing is lost when Redis restarts (group memberships would be). With Redis as the channel
layer this works across processes; the in-memory layer only reaches sockets of the same
process. When the layer cannot take the event the caller gets a DeviceCommandError, never
a silent "sent".

Each service has a sync form (admin, manage.py) and an async twin prefixed with `a`.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer, get_channel_layer

from devices.models import Device
from devices.protocol.commands import command_event

logger = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT = 30.0
# The device has `timeout` to answer; the hop back through the layer gets this on top.
REPLY_MARGIN_SECONDS = 2.0

DeviceRef = Device | int


class DeviceCommandError(Exception):
    """A command could not be carried out; the text says why, for an operator."""


class DeviceOffline(DeviceCommandError):
    pass


class DeviceCommandTimeout(DeviceCommandError):
    pass


class DeviceToolError(DeviceCommandError):
    """The device answered the tool call with an error (its text, e.g. "Unknown tool: x")."""


def _pk(device: DeviceRef) -> int:
    return device if isinstance(device, int) else device.pk


def _layer() -> BaseChannelLayer:
    layer = get_channel_layer()
    if layer is None:
        raise DeviceCommandError("no channel layer is configured")
    return layer


def device_channel(*, device: DeviceRef) -> str | None:
    """The channel of the device's live socket; None when it is offline.

    Read fresh: the admin's instance may be minutes old.
    """
    online = Device.objects.filter(pk=_pk(device), is_online=True).exclude(channel_name="")
    return online.values_list("channel_name", flat=True).first()


async def _device_channel(device: DeviceRef) -> str | None:
    return await database_sync_to_async(device_channel, thread_sensitive=False)(device=device)


async def _send(layer: BaseChannelLayer, channel: str, event: dict[str, Any]) -> None:
    try:
        await layer.send(channel, event)
    except ChannelFull:
        raise DeviceCommandError("the device has too many commands waiting") from None
    except Exception as exc:  # the layer already retried (devices/layers.py)
        logger.warning("device command not sent: channel layer unavailable", extra={"error": repr(exc)})
        raise DeviceCommandError("the channel layer (Redis) is unavailable; the command was not sent") from exc


# -- fire and forget ----------------------------------------------------------------------


async def adevice_send_command(*, device: DeviceRef, command: str, **data: Any) -> bool:
    """Send `command` to the device's socket; False (nothing sent) if it is offline.

    Raises DeviceCommandError when the channel layer cannot take it.
    """
    channel = await _device_channel(device)
    if channel is None:
        return False
    await _send(_layer(), channel, command_event(command, **data))
    logger.info("device command sent", extra={"device_id": _pk(device), "command": command})
    return True


def device_send_command(*, device: DeviceRef, command: str, **data: Any) -> bool:
    return async_to_sync(adevice_send_command)(device=device, command=command, **data)


def device_reboot(*, device: DeviceRef) -> bool:
    return device_send_command(device=device, command="reboot")


def device_alert(*, device: DeviceRef, message: str, status: str = "Notice", emotion: str = "neutral") -> bool:
    return device_send_command(device=device, command="alert", status=status, message=message, emotion=emotion)


def device_custom(*, device: DeviceRef, payload: dict[str, Any]) -> bool:
    return device_send_command(device=device, command="custom", payload=payload)


def device_say(*, device: DeviceRef, text: str) -> bool:
    """Speak `text` through the device's TTS (interrupting whatever it is saying)."""
    return device_send_command(device=device, command="say", text=text)


# -- tool calls ---------------------------------------------------------------------------


async def adevice_mcp_call(
    *, device: DeviceRef, name: str, arguments: dict[str, Any] | None = None,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
) -> str:
    """Call one of the device's MCP tools and return its text result.

    Raises:
        DeviceOffline: the device is not connected (or dropped during the call).
        DeviceCommandTimeout: no answer within `timeout` (+ a small margin).
        DeviceToolError: the device answered with an error.
    """
    channel = await _device_channel(device)
    if channel is None:
        raise DeviceOffline("the device is offline")
    layer = _layer()
    reply_channel = await layer.new_channel()
    await _send(layer, channel, command_event(
        "mcp_call", name=name, arguments=arguments or {}, timeout=timeout, reply_channel=reply_channel,
    ))
    try:
        async with asyncio.timeout(timeout + REPLY_MARGIN_SECONDS):
            reply = await layer.receive(reply_channel)
    except TimeoutError:
        raise DeviceCommandTimeout(f"the device did not answer within {timeout:g} seconds") from None
    return _result(reply)


def device_mcp_call(
    *, device: DeviceRef, name: str, arguments: dict[str, Any] | None = None,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
) -> str:
    return async_to_sync(adevice_mcp_call)(device=device, name=name, arguments=arguments, timeout=timeout)


def _result(reply: dict[str, Any]) -> str:
    if reply.get("ok") is True:
        return str(reply.get("result", ""))
    error = str(reply.get("error") or "the device tool failed")
    if reply.get("offline"):
        raise DeviceOffline(error)
    raise DeviceToolError(error)
