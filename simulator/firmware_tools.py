"""The firmware's built-in device tools for the simulator's MCP server.

AddCommonTools (AI-visible, listed first), the bread-compact-wifi lamp (board tools, after
them) and AddUserOnlyTools (annotated audience=user) of xiaozhi-esp32 2.4.2, with the same
names, descriptions and argument schemas, backed by a small mutable state so a test can see
`set_volume` reflected in `get_device_status`.
"""
from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from simulator.mcp_tools import Property, Tool, ToolFailure, ToolHandler, compact_json


class Board(Protocol):
    """What the tools read and write on the device (DeviceMcpServer has all of it)."""

    state: dict[str, Any]
    camera_jpeg: bytes
    on_reboot: Callable[[], object] | None  # its result is ignored
    device_id: str
    client_id: str
    system_info_json: str
    vision_url: str
    vision_token: str

    def add_tool(self, tool: Tool) -> Tool: ...


def install(server: Board) -> None:
    """Give `server` the firmware's tools, state and camera picture."""
    server.state.update(DEFAULT_STATE)
    server.camera_jpeg = server.camera_jpeg or base64.b64decode(TINY_JPEG_B64)
    for tool in _tools(server):
        server.add_tool(tool)


DEFAULT_STATE: dict[str, Any] = {
    "volume": 70, "brightness": 75, "theme": "light", "lamp": False,
    "battery_level": 86, "charging": False, "ssid": "MyWiFi", "signal": "strong",
}
# A 16×16 grey JPEG (PyAV mjpeg), small enough to keep in source; the camera "captures" it.
TINY_JPEG_B64 = (
    "/9j//gAQTGF2YzYyLjI4LjEwMgD/2wBDAAgEBAQEBAUFBQUFBQYGBgYGBgYGBgYGBgYHBwcICAgHBwcGBgcHCAgI"
    "CAkJCQgICAgJCQoKCgwMCwsODg4RERT/xABLAAEAAAAAAAAAAAAAAAAAAAAAAQEAAAAAAAAAAAAAAAAAAAABEAEA"
    "AAAAAAAAAAAAAAAAAAAAEQEBAAAAAAAAAAAAAAAAAAAAIf/AABEIABAAEAMBIgACEQADEQD/2gAMAwEAAhEDEQA/"
    "AAAor//Z"
)
CAMERA_BOUNDARY = "----ESP32_CAMERA_BOUNDARY"
_STATUS_DESCRIPTION = (
    "Provides the real-time information of the device, including the current status of the "
    "audio speaker, screen, battery, network, etc.\nUse this tool for: \n1. Answering "
    "questions about current condition (e.g. what is the current volume of the audio "
    "speaker?)\n2. As the first step to control the device (e.g. turn up / down the volume "
    "of the audio speaker, etc.)"
)
_PHOTO_DESCRIPTION = (
    "Take a photo and explain it. Use this tool after the user asks you to see something.\n"
    "Args:\n  `question`: The question that you want to ask about the photo.\nReturn:\n"
    "  A JSON object that provides the photo information."
)


def _tools(server: Board) -> list[Tool]:
    """AddCommonTools, the bread-compact-wifi lamp (board tools) and AddUserOnlyTools."""
    state = server.state
    return [
        Tool("self.get_device_status", _STATUS_DESCRIPTION, (),
             lambda _a: _device_status(state)),
        Tool("self.audio_speaker.set_volume",
             "Set the volume of the audio speaker. If the current volume is unknown, you must "
             "call `self.get_device_status` tool first and then call this tool.",
             (Property("volume", "integer", minimum=0, maximum=100),),
             lambda a: _set(state, "volume", a["volume"])),
        Tool("self.screen.set_brightness", "Set the brightness of the screen.",
             (Property("brightness", "integer", minimum=0, maximum=100),),
             lambda a: _set(state, "brightness", a["brightness"])),
        Tool("self.screen.set_theme",
             "Set the theme of the screen. The theme can be `light` or `dark`.",
             (Property("theme", "string"),),
             lambda a: a["theme"] in ("light", "dark") and _set(state, "theme", a["theme"])),
        Tool("self.camera.take_photo", _PHOTO_DESCRIPTION, (Property("question", "string"),),
             lambda a: _explain_photo(server, a["question"])),
        Tool("self.lamp.get_state", "Get the power state of the lamp", (),
             lambda _a: compact_json({"power": state["lamp"]})),
        Tool("self.lamp.turn_on", "Turn on the lamp", (), lambda _a: _set(state, "lamp", True)),
        Tool("self.lamp.turn_off", "Turn off the lamp", (),
             lambda _a: _set(state, "lamp", False)),
        *_user_only_tools(server),
    ]


def _user_only_tools(server: Board) -> list[Tool]:
    url = (Property("url", "string"),)
    return [
        Tool("self.get_system_info", "Get the system information", (),
             lambda _a: server.system_info_json, user_only=True),
        Tool("self.reboot", "Reboot the system", (), lambda _a: _reboot(server), user_only=True),
        Tool("self.upgrade_firmware",
             "Upgrade firmware from a specific URL. This will download and install the "
             "firmware, then reboot the device.", url, user_only=True),
        Tool("self.screen.get_info",
             "Information about the screen, including width, height, etc.", (),
             lambda _a: {"width": 240, "height": 240, "monochrome": False}, user_only=True),
        Tool("self.screen.snapshot", "Snapshot the screen and upload it to a specific URL",
             (Property("url", "string"),
              Property("quality", "integer", default=80, minimum=1, maximum=100)),
             user_only=True),
        Tool("self.screen.preview_image", "Preview an image on the screen", url, user_only=True),
        Tool("self.assets.set_download_url", "Set the download url for the assets", url,
             user_only=True),
    ]


def extra_tools(count: int, description_bytes: int, start: int) -> list[Tool]:
    """Board-style tools whose long descriptions push tools/list over several 8000-byte pages."""
    filler = "This extra simulator tool exists to exercise tools/list pagination. "
    tools = []
    for index in range(start, start + count):
        text = f"Extra tool number {index}. " + filler * (description_bytes // len(filler) + 1)
        tools.append(Tool(
            f"self.extra.tool_{index}", text[:description_bytes],
            (Property("value", "integer", default=0, minimum=0, maximum=1000),
             Property("label", "string", default=""), Property("enabled", "boolean", default=True)),
            _echo_value(index),
        ))
    return tools


def _echo_value(index: int) -> ToolHandler:
    return lambda arguments: {"tool": index, "value": arguments["value"]}


def _set(state: dict[str, Any], key: str, value: Any) -> bool:
    state[key] = value
    return True


def _device_status(state: dict[str, Any]) -> str:
    """WifiBoard::GetDeviceStatusJson as a JSON *string* (so it arrives double-encoded)."""
    return compact_json({
        "audio_speaker": {"volume": state["volume"]},
        "screen": {"brightness": state["brightness"], "theme": state["theme"]},
        "battery": {"level": state["battery_level"], "charging": state["charging"]},
        "network": {"type": "wifi", "ssid": state["ssid"], "signal": state["signal"]},
        "chip": {"temperature": 42},
    })


def _reboot(server: Board) -> bool:
    # The firmware schedules the reboot 1 s later and replies `true` first.
    if server.on_reboot is not None:
        server.on_reboot()
    return True


async def _explain_photo(server: Board, question: str) -> str:
    """Esp32Camera::Explain: multipart POST to the vision URL; the whole body is the result."""
    if not server.vision_url:
        raise ToolFailure("Image explain URL or token is not set")
    import aiohttp  # noqa: PLC0415 - only the camera tool needs an HTTP client

    headers = {"Device-Id": server.device_id, "Client-Id": server.client_id,
               "Content-Type": f"multipart/form-data; boundary={CAMERA_BOUNDARY}"}
    if server.vision_token:
        headers["Authorization"] = f"Bearer {server.vision_token}"
    try:
        async with aiohttp.ClientSession() as session, session.post(
            server.vision_url, data=_multipart_chunks(question, server.camera_jpeg),
            headers=headers, timeout=aiohttp.ClientTimeout(total=30),
        ) as response:
            body = await response.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ToolFailure("Failed to upload photo") from exc
    if response.status != 200:
        raise ToolFailure("Failed to upload photo")
    return body


async def _multipart_chunks(question: str, jpeg: bytes) -> AsyncIterator[bytes]:
    """Yield the body in parts; an async generator makes aiohttp use chunked encoding."""
    yield (f"--{CAMERA_BOUNDARY}\r\nContent-Disposition: form-data; name=\"question\"\r\n\r\n"
           f"{question}\r\n").encode()
    yield (f"--{CAMERA_BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; "
           'filename="camera.jpg"\r\nContent-Type: image/jpeg\r\n\r\n').encode()
    yield jpeg
    yield f"\r\n--{CAMERA_BOUNDARY}--\r\n".encode()
