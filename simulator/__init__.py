"""A simulated Xiaozhi ESP32 device that behaves like firmware 2.4.2 on the wire.

A client of the server, not part of it: `SimulatedDevice` (device.py) speaks OTA
(ota.py), activation and the WebSocket voice protocol (transport.py, speaker.py);
`DeviceMcpServer` (mcp_server.py) is the device-side MCP server with the firmware's tools
(firmware_tools.py, built from mcp_tools.py); speech.py says text with espeak-ng; cli.py
drives one voice turn for `manage.py simulate_device`. Pure asyncio, no Django; it imports
only the wire codecs of `devices.protocol`.
"""
from __future__ import annotations

from simulator.device import SimulatedDevice
from simulator.events import DeviceError, DeviceTimeout, Event
from simulator.mcp_server import DeviceMcpServer, ImageResult, Property, Tool, ToolFailure
from simulator.speaker import DownlinkFrame

__all__ = [
    "DeviceError", "DeviceMcpServer", "DeviceTimeout", "DownlinkFrame", "Event", "ImageResult",
    "Property", "SimulatedDevice", "Tool", "ToolFailure",
]
