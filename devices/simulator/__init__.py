"""A simulated Xiaozhi ESP32 device that behaves like firmware 2.4.2 on the wire.

`SimulatedDevice` (device.py) speaks OTA, activation and the WebSocket voice protocol;
`DeviceMcpServer` (mcp_server.py) is the device-side MCP server; cli.py drives one voice
turn for `manage.py simulate_device`. Pure asyncio, no Django.
"""
from __future__ import annotations

from devices.simulator.device import SimulatedDevice
from devices.simulator.events import DeviceError, DeviceTimeout, Event
from devices.simulator.mcp_server import DeviceMcpServer, ImageResult, Property, Tool, ToolFailure
from devices.simulator.speaker import DownlinkFrame

__all__ = [
    "DeviceError", "DeviceMcpServer", "DeviceTimeout", "DownlinkFrame", "Event", "ImageResult",
    "Property", "SimulatedDevice", "Tool", "ToolFailure",
]
