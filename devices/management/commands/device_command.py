"""`manage.py device_command <mac> reboot|alert|custom|say|mcp ...`: talk to a connected device.

Examples:
    manage.py device_command aa:bb:cc:dd:ee:ff reboot
    manage.py device_command aa:bb:cc:dd:ee:ff alert "Battery low" --status Warning --emotion sad
    manage.py device_command aa:bb:cc:dd:ee:ff custom '{"page": "clock"}'
    manage.py device_command aa:bb:cc:dd:ee:ff say "Dinner is ready"
    manage.py device_command aa:bb:cc:dd:ee:ff mcp self.get_device_status
    manage.py device_command aa:bb:cc:dd:ee:ff mcp self.audio_speaker.set_volume '{"volume": 40}'

This runs in its own process, so it reaches the device only through a shared channel layer
(REDIS_URL); with the in-memory layer it can only report that the device looks offline.
"""
from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _

from devices.auth import normalize_mac
from devices.commands import (
    DEFAULT_TOOL_TIMEOUT,
    DeviceCommandError,
    device_alert,
    device_custom,
    device_mcp_call,
    device_reboot,
    device_say,
)
from devices.models import Device


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CommandError(_("not valid JSON: %(error)s") % {"error": exc}) from None
    if not isinstance(value, dict):
        raise CommandError(_("expected a JSON object"))
    return value


class Command(BaseCommand):
    help = "Send reboot, alert, custom, say or an MCP tool call to a connected device."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("mac", help="device MAC, e.g. aa:bb:cc:dd:ee:ff")
        commands = parser.add_subparsers(dest="command", required=True)
        commands.add_parser("reboot", help="reboot the device")
        alert = commands.add_parser("alert", help="show an alert")
        alert.add_argument("message")
        alert.add_argument("--status", default="Notice")
        alert.add_argument("--emotion", default="neutral")
        custom = commands.add_parser("custom", help="send a custom JSON payload")
        custom.add_argument("payload", help="a JSON object")
        say = commands.add_parser("say", help="speak a text through TTS")
        say.add_argument("text")
        self._add_mcp(commands)

    def _add_mcp(self, commands: Any) -> None:
        mcp: ArgumentParser = commands.add_parser("mcp", help="call a device MCP tool, print its result")
        mcp.add_argument("tool", help="tool name, e.g. self.get_device_status")
        mcp.add_argument("arguments", nargs="?", default="{}", help="a JSON object")
        mcp.add_argument("--timeout", type=float, default=DEFAULT_TOOL_TIMEOUT)

    def handle(self, *args: Any, **options: Any) -> None:
        device = self._device(options["mac"])
        if isinstance(get_channel_layer(), InMemoryChannelLayer):
            self.stderr.write(_("warning: in-memory channel layer; set REDIS_URL to reach the web process"))
        try:
            self._run(device, options)
        except DeviceCommandError as exc:
            raise CommandError(str(exc)) from None

    def _device(self, raw_mac: str) -> Device:
        mac = normalize_mac(raw_mac)
        if mac is None:
            raise CommandError(_("not a MAC address: %(mac)s") % {"mac": raw_mac})
        device = Device.objects.filter(mac=mac).first()
        if device is None:
            raise CommandError(_("no device with MAC %(mac)s") % {"mac": mac})
        return device

    def _run(self, device: Device, options: dict[str, Any]) -> None:
        command = options["command"]
        if command == "mcp":
            arguments = _json_object(options["arguments"])
            result = device_mcp_call(device=device, name=options["tool"], arguments=arguments,
                                     timeout=options["timeout"])
            self.stdout.write(result)
            return
        sent = self._send(device, command, options)
        if not sent:
            raise CommandError(_("device %(mac)s is offline") % {"mac": device.mac})
        self.stdout.write(_("%(command)s sent to %(mac)s") % {"command": command, "mac": device.mac})

    def _send(self, device: Device, command: str, options: dict[str, Any]) -> bool:
        if command == "reboot":
            return device_reboot(device=device)
        if command == "alert":
            return device_alert(device=device, message=options["message"], status=options["status"],
                                emotion=options["emotion"])
        if command == "custom":
            return device_custom(device=device, payload=_json_object(options["payload"]))
        return device_say(device=device, text=options["text"])
