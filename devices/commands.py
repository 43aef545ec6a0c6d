"""Commands to a connected device from anywhere: admin actions, manage.py, Celery tasks.

Every connected device's consumer is in the channel-layer group `device.<pk>`; these
services send it a small `device.command` event (never audio) and, for tool calls, wait on
a fresh reply channel for the `device.mcp_result`. With Redis as the channel layer this
works across processes; the in-memory layer only reaches sockets of the same process.

Each service has a sync form (admin, manage.py) and an async twin prefixed with `a`.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer

from devices.models import Device, device_group_name

logger = logging.getLogger(__name__)

COMMAND_EVENT = "device.command"
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


def device_is_online(*, device: DeviceRef) -> bool:
    # Read fresh: the admin's instance may be minutes old.
    return Device.objects.filter(pk=_pk(device), is_online=True).exists()


# -- fire and forget ----------------------------------------------------------------------


async def adevice_send_command(*, device: DeviceRef, command: str, **data: Any) -> bool:
    """Send `command` to the device's sockets; False (nothing sent) if it is offline."""
    if not await database_sync_to_async(device_is_online, thread_sensitive=False)(device=device):
        return False
    event = {**data, "type": COMMAND_EVENT, "command": command}
    await _layer().group_send(device_group_name(_pk(device)), event)
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
    if not await database_sync_to_async(device_is_online, thread_sensitive=False)(device=device):
        raise DeviceOffline("the device is offline")
    layer = _layer()
    reply_channel = await layer.new_channel()
    await layer.group_send(device_group_name(_pk(device)), {
        "type": COMMAND_EVENT, "command": "mcp_call", "name": name, "arguments": arguments or {},
        "timeout": timeout, "reply_channel": reply_channel,
    })
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
